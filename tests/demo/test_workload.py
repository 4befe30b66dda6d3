"""The simulated workload: its pure decisions, and one real process against a real broker."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from hami_trio.broker.server import BrokerConfig, serve_broker
from hami_trio.demo.sandbox import NOBODY, SANDBOX_CACHE_DIR
from hami_trio.demo.scenario import (
    Behaviour,
    MemoryPlan,
    WorkloadSpec,
    hami_core_env,
)
from hami_trio.demo.workload import HamiCoreSettings, Tracker, WorkloadPlan
from hami_trio.errors import ConfigError
from hami_trio.monitor.layout import LAYOUTS, Format
from hami_trio.monitor.region import read_region_file
from tests.sandbox import world_readable_dir

STEP = 0.05


def test_tracker_launches_counts_blocked_time_and_splits_windows() -> None:
    tracker = Tracker(step=STEP)
    assert tracker.decide(0.0, busy=False, recent_kernel=0) == "idle"
    assert tracker.decide(1.0, busy=True, recent_kernel=0) == "running"
    assert tracker.decide(1.05, busy=True, recent_kernel=2) == "running"
    # The monitor blocks: no launch, the episode opens once and grows.
    assert tracker.decide(1.1, busy=True, recent_kernel=-1) == "blocked"
    assert tracker.decide(1.5, busy=True, recent_kernel=-1) == "blocked"
    assert tracker.blocked_since == 1.1
    assert tracker.blocked_for(1.6) == pytest.approx(0.5)
    assert tracker.decide(2.0, busy=True, recent_kernel=0) == "running"
    assert tracker.blocked_since is None
    assert tracker.launches == 3
    assert tracker.blocked_seconds == pytest.approx(0.9)
    assert tracker.episodes == [[1.1, 2.0]]
    # A gap longer than a few steps starts a new launch window.
    assert tracker.windows == [[1.0, 1.05], [2.0, 2.0]]
    assert tracker.decide(2.05, busy=True, recent_kernel=2) == "running"
    assert tracker.windows[-1] == [2.0, 2.05]


def test_tracker_closes_an_episode_when_demand_ends_or_the_run_stops() -> None:
    tracker = Tracker(step=STEP)
    tracker.decide(0.0, busy=True, recent_kernel=-1)
    assert tracker.decide(1.0, busy=False, recent_kernel=-1) == "idle"
    assert tracker.episodes == [[0.0, 1.0]]
    tracker.decide(2.0, busy=True, recent_kernel=-1)
    tracker.finish(2.5)
    assert tracker.episodes == [[0.0, 1.0], [2.0, 2.5]]
    assert tracker.blocked_seconds == pytest.approx(1.5)
    assert tracker.launches == 0


def test_settings_default_priority_and_errors() -> None:
    env = {
        "CUDA_DEVICE_MEMORY_LIMIT": "2g",
        "NVIDIA_VISIBLE_DEVICES": "GPU-1",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/a.cache",
    }
    settings = HamiCoreSettings.from_env(env)
    assert settings.priority == 1  # HAMi-core's default
    assert settings.broker_enabled is False
    with pytest.raises(ConfigError, match="CUDA_TASK_PRIORITY: 'high'"):
        HamiCoreSettings.from_env(env | {"CUDA_TASK_PRIORITY": "high"})
    with pytest.raises(ConfigError, match="NVIDIA_VISIBLE_DEVICES is not set"):
        HamiCoreSettings.from_env({k: v for k, v in env.items() if k != "NVIDIA_VISIBLE_DEVICES"})


def test_plan_json_round_trip_and_errors() -> None:
    plan = WorkloadPlan(
        "x", Behaviour(((0.0, 1.0),), 50, MemoryPlan(1, 2, 3, 4)), 6.0, 0.05, 0.2, "/b", "/c"
    )
    assert WorkloadPlan.from_json(plan.to_json()) == plan
    with pytest.raises(ConfigError, match="workload plan"):
        WorkloadPlan.from_json('{"name": "x"}')
    with pytest.raises(ConfigError, match="workload plan"):
        WorkloadPlan.from_json("not json")


def test_usage_error_without_a_plan() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hami_trio.demo.workload"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "usage" in result.stderr


class _Reports:
    def __init__(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        self._stream = proc.stdout
        self._pending = b""
        self.seen: list[dict[str, Any]] = []

    async def next(self, kind: str, **where: object) -> dict[str, Any]:
        with trio.fail_after(15):
            while True:
                while b"\n" in self._pending:
                    line, _, self._pending = self._pending.partition(b"\n")
                    report = json.loads(line)
                    self.seen.append(report)
                    if report["type"] == "error":
                        raise AssertionError(report)
                    if report["type"] == kind and all(report.get(k) == v for k, v in where.items()):
                        return report  # type: ignore[no-any-return]
                chunk = await self._stream.receive_some()
                if not chunk:
                    raise AssertionError(f"workload exited before {kind} {where}: {self.seen}")
                self._pending += chunk


def _write_recent_kernel(path: Path, value: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, struct.pack("<i", value), LAYOUTS[Format.V1].recent_kernel)
    finally:
        os.close(fd)


def _slot0_pids(path: Path) -> tuple[int, int]:
    with open(path, "rb") as f:
        f.seek(LAYOUTS[Format.V1].procs)
        pid, host_pid = struct.unpack("<ii", f.read(8))
    return pid, host_pid


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _only_child(pid: int) -> int:
    (child,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(child)


@pytest.fixture
async def short_root() -> AsyncIterator[Path]:
    with world_readable_dir("ht-demo-") as root:  # short: the socket path has 107 bytes
        yield root


@pytest.mark.root
async def test_sandboxed_workload_gets_its_host_pid_and_honours_the_monitors_feedback(
    short_root: Path,
) -> None:
    broker_dir = short_root / "hostpid"
    container = short_root / "hook" / "containers" / "pod-1_training"
    container.mkdir(parents=True)
    os.chown(container, NOBODY, NOBODY)
    spec = WorkloadSpec(
        "training", "test", 1, "GPU-T", 1 << 30, 50,
        Behaviour(((0.0, 1.0),), 66, MemoryPlan(10, 20, 300, 300)),
    )  # fmt: skip
    plan = WorkloadPlan(
        "training",
        spec.behaviour,
        60.0,
        STEP,
        0.1,
        str(broker_dir),
        str(container),
        run_as=NOBODY,
        socket_path="/tmp/vgpulock/hostpid/b.sock",
    )
    env = {"PATH": os.environ["PATH"]} | hami_core_env(spec, SANDBOX_CACHE_DIR / "w.cache")
    async with trio.open_nursery() as nursery:
        broker = await nursery.start(serve_broker, BrokerConfig(socket_path=broker_dir / "b.sock"))
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "hami_trio.demo.workload", plan.to_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            reports = _Reports(proc)
            attached = await reports.next("attached")
            host_pid = _only_child(proc.pid)
            # PID 1 of its own namespace, as nobody; the broker saw through it.
            assert (attached["pid"], attached["uid"], attached["host_pid"]) == (1, NOBODY, host_pid)
            assert attached["reason"] is None
            assert broker.stats.counts["ok"] == 1
            cache = container / "w.cache"
            snapshot = read_region_file(cache)  # magic in place, loads as v1
            assert (snapshot.priority, snapshot.active_slots) == (1, 1)
            assert snapshot.devices[0].memory_limit == 1 << 30
            assert snapshot.devices[0].memory_total == 330
            assert _slot0_pids(cache) == (1, host_pid)

            assert proc.stdin is not None
            await proc.stdin.send_all(json.dumps({"start": time.monotonic()}).encode() + b"\n")
            await reports.next("status", state="running")
            assert read_region_file(cache).recent_kernel == 2
            # What the monitor writes to block it: the workload holds its launches ...
            with trio.fail_after(5):
                while not any(r.get("state") == "blocked" for r in reports.seen):
                    _write_recent_kernel(cache, -1)
                    with trio.move_on_after(0.2):
                        await reports.next("status", state="blocked")
            launches = reports.seen[-1]["launches"]
            await trio.sleep(0.3)
            assert read_region_file(cache).recent_kernel == -1  # nothing launched meanwhile
            # ... until it is unblocked.
            _write_recent_kernel(cache, 0)
            running = await reports.next("status", state="running")
            assert running["launches"] > launches
            await proc.stdin.aclose()
            final = await reports.next("final")
            assert await proc.wait() == 0
        finally:
            proc.kill()
            await proc.wait()
        broker.stop()
    assert final["launches"] > launches
    assert len(final["episodes"]) == 1
    start, end = final["episodes"][0]
    assert end - start >= 0.3
    assert final["blocked_seconds"] == pytest.approx(end - start)
    assert not _exists(f"/proc/{host_pid}")
