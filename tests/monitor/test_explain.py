"""The usage read's insights: control words as read, the tick's blocking counters, reuse,
the exited-slot re-read."""

from __future__ import annotations

import os
from pathlib import Path

from hami_trio.monitor.explain import Explainer
from hami_trio.monitor.insight import NEVER_BLOCKED, BlockState, BlockTracker
from hami_trio.monitor.region import RegionHandle
from hami_trio.monitor.state import ContainerKey
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)

KEY = ContainerKey("pod", "main")
DEAD = 999_999  # above the default pid_max: no such process


def slot(pid: int, hostpid: int, total: int, sm: int) -> ProcSlot:
    return ProcSlot(
        pid=pid, hostpid=hostpid, used=[MemoryUse(total=total)], util=[UtilUse(0, 0, sm)]
    )


def region(tmp_path: Path, *slots: ProcSlot, **spec: object) -> tuple[RegionHandle, Path]:
    path = tmp_path / "x.cache"
    write_region(path, RegionSpec(uuids=["GPU-0"], sm_limits=[40], procs=slots, **spec))  # type: ignore[arg-type]
    return RegionHandle.open_path(path, writable=True), path


class Alive:
    def __init__(self, *alive: int) -> None:
        self.alive = set(alive)
        self.calls = 0

    def __call__(self, pid: int) -> bool:
        self.calls += 1
        return pid in self.alive


def test_control_words_are_those_read_and_the_block_the_ticks(tmp_path: Path) -> None:
    handle, _ = region(tmp_path, slot(1, 0, 10, 1), recent_kernel=-1, utilization_switch=1)
    try:
        snapshot = handle.read_usage()
        explainer = Explainer(None)
        ticks: BlockTracker[ContainerKey] = BlockTracker()
        ticks.update(0.0, [(KEY, True)])
        insight = explainer.update({KEY: snapshot}, ticks.states(), {KEY: handle})[KEY]
        assert (insight.recent_kernel, insight.utilization_switch) == (-1, 1)
        assert insight.block.blocked
        assert insight.block.blocks == 1
        assert (insight.priority, insight.core_limits, insight.device_processes) == (1, (40,), (1,))
        ticks.update(5.0, [(KEY, False)])
        insight = explainer.update({KEY: snapshot}, ticks.states(), {})[KEY]
        assert not insight.block.blocked
        assert (insight.block.seconds, insight.block.blocks) == (5.0, 1)
        again = explainer.update({KEY: snapshot}, ticks.states(), {})[KEY]
        assert again is insight  # nothing changed: the same object
        assert explainer.update({}, {}, {}) == {}  # gone: forgotten
        never = explainer.update({KEY: snapshot}, {}, {})[KEY]
        assert never.block is NEVER_BLOCKED
    finally:
        handle.close()


def test_exited_slots_are_left_out_of_the_sums_only_when_asked(tmp_path: Path) -> None:
    handle, path = region(tmp_path, slot(1, 4242, 100, 5), slot(2, DEAD, 900, 50))
    handles = {KEY: handle}
    blocks: dict[ContainerKey, BlockState] = {}
    try:
        snapshot = handle.read_usage()
        assert snapshot.devices[0].memory_total == 1000
        plain = Explainer(Alive(4242))
        insight = plain.update({KEY: snapshot}, blocks, handles)[KEY]
        assert insight.processes.exited_host_pids == {DEAD}
        assert insight.devices is None  # upstream's sums

        excluding = Explainer(Alive(4242), exclude_exited=True)
        insight = excluding.update({KEY: snapshot}, blocks, handles)[KEY]
        assert insight.devices is not None
        assert (insight.devices[0].memory_total, insight.devices[0].sm_util) == (100, 5)
        again = excluding.update({KEY: snapshot}, blocks, {})[KEY]
        assert again.devices is insight.devices  # same snapshot, same exited: no re-read
        # The live process grew: a new snapshot, read again.
        SimulatedWorkload(path).set_slot(0, slot(1, 4242, 300, 5))
        changed = handle.read_usage()
        insight = excluding.update({KEY: changed}, blocks, handles)[KEY]
        assert insight.devices is not None
        assert insight.devices[0].memory_total == 300
        # A file that changed size since its snapshot is not re-read: upstream's sums.
        SimulatedWorkload(path).set_slot(0, slot(1, 4242, 301, 5))
        grown = handle.read_usage()
        os.truncate(path, changed.file_size + 1)
        insight = excluding.update({KEY: grown}, blocks, handles)[KEY]
        assert insight.devices is None
    finally:
        handle.close()


def test_without_a_handle_the_sums_stay_upstreams(tmp_path: Path) -> None:
    handle, _ = region(tmp_path, slot(1, DEAD, 100, 5))
    try:
        snapshot = handle.read_usage()
    finally:
        handle.close()
    explainer = Explainer(Alive(), exclude_exited=True)
    insight = explainer.update({KEY: snapshot}, {}, {})[KEY]
    assert insight.processes.exited == 1
    assert insight.devices is None


def test_a_new_snapshot_with_the_same_host_pids_keeps_the_counts(tmp_path: Path) -> None:
    # A churning region: its counters move every read, its slots' host PIDs do not.
    handle, path = region(tmp_path, slot(1, 4242, 100, 5), slot(2, DEAD, 900, 50))
    work = SimulatedWorkload(path)
    try:
        alive = Alive(4242)
        explainer = Explainer(alive)
        first = explainer.update({KEY: handle.read_usage()}, {}, {})[KEY]
        assert (first.processes.running, first.processes.exited) == (1, 1)
        work.set_slot(0, slot(1, 4242, 300, 7))
        snapshot = handle.read_usage()
        assert snapshot is not first.snapshot
        second = explainer.update({KEY: snapshot}, {}, {})[KEY]
        assert second.snapshot is snapshot
        assert second.processes is first.processes  # same PIDs, same dead PIDs
        alive.alive.discard(4242)  # the running one exits: counted anew
        third = explainer.update({KEY: snapshot}, {}, {})[KEY]
        assert (third.processes.running, third.processes.exited) == (0, 2)
        work.set_slot(0, slot(1, 5151, 300, 7))  # a new process in the slot
        fourth = explainer.update({KEY: handle.read_usage()}, {}, {})[KEY]
        assert (fourth.processes.running, fourth.processes.exited) == (0, 2)
        assert fourth.processes.exited_host_pids == frozenset({5151, DEAD})
    finally:
        handle.close()
