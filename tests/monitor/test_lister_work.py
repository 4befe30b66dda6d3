"""The tick yields by work done, not per container: hostile regions and huge directories.

A tenant controls how much work its container costs the monitor: ``proc_num`` 1024 with 16
devices makes its region ~2 MB to read and ~100,000 integers to parse, and a directory that
once held hundreds of thousands of entries stays as large on ext4 after they are deleted, so
every listing of it walks all of its blocks.  The broker shares the monitor's event loop: the
tick must give it back after a bounded amount of work, whatever the tenants wrote.

The tests measure the work themselves, independently of the lister's own accounting: every
``os.pread`` on the event loop's thread adds the bytes it returned, every ``os.scandir`` there
adds the size of the directory it lists, and a trio instrument takes the largest sum over one
step of the ticking task (a step ends at the task's next checkpoint of any kind).  They
assert on these work units, never on time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from hami_trio.monitor.layout import MAX_DEVICES, MAX_SLOTS
from hami_trio.monitor.lister import INLINE_DIR_BYTES, MAX_STEP_WORK
from hami_trio.monitor.loop import Monitor, MonitorConfig
from hami_trio.monitor.state import ContainerStatus
from hami_trio.pods.source import StaticPodSource
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)

HOSTILE = 8


def hostile_slot(seed: int) -> ProcSlot:
    return ProcSlot(
        pid=seed + 1,
        status=1,
        used=[MemoryUse(context_size=seed + d, total=(seed + 1) << 20) for d in range(16)],
        util=[UtilUse(sm_util=(seed + d) % 100) for d in range(16)],
    )


def hostile_spec() -> RegionSpec:
    """The most expensive region a tenant can write: every slot live on 16 devices."""
    return RegionSpec(
        num=MAX_DEVICES,
        uuids=[f"GPU-{d:02d}" for d in range(MAX_DEVICES)],
        limits=[1 << 30] * MAX_DEVICES,
        procs=[hostile_slot(s) for s in range(MAX_SLOTS)],
        proc_num=MAX_SLOTS,
        recent_kernel=2,
    )


class StepWork(trio.abc.Instrument):
    """Work units done by one task between two of its checkpoints (largest seen)."""

    def __init__(self) -> None:
        self.units = 0
        self.task: trio.lowlevel.Task | None = None
        self.steps = 0
        self.largest = 0
        self.total = 0
        self._start = 0

    def add(self, units: int) -> None:
        if threading.current_thread() is threading.main_thread():
            self.units += units

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self._start = self.units

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            done = self.units - self._start
            self.steps += 1
            self.total += done
            self.largest = max(self.largest, done)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> StepWork:
    meter = StepWork()
    real_pread: Callable[..., bytes] = os.pread
    real_scandir: Callable[..., Any] = os.scandir

    def pread(fd: int, length: int, offset: int) -> bytes:
        data = real_pread(fd, length, offset)
        meter.add(len(data))
        return data

    def scandir(path: Any = ".") -> Any:
        meter.add(os.fstat(path).st_size if isinstance(path, int) else os.stat(path).st_size)
        return real_scandir(path)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "scandir", scandir)
    return meter


async def ticks(
    monitor: Monitor, meter: StepWork, count: int, change: Callable[[int], None]
) -> None:
    meter.task = trio.lowlevel.current_task()
    trio.lowlevel.add_instrument(meter)
    try:
        for i in range(count):
            change(i)
            await monitor.tick()
            await trio.lowlevel.checkpoint()  # the step that follows tick() is not its work
    finally:
        trio.lowlevel.remove_instrument(meter)
        meter.task = None


def hostile_tree(hook: Path, hostile: int, normal: int) -> list[SimulatedWorkload]:
    root = hook / "containers"
    root.mkdir(parents=True)
    spec = hostile_spec()
    workloads = []
    for i in range(hostile):
        directory = root / f"h{i:03d}_main"
        directory.mkdir()
        write_region(directory / "x.cache", spec)
        workloads.append(SimulatedWorkload(directory / "x.cache"))
    for i in range(normal):
        directory = root / f"n{i:03d}_main"
        directory.mkdir()
        write_region(
            directory / "x.cache",
            RegionSpec(uuids=["GPU-00"], procs=[hostile_slot(i)], recent_kernel=2),
        )
    return workloads


def monitor_for(hook: Path) -> Monitor:
    config = MonitorConfig(hook_path=hook, mig_lock_path=hook / "lock" / "mig.lock")
    return Monitor(config, pod_source=StaticPodSource())


def emptied(directory: Path) -> int:
    """Grow ``directory`` past K bytes with 250-byte names (hard links: no inode each), then
    delete them all: ext4 keeps the directory's blocks.  Returns its size."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = [f"{i:06d}{'x' * 244}" for i in range(MAX_STEP_WORK // 256 * 5 // 4)]
        for i, name in enumerate(names):
            if i % 1000 == 0:
                seed = name
                os.close(os.open(seed, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
            else:
                os.link(seed, name, src_dir_fd=fd, dst_dir_fd=fd)
        for name in names:
            os.unlink(name, dir_fd=fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return size


def add_loaded_containers(root: Path, count: int) -> None:
    """``count`` well-behaved containers ``n000_main``... with one small region each."""
    for i in range(count):
        directory = root / f"n{i:03d}_main"
        directory.mkdir()
        write_region(directory / "x.cache", RegionSpec(uuids=["GPU-00"], recent_kernel=2))


async def test_hostile_regions_changed_every_tick_cost_the_event_loop_only_their_tails(
    tmp_path: Path, work: StepWork
) -> None:
    workloads = hostile_tree(tmp_path, HOSTILE, normal=200)
    monitor = monitor_for(tmp_path)

    def change(tick: int) -> None:
        for w in workloads:  # a tenant rewriting its slots every tick
            w.set_slot(0, hostile_slot(1000 + tick))

    try:
        await ticks(monitor, work, 3, change)
        view = monitor.containers()
        usage = await monitor.read_usage()  # in a worker thread: not the event loop's work
    finally:
        monitor.close()
    hostile = [s for k, s in view.items() if k.pod_uid.startswith("h")]
    assert len(hostile) == HOSTILE
    assert all(s.status is ContainerStatus.LOADED for s in hostile)
    read = [s for k, s in usage.containers.items() if k.pod_uid.startswith("h")]
    assert all(s.snapshot is not None and s.snapshot.active_slots == MAX_SLOTS for s in read)
    # The event loop read each region's static head once and its tail every tick: a few KiB
    # per container in all, never a tenant's 2 MB of slots ...
    assert work.total < 3 * (HOSTILE + 200) * 4096, work.total
    # ... and never more than K units of it without a checkpoint.
    assert work.largest <= MAX_STEP_WORK, (work.largest, work.steps)


async def test_huge_empty_directory_is_not_listed_on_the_event_loop(
    tmp_path: Path, work: StepWork
) -> None:
    hook = tmp_path
    root = hook / "containers"
    root.mkdir()
    huge = root / "huge_main"  # a tenant's directory: no .cache file, re-listed every tick
    huge.mkdir()
    size = emptied(huge)
    if size <= max(INLINE_DIR_BYTES, MAX_STEP_WORK):
        pytest.skip(f"this filesystem shrinks emptied directories ({size} bytes left)")
    add_loaded_containers(root, 20)
    monitor = monitor_for(hook)
    try:
        await ticks(monitor, work, 3, lambda tick: None)
        view = monitor.containers()
    finally:
        monitor.close()
    huge_state = next(s for k, s in view.items() if k.pod_uid == "huge")
    assert huge_state.status is ContainerStatus.NO_CACHE_FILE  # still listed, just elsewhere
    assert sum(s.status is ContainerStatus.LOADED for s in view.values()) == 20
    assert work.largest <= MAX_STEP_WORK, (work.largest, size)
    assert work.largest < size


async def test_huge_containers_directory_is_not_listed_on_the_event_loop(
    tmp_path: Path, work: StepWork
) -> None:
    root = tmp_path / "containers"
    root.mkdir()
    size = emptied(root)  # thousands of containers came and went
    if size <= max(INLINE_DIR_BYTES, MAX_STEP_WORK):
        pytest.skip(f"this filesystem shrinks emptied directories ({size} bytes left)")
    add_loaded_containers(root, 5)
    monitor = monitor_for(tmp_path)
    try:
        await ticks(monitor, work, 2, lambda tick: None)
        view = monitor.containers()
    finally:
        monitor.close()
    assert sorted(k.pod_uid for k, s in view.items() if s.status is ContainerStatus.LOADED) == [
        f"n{i:03d}" for i in range(5)
    ]
    assert work.largest <= MAX_STEP_WORK, (work.largest, size)
