"""Hostile tenants against a running monitor, with real files and a real second process.

The monitor runs in this process at a 10 ms interval for 30 s (``HAMI_TRIO_HOSTILE_SECONDS``
overrides, e.g. for a quick local run) while a second process, playing the tenants:

- truncates and regrows one ``.cache`` file in a tight loop (an mmap reader dies of SIGBUS);
- replaces another one by ``rename`` again and again (valid region, then random bytes);
- swaps a third between a regular file and a symlink to another container's file;

and the tree also holds, from the start: a symlink to another container's file, a symlink to
a host file that looks like a valid region, a FIFO named ``x.cache``, a directory named
``x.cache``, random bytes, random bytes behind a valid header, ``priority = 2147483647`` and
``proc_num = 2000``.

Checked: the agent never dies and keeps ticking; the well-behaved containers' snapshots are
exactly right every time we look; the symlink targets receive no write through the symlink
entries (the target container's ``recent_kernel`` decays exactly once per tick, its switch is
never turned on by a phantom duplicate, and the host file is byte-for-byte unchanged); the
huge priority is blocked by the more important tenant on its GPU; and a log line names every
offending container.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from hami_trio.monitor.layout import MAGIC, Format
from hami_trio.monitor.loop import Monitor, MonitorConfig, serve_monitor
from hami_trio.monitor.snapshot import parse_region
from hami_trio.monitor.state import ContainerKey, ContainerStatus
from hami_trio.pods.source import StaticPodSource
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    build_region,
    write_region,
)

DURATION = float(os.environ.get("HAMI_TRIO_HOSTILE_SECONDS", "30"))
INT32_MAX = 2**31 - 1
REPO = Path(__file__).resolve().parents[2]

TENANTS = textwrap.dedent(
    """
    import os, random, sys, time
    from hami_trio.testing.regions import RegionSpec, region_pieces, write_region

    root, duration = sys.argv[1], float(sys.argv[2])
    flap_spec = RegionSpec(uuids=["GPU-F"], priority=2, recent_kernel=2)
    pieces = region_pieces(flap_spec)
    fd = os.open(os.path.join(root, "flap_c", "x.cache"), os.O_RDWR)
    victim_c = os.path.join(root, "victim_c", "x.cache")
    end = time.monotonic() + duration
    i = 0
    while time.monotonic() < end:
        os.ftruncate(fd, 0)
        os.ftruncate(fd, random.choice([0, 5, 12, 64, 1197897, flap_spec.file_size]))
        for offset, piece in pieces:
            os.pwrite(fd, piece, offset)
        os.ftruncate(fd, flap_spec.file_size)
        i += 1
        if i % 20 == 0:
            tmp = os.path.join(root, "replace_c", "incoming")
            if (i // 20) % 2:
                write_region(tmp, RegionSpec(uuids=["GPU-R"], priority=4, recent_kernel=2))
            else:
                with open(tmp, "wb") as f:
                    f.write(os.urandom(random.randrange(1, 3_000_000)))
            os.replace(tmp, os.path.join(root, "replace_c", "x.cache"))
            tmp = os.path.join(root, "swap_c", "incoming")
            if (i // 20) % 2:
                os.symlink(victim_c, tmp)
            else:
                write_region(tmp, RegionSpec(uuids=["GPU-S"], priority=5, recent_kernel=2))
            os.replace(tmp, os.path.join(root, "swap_c", "x.cache"))
    os.close(fd)
    print(i)
    """
)

OFFENDERS = (
    "flap_c",
    "replace_c",
    "swap_c",
    "symlink_c",
    "hostlink_c",
    "fifo_c",
    "dir_c",
    "random_c",
)


def slots(n: int, seed: int) -> list[ProcSlot]:
    return [
        ProcSlot(
            pid=s + 1,
            status=1,
            used=[MemoryUse(context_size=seed + s, total=1000 * (s + 1)), MemoryUse(total=seed)],
            util=[UtilUse(sm_util=s + seed), UtilUse(sm_util=1)],
        )
        for s in range(n)
    ]


def well_behaved() -> dict[str, RegionSpec]:
    return {
        "victim_a": RegionSpec(
            num=2,
            uuids=["GPU-A", "GPU-A2"],
            limits=[1 << 30, 2 << 30],
            procs=slots(4, 7),
            priority=0,
            recent_kernel=INT32_MAX,
            last_kernel_time=1_700_000_000,
        ),
        "victim_b": RegionSpec(
            format=Format.V0, num=2, uuids=["GPU-B"], procs=slots(3, 11), priority=3
        ),
        "victim_c": RegionSpec(
            num=1, uuids=["GPU-Q"], procs=slots(2, 5), priority=1, recent_kernel=INT32_MAX
        ),
        "bigprio_c": RegionSpec(
            num=1, uuids=["GPU-A"], procs=slots(1, 1), priority=INT32_MAX, recent_kernel=INT32_MAX
        ),
        "procnum_c": RegionSpec(num=2, uuids=["GPU-P"], procs=slots(12, 3), proc_num=2000),
    }


def build_tree(tmp_path: Path) -> tuple[Path, Path, dict[str, RegionSpec]]:
    hook = tmp_path / "hook"
    root = hook / "containers"
    specs = well_behaved()
    for name, spec in specs.items():
        (root / name).mkdir(parents=True)
        write_region(root / name / "x.cache", spec)
    victim_c = root / "victim_c" / "x.cache"

    for name in OFFENDERS:
        (root / name).mkdir()
    write_region(root / "flap_c" / "x.cache", RegionSpec(uuids=["GPU-F"]))
    write_region(root / "replace_c" / "x.cache", RegionSpec(uuids=["GPU-R"]))
    write_region(root / "swap_c" / "x.cache", RegionSpec(uuids=["GPU-S"], priority=5))
    (root / "symlink_c" / "x.cache").symlink_to(victim_c)
    host = tmp_path / "host-file"
    write_region(
        host, RegionSpec(uuids=["GPU-Q"], priority=0, recent_kernel=INT32_MAX), sparse=False
    )
    (root / "hostlink_c" / "x.cache").symlink_to(host)
    os.mkfifo(root / "fifo_c" / "x.cache")
    (root / "dir_c" / "x.cache").mkdir()
    (root / "random_c" / "x.cache").write_bytes(os.urandom(2_008_953))
    garbage = bytearray(os.urandom(2_008_953))
    garbage[0:12] = (
        MAGIC.to_bytes(4, "little") + (1).to_bytes(4, "little") + (2).to_bytes(4, "little")
    )
    (root / "garbage_c").mkdir()
    (root / "garbage_c" / "x.cache").write_bytes(bytes(garbage))
    return hook, host, specs


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
async def test_hostile_tenants_cannot_hurt_the_agent_or_each_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook, host, specs = build_tree(tmp_path)
    host_digest = digest(host)
    expected = {name: parse_region(build_region(spec)) for name, spec in specs.items()}
    config = MonitorConfig(
        hook_path=hook, interval=0.01, tick_deadline=2.0, mig_lock_path=tmp_path / "mig" / "lock"
    )
    finished = trio.Event()
    tenants: list[subprocess.CompletedProcess[bytes]] = []

    async def play_tenants() -> None:
        tenants.append(
            await trio.run_process(
                [sys.executable, "-c", TENANTS, str(hook / "containers"), str(DURATION)],
                cwd=REPO,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        )
        finished.set()

    checks = 0
    with caplog.at_level(logging.INFO, logger="hami_trio"):
        async with trio.open_nursery() as nursery:
            monitor: Monitor = await nursery.start(
                functools.partial(
                    serve_monitor, config, pod_source=StaticPodSource(), registry=None
                )
            )
            nursery.start_soon(play_tenants)
            while not finished.is_set():
                with trio.move_on_after(0.2):
                    await finished.wait()
                # a usage read (in a worker thread, as a scrape's) while the tenants hammer
                view = (await monitor.read_usage(max_age=0)).containers
                for name, want in expected.items():
                    pod, ctr = name.split("_", 1)
                    state = view[ContainerKey(pod, ctr)]
                    got = state.snapshot
                    assert got is not None, (name, state.rejection)
                    assert got.devices == want.devices, name
                    assert (got.priority, got.active_slots, got.device_count) == (
                        want.priority,
                        want.active_slots,
                        want.device_count,
                    ), name
                    assert got.last_kernel_time == want.last_kernel_time
                for name in ("symlink_c", "hostlink_c", "fifo_c", "dir_c", "random_c"):
                    pod, ctr = name.split("_", 1)
                    assert view[ContainerKey(pod, ctr)].status is ContainerStatus.REJECTED
                checks += 1
            monitor.request_stop()
    (tenant_run,) = tenants
    assert tenant_run.returncode == 0, tenant_run.stderr.decode()
    assert int(tenant_run.stdout) > 100  # the tenants really did hammer their files
    assert checks >= 5
    assert monitor.ticks > 100  # the agent kept ticking throughout

    # Symlink targets: no write ever went through a symlink entry.
    assert digest(host) == host_digest
    victim_c = SimulatedWorkload(hook / "containers" / "victim_c" / "x.cache")
    recent, switch = victim_c.read_control()
    assert recent == INT32_MAX - monitor.ticks  # decayed once per tick: only its own entry
    assert switch == 0  # a followed symlink would have made it crowded on GPU-Q

    # Priority 2**31-1 is just a number: blocked by the priority-0 tenant on GPU-A.
    assert SimulatedWorkload(hook / "containers" / "bigprio_c" / "x.cache").read_control() == (
        -1,
        1,
    )
    assert SimulatedWorkload(hook / "containers" / "victim_a" / "x.cache").read_control()[0] > 0

    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for name in OFFENDERS:
        assert any(name in m for m in messages), f"no log line names {name}"
    assert not any(name in m for m in messages for name in expected)
