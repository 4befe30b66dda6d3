"""End to end: real ``.cache`` files -> the monitor's tick -> the collector -> HTTP ``/metrics``
-> prometheus-client's parser; plus the ``hami-trio monitor`` command serving it.

Expected values are computed here, independently of the monitor, from the fixture's process
slots (the live ones: index below ``proc_num`` and ``status != 0``).
"""

from __future__ import annotations

import json
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from hami_trio.goparse import BindAddress
from hami_trio.metrics.collector import BuildInfoCollector, VGpuCollector
from hami_trio.metrics.endpoint import HttpStats, serve_http
from hami_trio.metrics.hostgpu import HostGpuSampler
from hami_trio.monitor.loop import Monitor, MonitorConfig, serve_monitor
from hami_trio.pods.access import KubeAccess
from hami_trio.pods.source import PodSource, StaticPodSource
from hami_trio.pods.watch import KubernetesPodSource, serve_pod_watch
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)
from tests.metrics.fake_nvml import FakeGpu, FakeNvml
from tests.metrics.promtool import lint, require_promtool
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import FAST, write_kubeconfig

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
NOW = 1_800_000_000

# Slots: attached, exited (not summed), swapped (summed), and a stale one past proc_num.
SLOTS = (
    ProcSlot(
        pid=1,
        status=1,
        used=[MemoryUse(100, 20, 300, 0, 1000), MemoryUse(1, 2, 3, 0, 10)],
        util=[UtilUse(sm_util=30), UtilUse(sm_util=5)],
    ),
    ProcSlot(pid=2, status=0, used=[MemoryUse(999, 999, 999, 0, 99999)], util=[UtilUse(0, 0, 99)]),
    ProcSlot(pid=3, status=2, used=[MemoryUse(50, 5, 500, 0, 2000)], util=[UtilUse(0, 0, 20)]),
    ProcSlot(pid=4, status=1, used=[MemoryUse(7, 7, 7, 0, 7777)], util=[UtilUse(0, 0, 7)]),
)


def fixture_spec(**overrides: object) -> RegionSpec:
    fields: dict[str, object] = {
        "num": 2,
        "uuids": [GPU_A, GPU_B],
        "limits": [8 << 30, 4 << 30],
        "procs": SLOTS,
        "proc_num": 3,
        "last_kernel_time": NOW - 42,
    }
    fields.update(overrides)
    return RegionSpec(**fields)  # type: ignore[arg-type]


def expected_devices(spec: RegionSpec) -> list[dict[str, int]]:
    """Per-device sums the way HAMi defines them, from the spec alone."""
    live = [slot for slot in list(spec.procs)[: spec.proc_num] if slot.status != 0]
    devices = []
    for d in range(min(spec.num, 16)):

        def total(field: str, d: int = d) -> int:
            return sum(getattr(s.used[d], field) if d < len(s.used) else 0 for s in live)

        devices.append(
            {
                "limit": list(spec.limits)[d],
                "total": total("total"),
                "context": total("context_size"),
                "module": total("module_size"),
                "buffer": total("data_size"),
                "sm": sum(s.util[d].sm_util if d < len(s.util) else 0 for s in live),
            }
        )
    return devices


def add_container(hook: Path, uid: str, name: str, spec: RegionSpec) -> Path:
    directory = hook / "containers" / f"{uid}_{name}"
    directory.mkdir(parents=True, exist_ok=True)
    write_region(directory / "abc.cache", spec)
    return directory


def _get(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


async def get(port: int, path: str = "/metrics") -> tuple[int, str]:
    return await trio.to_thread.run_sync(_get, port, path)


def series(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    return {
        (s.name, frozenset(s.labels.items()), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def start_stack(
    nursery: trio.Nursery,
    hook: Path,
    pod_source: PodSource,
    *,
    kubernetes: bool,
    legacy: bool = False,
    interval: float = 60.0,
    all_pods: object = None,
    host: HostGpuSampler | None = None,
    **monitor_options: object,
) -> tuple[Monitor, int]:
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector())
    config = MonitorConfig(
        hook_path=hook,
        interval=interval,
        mig_lock_path=hook.parent / "mig" / "lock",
        **monitor_options,  # type: ignore[arg-type]
    )
    monitor: Monitor = await nursery.start(
        partial(serve_monitor, config, pod_source=pod_source, registry=registry)
    )
    registry.register(
        VGpuCollector(
            monitor,
            pod_source,
            node_name="node-a",
            kubernetes=kubernetes,
            all_pods=all_pods,  # type: ignore[arg-type]
            legacy=legacy,
            host=host,
            wall_clock=lambda: NOW,
            insights=True,
        )
    )
    bound: BindAddress = await nursery.start(
        partial(serve_http, BindAddress("127.0.0.1", 0), registry)
    )
    return monitor, bound.port


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    path = tmp_path / "hook"
    (path / "containers").mkdir(parents=True)
    return path


def container_series(
    namespace: str, pod: str, container: str, spec: RegionSpec, *, legacy: bool
) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    out: set[tuple[str, frozenset[tuple[str, str]], float]] = set()
    for index, (uuid, dev) in enumerate(zip([GPU_A, GPU_B], expected_devices(spec), strict=True)):
        new = {
            "namespace": namespace,
            "pod": pod,
            "container": container,
            "vdevice_index": str(index),
            "device_uuid": uuid,
            "zone": "vGPU",
        }
        values = {
            "hami_vgpu_memory_used_bytes": dev["total"],
            "hami_vgpu_memory_limit_bytes": dev["limit"],
            "hami_container_device_memory_bytes": dev["total"],
            "hami_container_device_utilization_ratio": dev["sm"],
            "hami_vgpu_memory_context_bytes": dev["context"],
            "hami_vgpu_memory_module_bytes": dev["module"],
            "hami_vgpu_memory_buffer_bytes": dev["buffer"],
            "hami_container_last_kernel_elapsed_seconds": 42,
        }
        out |= {(name, frozenset(new.items()), float(v)) for name, v in values.items()}
        if legacy:
            old = {
                "podnamespace": namespace,
                "podname": pod,
                "ctrname": container,
                "vdeviceid": str(index),
                "deviceuuid": uuid,
                "zone": "vGPU",
            }
            legacy_values = {
                "vGPU_device_memory_usage_in_bytes": dev["total"],
                "vGPU_device_memory_limit_in_bytes": dev["limit"],
                "Device_utilization_desc_of_container": dev["sm"],
                "Device_last_kernel_of_container": 42,
            }
            out |= {(name, frozenset(old.items()), float(v)) for name, v in legacy_values.items()}
            offset = (dev["total"] - dev["context"] - dev["module"] - dev["buffer"]) % (1 << 64)
            memory = old | {
                "context": str(dev["context"]),
                "module": str(dev["module"]),
                "data": str(dev["buffer"]),
                "offset": str(offset),
            }
            out.add(("Device_memory_desc_of_container", frozenset(memory.items()), dev["total"]))
    blocked = {"namespace": namespace, "pod": pod, "container": container}
    out.add(("hami_trio_container_blocked", frozenset(blocked.items()), 0.0))
    return out | insight_series(namespace, pod, container, spec)


def live_slots(spec: RegionSpec) -> list[ProcSlot]:
    return [slot for slot in list(spec.procs)[: spec.proc_num] if slot.status != 0]


def insight_series(
    namespace: str,
    pod: str,
    container: str,
    spec: RegionSpec,
    *,
    exited: frozenset[int] = frozenset(),
    blocked_seconds: float = 0.0,
    blocks: int = 0,
    utilization_switch: int | None = None,
) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    """The process, limit and feedback-state series of one container, from the spec alone
    (``exited``: the host PIDs the test made sure no longer exist)."""
    owner = {"namespace": namespace, "pod": pod, "container": container}
    live = live_slots(spec)
    states = {
        "unknown": sum(1 for s in live if s.hostpid == 0),
        "exited": sum(1 for s in live if s.hostpid in exited),
    }
    states["running"] = len(live) - states["unknown"] - states["exited"]
    switch = spec.utilization_switch if utilization_switch is None else utilization_switch
    out = {
        ("hami_trio_container_processes", frozenset((owner | {"state": k}).items()), float(v))
        for k, v in states.items()
    }
    out |= {
        ("hami_trio_container_priority", frozenset(owner.items()), float(spec.priority)),
        ("hami_trio_container_utilization_switch", frozenset(owner.items()), float(switch)),
        ("hami_trio_container_blocked_seconds_total", frozenset(owner.items()), blocked_seconds),
        ("hami_trio_container_blocks_total", frozenset(owner.items()), float(blocks)),
    }
    sm_limits = list(spec.sm_limits) + [0] * 16
    for index, uuid in enumerate(list(spec.uuids)[: spec.num]):
        device = frozenset(
            (owner | {"vdevice_index": str(index), "device_uuid": str(uuid)}).items()
        )
        using = sum(
            1
            for s in live
            if (index < len(s.used) and s.used[index].total)
            or (index < len(s.util) and s.util[index].sm_util)
        )
        out.add(("hami_trio_container_device_processes", device, float(using)))
        out.add(("hami_trio_container_core_limit_ratio", device, float(sm_limits[index])))
    return out


CONTAINER_FAMILIES = re.compile(r"^(hami_vgpu_|hami_container_|hami_trio_container_|vGPU_|Device_)")


@pytest.mark.parametrize("legacy", [False, True], ids=["new-names", "legacy"])
async def test_scrape_equals_fixture_aggregates(
    nursery: trio.Nursery, hook: Path, legacy: bool
) -> None:
    spec = fixture_spec()
    add_container(hook, "pod-uid-1", "main", spec)
    _, port = await start_stack(nursery, hook, StaticPodSource(), kubernetes=False, legacy=legacy)
    status, text = await get(port)
    assert status == 200
    got = {s for s in series(text) if CONTAINER_FAMILIES.match(s[0])}
    assert got == container_series("", "pod-uid-1", "main", spec, legacy=legacy)
    expected = expected_devices(spec)[0]
    assert (expected["total"], expected["sm"]) == (3000, 50)  # the fixture is what we think


@pytest.fixture
def host_pids() -> Iterator[tuple[int, int]]:
    """A live process's PID and the PID of one that exited (reaped: no such process)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        yield sleeper.pid, gone.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def process_spec(alive: int, exited: int) -> RegionSpec:
    slots = (
        ProcSlot(
            pid=1, hostpid=alive, used=[MemoryUse(10, 20, 970, 0, 1000)], util=[UtilUse(0, 0, 30)]
        ),
        ProcSlot(
            pid=2, hostpid=exited, used=[MemoryUse(5, 5, 4990, 0, 5000)], util=[UtilUse(0, 0, 50)]
        ),
        ProcSlot(pid=3, hostpid=0, used=[MemoryUse(0, 0, 7, 0, 7)], util=[UtilUse(0, 0, 1)]),
        ProcSlot(pid=4, hostpid=exited, status=0, used=[MemoryUse(0, 0, 9, 0, 9)]),
    )
    return fixture_spec(
        num=1, uuids=[GPU_A], limits=[8 << 30], sm_limits=[40], procs=slots, proc_num=4
    )


@pytest.mark.parametrize("exclude", [False, True], ids=["upstream-sums", "exclude-exited"])
async def test_process_states_of_real_processes_over_http(
    nursery: trio.Nursery, hook: Path, host_pids: tuple[int, int], exclude: bool
) -> None:
    alive, exited = host_pids
    spec = process_spec(alive, exited)
    add_container(hook, "pod-uid-1", "main", spec)
    _, port = await start_stack(
        nursery,
        hook,
        StaticPodSource(),
        kubernetes=False,
        host_pid_namespace=True,
        exclude_exited_processes=exclude,
    )
    _, text = await get(port)
    got = {s for s in series(text) if s[0].startswith("hami_trio_container_")}
    expected = insight_series("", "pod-uid-1", "main", spec, exited=frozenset({exited}))
    blocked = frozenset({"namespace": "", "pod": "pod-uid-1", "container": "main"}.items())
    assert got == expected | {("hami_trio_container_blocked", blocked, 0.0)}
    assert (
        "hami_trio_container_processes",
        frozenset(
            {"namespace": "", "pod": "pod-uid-1", "container": "main", "state": "exited"}.items()
        ),
        1.0,
    ) in got  # the fixture is what we think
    summed = [s for s in live_slots(spec) if not exclude or s.hostpid != exited]
    row = {
        n: v
        for n, labels, v in series(text)
        if dict(labels).get("vdevice_index") == "0" and dict(labels).get("zone")
    }
    assert row["hami_vgpu_memory_used_bytes"] == sum(s.used[0].total for s in summed)
    assert row["hami_container_device_utilization_ratio"] == sum(s.util[0].sm_util for s in summed)
    assert row["hami_vgpu_memory_buffer_bytes"] == sum(s.used[0].data_size for s in summed)
    assert row["hami_vgpu_memory_used_bytes"] == (1007 if exclude else 6007)
    assert ("hami_trio_monitor_process_liveness_checked", frozenset(), 1.0) in series(text)
    # The counters render in OpenMetrics too (their # TYPE line is named without _total).
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=accept)

    def fetch() -> str:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return str(reply.read().decode())

    body = await trio.to_thread.run_sync(fetch)
    families = {f.name: f for f in parse_openmetrics(body)}
    for name in ("hami_trio_container_blocked_seconds", "hami_trio_container_blocks"):
        assert families[name].type == "counter"
        assert [s.name for s in families[name].samples] == [f"{name}_total"]


async def test_without_the_host_pid_namespace_no_process_is_exited(
    nursery: trio.Nursery, hook: Path, host_pids: tuple[int, int]
) -> None:
    alive, exited = host_pids
    spec = process_spec(alive, exited)
    add_container(hook, "pod-uid-1", "main", spec)
    _, port = await start_stack(
        nursery,
        hook,
        StaticPodSource(),
        kubernetes=False,
        host_pid_namespace=False,
        exclude_exited_processes=True,  # has nothing to exclude
    )
    _, text = await get(port)
    got = {s for s in series(text) if s[0] == "hami_trio_container_processes"}
    states = {dict(labels)["state"]: v for _, labels, v in got}
    assert states == {"running": 2.0, "exited": 0.0, "unknown": 1.0}
    assert ("hami_trio_monitor_process_liveness_checked", frozenset(), 0.0) in series(text)
    used = [v for n, _, v in series(text) if n == "hami_vgpu_memory_used_bytes"]
    assert used == [6007.0]


async def test_blocking_counters_and_feedback_state_over_http(
    mock_clock: MockClock, nursery: trio.Nursery, hook: Path
) -> None:
    # The high-priority container is active on the GPU both share: the low one is blocked.
    hi = fixture_spec(priority=0, recent_kernel=2, sm_limits=[30, 60])
    lo = fixture_spec(priority=1, recent_kernel=2)
    add_container(hook, "pod-hi", "main", hi)
    add_container(hook, "pod-lo", "main", lo)
    registry = CollectorRegistry()
    source = StaticPodSource()
    monitor = Monitor(
        MonitorConfig(hook_path=hook, mig_lock_path=hook.parent / "mig" / "lock"),
        pod_source=source,
        registry=registry,
    )
    registry.register(
        VGpuCollector(
            monitor,
            source,
            node_name="n",
            kubernetes=False,
            insights=True,
            wall_clock=lambda: NOW,
        )
    )
    bound: BindAddress = await nursery.start(
        partial(serve_http, BindAddress("127.0.0.1", 0), registry)
    )

    def insight(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
        return {s for s in series(text) if s[0] in _INSIGHT}

    try:
        await monitor.tick()  # lo <- recent_kernel -1 and utilization_switch 1
        _, first = await get(bound.port)
        mock_clock.jump(5)
        await monitor.tick()  # hi's recent_kernel fell to 0: lo released
        mock_clock.jump(5)
        await monitor.tick()
        _, last = await get(bound.port)
    finally:
        monitor.close()
    assert insight(first) == insight_series("", "pod-hi", "main", hi) | insight_series(
        "", "pod-lo", "main", lo, blocks=1, utilization_switch=1
    )
    assert insight(last) == insight_series("", "pod-hi", "main", hi) | insight_series(
        "", "pod-lo", "main", lo, blocked_seconds=5.0, blocks=1
    )
    limits = {
        (dict(labels)["pod"], dict(labels)["vdevice_index"]): v
        for n, labels, v in series(last)
        if n == "hami_trio_container_core_limit_ratio"
    }
    assert limits == {
        ("pod-hi", "0"): 30,
        ("pod-hi", "1"): 60,
        ("pod-lo", "0"): 0,
        ("pod-lo", "1"): 0,
    }


@pytest.mark.parametrize("legacy", [False, True], ids=["new-names", "legacy"])
async def test_a_changed_value_is_never_served_from_the_kept_render(
    nursery: trio.Nursery, hook: Path, legacy: bool
) -> None:
    """The collector keeps each container's rendered lines while the monitor hands it the same
    snapshot: a slot whose memory changed, a scrape a second later and a renamed pod must
    each show up in the next scrape, in both text formats, and nothing else may change."""
    spec_a, spec_b = fixture_spec(), fixture_spec(priority=2)
    add_container(hook, "pod-a", "main", spec_a)
    add_container(hook, "pod-b", "main", spec_b)
    clock = [float(NOW)]
    source = StaticPodSource()
    registry = CollectorRegistry()
    monitor = Monitor(
        MonitorConfig(hook_path=hook, mig_lock_path=hook.parent / "mig" / "lock"),
        pod_source=source,
        registry=registry,
    )
    registry.register(
        VGpuCollector(
            monitor,
            source,
            node_name="n",
            kubernetes=False,
            legacy=legacy,
            insights=True,
            wall_clock=lambda: clock[0],
        )
    )
    bound: BindAddress = await nursery.start(
        partial(serve_http, BindAddress("127.0.0.1", 0), registry)
    )

    def expected(
        spec_a: RegionSpec, elapsed: int = 42
    ) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
        rows = container_series("", "pod-a", "main", spec_a, legacy=legacy)
        rows |= container_series("", "pod-b", "main", spec_b, legacy=legacy)
        kernel = {"hami_container_last_kernel_elapsed_seconds", "Device_last_kernel_of_container"}
        return {(n, labels, float(elapsed) if n in kernel else v) for n, labels, v in rows}

    async def scrape() -> set[tuple[str, frozenset[tuple[str, str]], float]]:
        status, text = await get(bound.port)
        assert status == 200
        om_text = await trio.to_thread.run_sync(_get_openmetrics, bound.port)
        om = {
            (s.name, frozenset(s.labels.items()), s.value)
            for family in parse_openmetrics(om_text)
            for s in family.samples
        }
        got = {s for s in series(text) if CONTAINER_FAMILIES.match(s[0])}
        # OpenMetrics names counters' samples the same way; its parser gives them as floats.
        assert {s for s in om if CONTAINER_FAMILIES.match(s[0])} == got
        return got

    try:
        await monitor.tick()
        assert await scrape() == expected(spec_a)
        assert await scrape() == expected(spec_a)  # served from the kept lines
        # One slot's memory changes in place (as HAMi-core writes it): a new snapshot.
        slot = SLOTS[0]
        changed = ProcSlot(
            pid=slot.pid,
            status=slot.status,
            used=[MemoryUse(100, 20, 300, 0, 1500), slot.used[1]],
            util=slot.util,
        )
        SimulatedWorkload(hook / "containers" / "pod-a_main" / "abc.cache").set_slot(0, changed)
        await monitor.tick()
        spec_changed = fixture_spec(procs=(changed, *SLOTS[1:]))
        assert expected_devices(spec_changed)[0]["total"] == 3500  # the change is what we think
        assert await scrape() == expected(spec_changed)
        # Nothing changes in the files, the clock moves on: only the elapsed seconds do.
        clock[0] += 5
        assert await scrape() == expected(spec_changed, elapsed=47)
    finally:
        monitor.close()


async def test_a_kept_body_never_outlives_the_tick_it_was_rendered_in(
    nursery: trio.Nursery, hook: Path
) -> None:
    """As the agent serves it (a body kept for the interval, dropped at the next tick), every
    scrape between two ticks gets the same bytes, and the first scrape after a tick that
    changed a file shows the change."""
    spec = fixture_spec()
    add_container(hook, "pod-a", "main", spec)
    source = StaticPodSource()
    registry = CollectorRegistry()
    monitor = Monitor(
        MonitorConfig(hook_path=hook, mig_lock_path=hook.parent / "mig" / "lock"),
        pod_source=source,
        registry=registry,
    )
    registry.register(
        VGpuCollector(
            monitor,
            source,
            node_name="n",
            kubernetes=False,
            insights=True,
            wall_clock=lambda: NOW,
        )
    )
    stats = HttpStats()
    bound: BindAddress = await nursery.start(
        partial(
            serve_http,
            BindAddress("127.0.0.1", 0),
            registry,
            freshness=3600.0,
            generation=lambda: monitor.ticks,
            stats=stats,
        )
    )

    def rows(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
        return {s for s in series(text) if CONTAINER_FAMILIES.match(s[0])}

    def expected(spec: RegionSpec) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
        kernel = "hami_container_last_kernel_elapsed_seconds"
        return {
            (n, labels, 42.0 if n == kernel else v)
            for n, labels, v in container_series("", "pod-a", "main", spec, legacy=False)
        }

    try:
        await monitor.tick()
        status, first = await get(bound.port)
        assert status == 200
        assert rows(first) == expected(spec)
        assert await get(bound.port) == (200, first)  # the same bytes, server counters too
        assert (stats.scrapes["rendered"], stats.scrapes["shared"]) == (1, 1)
        slot = SLOTS[0]
        changed = ProcSlot(
            pid=slot.pid,
            status=slot.status,
            used=[MemoryUse(100, 20, 300, 0, 1500), slot.used[1]],
            util=slot.util,
        )
        SimulatedWorkload(hook / "containers" / "pod-a_main" / "abc.cache").set_slot(0, changed)
        await monitor.tick()
        _, text = await get(bound.port)
        assert rows(text) == expected(fixture_spec(procs=(changed, *SLOTS[1:])))
        assert stats.scrapes["rendered"] == 2
    finally:
        monitor.close()


def _get_openmetrics(port: int) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text;version=1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=20) as reply:
        assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
        return str(reply.read().decode())


_INSIGHT = frozenset(
    {
        "hami_trio_container_processes",
        "hami_trio_container_device_processes",
        "hami_trio_container_core_limit_ratio",
        "hami_trio_container_priority",
        "hami_trio_container_utilization_switch",
        "hami_trio_container_blocked_seconds_total",
        "hami_trio_container_blocks_total",
    }
)


@pytest.fixture
def promtool() -> str:
    return require_promtool()  # a sync fixture, so that a skip keeps its reason


@pytest.mark.parametrize("legacy", [False, True], ids=["new-names", "legacy"])
async def test_scrape_passes_promtool(
    nursery: trio.Nursery, hook: Path, legacy: bool, promtool: str
) -> None:
    add_container(hook, "pod-uid-1", "main", fixture_spec())
    _, port = await start_stack(nursery, hook, StaticPodSource(), kubernetes=False, legacy=legacy)
    status, text = await get(port)
    assert status == 200
    assert "hami_vgpu_memory_used_bytes{" in text
    problems = await trio.to_thread.run_sync(lint, text, promtool)
    legacy_camel_case = {"vGPU_device_memory_usage_in_bytes", "vGPU_device_memory_limit_in_bytes"}
    assert {metric for metric, _ in problems} == (legacy_camel_case if legacy else set())


async def test_host_gpu_metrics_from_worker_threads_only(nursery: trio.Nursery, hook: Path) -> None:
    nvml = FakeNvml(gpus=[FakeGpu(name="H100 80GB HBM3", uuid="GPU-host-0", memory_used=4096)])
    _, port = await start_stack(
        nursery, hook, StaticPodSource(), kubernetes=False, host=HostGpuSampler(nvml)
    )
    _, text = await get(port)
    rows = [(n, dict(ls), v) for n, ls, v in series(text) if n.startswith("hami_host_gpu")]
    host = {
        "device_index": "0",
        "device_uuid": "GPU-host-0",
        "device_type": "NVIDIA-H100 80GB HBM3",
    }
    assert sorted(rows, key=lambda r: r[0]) == [
        ("hami_host_gpu_memory_controller_utilization_ratio", host | {"zone": "vGPU"}, 12.0),
        ("hami_host_gpu_memory_used_bytes", host | {"node": "node-a", "zone": "vGPU"}, 4096.0),
        ("hami_host_gpu_utilization_ratio", host | {"node": "node-a", "zone": "vGPU"}, 37.0),
    ]
    assert nvml.threads
    assert threading.get_ident() not in nvml.threads  # never on the trio thread


async def test_wrapping_legacy_offset_over_http(nursery: trio.Nursery, hook: Path) -> None:
    # Parts larger than the total: upstream's uint64 subtraction wraps, so does ours.
    slot = ProcSlot(pid=1, status=1, used=[MemoryUse(700, 200, 300, 0, 1000)])
    spec = fixture_spec(procs=[slot], proc_num=1, num=1, uuids=[GPU_A], limits=[1 << 30])
    add_container(hook, "pod-uid-1", "main", spec)
    _, port = await start_stack(nursery, hook, StaticPodSource(), kubernetes=False, legacy=True)
    _, text = await get(port)
    (labels,) = [dict(ls) for n, ls, _ in series(text) if n == "Device_memory_desc_of_container"]
    assert labels["offset"] == str((1 << 64) - 200)


async def test_kubernetes_names_pods_and_skips_unknown_ones(
    nursery: trio.Nursery, hook: Path, tmp_path: Path
) -> None:
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    mig = [
        {
            "containerIndex": 1,
            "deviceIndex": 0,
            "gpuUUID": GPU_A,
            "profile": "1g.10gb",
            "placement": {"start": 0, "size": 1},
            "migUUID": "MIG-1",
            "gpuInstanceID": 3,
            "computeInstanceID": 0,
        }
    ]
    known = fake.add_pod(
        "trainer-0",
        namespace="team-a",
        init_containers=("setup",),
        containers=("main",),
        labels={"hami.io/vgpu-node": "node-a"},
        annotations={"hami.io/vgpu-mig-allocations": json.dumps(mig)},
    )
    spec = fixture_spec()
    add_container(hook, known, "main", spec)
    add_container(hook, "unknown-uid", "main", spec)
    source = KubernetesPodSource("node-a")
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    await nursery.start(
        partial(serve_pod_watch, source, KubeAccess(kubeconfig=kubeconfig), settings=FAST)
    )
    with trio.fail_after(10):
        while not source.ready:  # noqa: ASYNC110 - the watch and the fake are independent
            await trio.sleep(0.01)
    _, port = await start_stack(nursery, hook, source, kubernetes=True, all_pods=source.pods)
    _, text = await get(port)
    got = {s for s in series(text) if CONTAINER_FAMILIES.match(s[0])}
    assert got == container_series("team-a", "trainer-0", "main", spec, legacy=False)
    mig_rows = [dict(labels) for n, labels, _ in series(text) if n == "hami_mig_device_info"]
    assert mig_rows == [
        {
            "namespace": "team-a",
            "pod": "trainer-0",
            "container": "main",
            "vdevice_index": "0",
            "device_uuid": GPU_A,
            "mig_uuid": "MIG-1",
            "profile": "1g.10gb",
            "gpu_instance_id": "3",
            "compute_instance_id": "0",
            "zone": "vGPU",
        }
    ]
    # The unknown pod appears as soon as the watch learns it (no tick needed: the scrape
    # resolves pods at scrape time).
    fake.add_pod(
        "late", uid="unknown-uid", containers=("main",), labels={"hami.io/vgpu-node": "node-a"}
    )
    with trio.fail_after(10):
        while source.lookup("unknown-uid") is None:  # noqa: ASYNC110 - see above
            await trio.sleep(0.01)
    _, text = await get(port)
    pods = {dict(ls)["pod"] for n, ls, _ in series(text) if n == "hami_vgpu_memory_used_bytes"}
    assert pods == {"trainer-0", "late"}


async def test_scrapes_during_heavy_churn_never_fail(nursery: trio.Nursery, hook: Path) -> None:
    """Containers appear, vanish and get truncated every tick while scrapes run."""
    rng = random.Random(5)
    live: list[Path] = []
    for i in range(20):
        live.append(add_container(hook, f"uid-{i}", "main", fixture_spec()))
    monitor, port = await start_stack(
        nursery, hook, StaticPodSource(), kubernetes=False, interval=0.02
    )
    counter = 20
    stop = trio.Event()

    async def churn() -> None:
        nonlocal counter
        while not stop.is_set():
            for _ in range(3):
                victim = live.pop(rng.randrange(len(live)))
                if rng.random() < 0.3:
                    os.truncate(victim / "abc.cache", rng.choice([0, 11, 4096]))
                else:
                    shutil.rmtree(victim, ignore_errors=True)
                counter += 1
                live.append(add_container(hook, f"uid-{counter}", "main", fixture_spec()))
            await trio.sleep(0.01)

    nursery.start_soon(churn)
    ticks_before = monitor.ticks
    scraped = 0
    with trio.fail_after(60):
        while scraped < 25 or monitor.ticks < ticks_before + 10:
            status, text = await get(port)
            assert status == 200
            families = {f.name for f in text_string_to_metric_families(text)}
            assert "hami_vgpu_memory_used_bytes" in families
            for name, labels, value in series(text):
                if name == "hami_vgpu_memory_used_bytes":
                    assert value == 3000 or dict(labels)["vdevice_index"] == "1"
            scraped += 1
    stop.set()


# The command ------------------------------------------------------------------------------


def _monitor_command(hook: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hami_trio",
        "monitor",
        "--hook-path",
        str(hook),
        "--interval",
        "0.1",
        "--mig-lock-path",
        str(hook.parent / "mig" / "lock"),
        "--debug-bind-address=127.0.0.1:0",
        *extra,
    ]


def _lines(proc: subprocess.Popen[str], deadline: float) -> Iterator[str]:
    """stderr lines as they come (raw reads: a buffered reader would hide lines from select)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.decode() + "\n"


def test_monitor_command_serves_metrics(hook: Path) -> None:
    add_container(hook, "pod-uid-1", "main", fixture_spec(last_kernel_time=0))
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")}
    proc = subprocess.Popen(
        _monitor_command(
            hook, "--no-kubernetes", "--legacy-metrics", "--metrics-bind-address", "127.0.0.1:0"
        ),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen: list[str] = []
    try:
        port = None
        for line in _lines(proc, time.monotonic() + 30):
            seen.append(line)
            match = re.search(r"on 127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port is not None, "".join(seen)
        deadline = time.monotonic() + 20
        while True:
            _, text = _get(port)
            if "hami_vgpu_memory_used_bytes{" in text or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {
            "hami_vgpu_memory_used_bytes",
            "vGPU_device_memory_usage_in_bytes",
            "hami_build_info",
            "hami_trio_monitor_tick_duration_seconds",
        } <= names
        assert not any(name.startswith("hami_host_gpu") for name in names)  # no NVML here
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz") == (
            200,
            "[+]monitor ok\n[+]mig-lock-dir ok\nreadyz check passed\n",
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(seen) + err
    assert "NVML unavailable" in "".join(seen) + err


def test_monitor_command_start_up_errors(hook: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")}
    env.pop("KUBERNETES_SERVICE_HOST", None)

    def run(*extra: str, environ: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _monitor_command(hook, *extra),
            capture_output=True,
            text=True,
            env=environ,
            timeout=60,
            check=False,
        )

    result = run("--metrics-bind-address", "9394")
    assert (result.returncode, result.stderr.count("\n")) == (2, 1)
    assert "has no port" in result.stderr
    result = run()  # Kubernetes is the default and needs NODE_NAME
    assert result.returncode == 2
    assert "NODE_NAME" in result.stderr
    result = run(environ=env | {"NODE_NAME": "node-a"})
    assert result.returncode == 1
    assert "no Kubernetes API configuration" in result.stderr
    result = run(environ=env | {"NODE_NAME": "node-a", "KUBECONFIG": str(hook / "missing")})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("hami-trio monitor: cannot configure")
    with trio_socket_bound() as port:
        result = run("--no-kubernetes", "--metrics-bind-address", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"hami-trio monitor: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use"
    )


class trio_socket_bound:
    """A listening TCP socket on 127.0.0.1 (a busy port for the test)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        port: int = self._sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


async def test_monitor_command_with_kubernetes(nursery: trio.Nursery, hook: Path) -> None:
    """The command's Kubernetes wiring: pod watch -> pod names, MIG rows and /readyz."""
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    uid = fake.add_pod(
        "trainer-0",
        namespace="team-a",
        containers=("main",),
        labels={"hami.io/vgpu-node": "node-a"},
    )
    add_container(hook, uid, "main", fixture_spec())
    add_container(hook, "not-a-pod-here", "main", fixture_spec())
    kubeconfig = write_kubeconfig(hook.parent / "kc", f"http://127.0.0.1:{fake.port}")
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env |= {"NODE_NAME": "node-a", "KUBECONFIG": kubeconfig}
    command = _monitor_command(hook, "--metrics-bind-address", "127.0.0.1:0")
    proc = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=env)
    output = bytearray()

    async def drain() -> None:  # keep the pipe flowing so the child never blocks on a log line
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some():
            output.extend(chunk)

    try:
        async with trio.open_nursery() as inner:
            inner.start_soon(drain)
            with trio.fail_after(30):
                while (match := re.search(rb"on 127\.0\.0\.1:(\d+)", output)) is None:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            port = int(match.group(1))
            with trio.fail_after(30):
                while True:
                    status, body = await get(port, "/readyz")
                    _, text = await get(port)
                    if status == 200 and "trainer-0" in text:
                        break
                    await trio.sleep(0.05)
            assert (
                body == "[+]pod-watch ok\n[+]monitor ok\n[+]mig-lock-dir ok\nreadyz check passed\n"
            )
            pods = {dict(ls)["pod"] for n, ls, _ in series(text) if n.startswith("hami_vgpu")}
            assert pods == {"trainer-0"}  # the unknown pod UID is not exported
            assert ("hami_trio_pod_watch_synced", frozenset(), 1.0) in series(text)
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        if proc.stderr is not None:
            await proc.stderr.aclose()
    assert proc.returncode == 0, output.decode()
