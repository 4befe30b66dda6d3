"""The per-tick insights: control words after the writes, reuse, the exited-slot re-read."""

from __future__ import annotations

import os
from pathlib import Path

from hami_trio.monitor.explain import Explainer
from hami_trio.monitor.feedback import Write
from hami_trio.monitor.layout import ControlField
from hami_trio.monitor.lister import ContainerKey
from hami_trio.monitor.region import RegionHandle
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


async def test_control_words_are_those_after_the_writes(tmp_path: Path) -> None:
    handle, _ = region(tmp_path, slot(1, 0, 10, 1), recent_kernel=2, utilization_switch=0)
    try:
        snapshot = handle.read()
        explainer = Explainer(None)
        writes = [
            Write(KEY, ControlField.RECENT_KERNEL, -1),
            Write(KEY, ControlField.UTILIZATION_SWITCH, 1),
        ]
        insight = (await explainer.update(0.0, {KEY: snapshot}, writes))[KEY]
        assert (insight.recent_kernel, insight.utilization_switch) == (-1, 1)
        assert insight.block.blocked
        assert insight.block.blocks == 1
        assert (insight.priority, insight.core_limits, insight.device_processes) == (1, (40,), (1,))
        # No writes (the MIG lock held them back): what was read is in effect.
        insight = (await explainer.update(5.0, {KEY: snapshot}))[KEY]
        assert (insight.recent_kernel, insight.utilization_switch) == (2, 0)
        assert not insight.block.blocked
        assert (insight.block.seconds, insight.block.blocks) == (5.0, 1)
        again = (await explainer.update(6.0, {KEY: snapshot}))[KEY]
        assert again is insight  # nothing changed: the same object
        assert await explainer.update(7.0, {}) == {}  # gone: forgotten
    finally:
        handle.close()


async def test_exited_slots_are_left_out_of_the_sums_only_when_asked(tmp_path: Path) -> None:
    handle, path = region(tmp_path, slot(1, 4242, 100, 5), slot(2, DEAD, 900, 50))
    try:
        snapshot = handle.read()
        assert snapshot.devices[0].memory_total == 1000
        plain = Explainer(Alive(4242), handle_of=lambda name: handle)
        insight = (await plain.update(0.0, {KEY: snapshot}))[KEY]
        assert insight.processes.exited_host_pids == {DEAD}
        assert insight.devices is None  # upstream's sums

        excluding = Explainer(Alive(4242), exclude_exited=True, handle_of=lambda name: handle)
        insight = (await excluding.update(0.0, {KEY: snapshot}))[KEY]
        assert insight.devices is not None
        assert (insight.devices[0].memory_total, insight.devices[0].sm_util) == (100, 5)
        reads = handle.read_bytes
        handle.read_bytes = 0
        again = (await excluding.update(1.0, {KEY: snapshot}))[KEY]
        assert again.devices is insight.devices  # same snapshot, same exited: no re-read
        assert handle.read_bytes == 0
        assert reads > 0
        # The live process grew: a new snapshot, read again.
        SimulatedWorkload(path).set_slot(0, slot(1, 4242, 300, 5))
        changed = handle.read()
        insight = (await excluding.update(2.0, {KEY: changed}))[KEY]
        assert insight.devices is not None
        assert insight.devices[0].memory_total == 300
        # A file that changed size since its snapshot is not re-read: upstream's sums.
        os.truncate(path, changed.file_size + 1)
        SimulatedWorkload(path).set_slot(0, slot(1, 4242, 301, 5))
        insight = (await excluding.update(3.0, {KEY: handle.read(changed.file_size)}))[KEY]
        assert insight.devices is None
    finally:
        handle.close()


async def test_without_a_handle_the_sums_stay_upstreams(tmp_path: Path) -> None:
    handle, _ = region(tmp_path, slot(1, DEAD, 100, 5))
    try:
        snapshot = handle.read()
    finally:
        handle.close()
    explainer = Explainer(Alive(), exclude_exited=True, handle_of=lambda name: None)
    insight = (await explainer.update(0.0, {KEY: snapshot}))[KEY]
    assert insight.processes.exited == 1
    assert insight.devices is None


async def test_a_new_snapshot_with_the_same_host_pids_keeps_the_counts(tmp_path: Path) -> None:
    # A churning region: its counters move every tick, its slots' host PIDs do not.
    handle, path = region(tmp_path, slot(1, 4242, 100, 5), slot(2, DEAD, 900, 50))
    work = SimulatedWorkload(path)
    try:
        alive = Alive(4242)
        explainer = Explainer(alive)
        first = (await explainer.update(0.0, {KEY: handle.read()}))[KEY]
        assert (first.processes.running, first.processes.exited) == (1, 1)
        work.set_slot(0, slot(1, 4242, 300, 7))
        snapshot = handle.read()
        assert snapshot is not first.snapshot
        second = (await explainer.update(1.0, {KEY: snapshot}))[KEY]
        assert second.snapshot is snapshot
        assert second.processes is first.processes  # same PIDs, same dead PIDs
        alive.alive.discard(4242)  # the running one exits: counted anew
        third = (await explainer.update(2.0, {KEY: snapshot}))[KEY]
        assert (third.processes.running, third.processes.exited) == (0, 2)
        work.set_slot(0, slot(1, 5151, 300, 7))  # a new process in the slot
        fourth = (await explainer.update(3.0, {KEY: handle.read()}))[KEY]
        assert (fourth.processes.running, fourth.processes.exited) == (0, 2)
        assert fourth.processes.exited_host_pids == frozenset({5151, DEAD})
    finally:
        handle.close()


async def test_a_large_node_is_explained_in_batches_between_checkpoints(tmp_path: Path) -> None:
    import trio

    from hami_trio.monitor.explain import EXPLAIN_BATCH

    handle, _ = region(tmp_path, slot(1, 0, 10, 1))
    try:
        snapshot = handle.read()
        snapshots = {ContainerKey(f"pod-{i}", "main"): snapshot for i in range(3 * EXPLAIN_BATCH)}
        explainer = Explainer(None)
        ran: list[int] = []

        async def other() -> None:
            while True:
                ran.append(len(explainer.insights()))
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()
            before = len(ran)
            view = await explainer.update(0.0, snapshots)
            nursery.cancel_scope.cancel()
        assert len(view) == 3 * EXPLAIN_BATCH
        # Three checkpoints, four stretches: trio runs the other task once in each scheduling
        # batch, before or after the explainer's stretch (its order is random), so at least
        # twice while the update runs - and it saw nothing half-published.
        assert len(ran) - before >= 2
        assert set(ran) == {0}
    finally:
        handle.close()
