"""The pure decisions behind the process and feedback-state metrics."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from hami_trio.monitor.insight import (
    CHECKS_PER_CONTAINER,
    BlockState,
    BlockTracker,
    ProcessClassifier,
    ProcessCounts,
    ProcessState,
)


class Alive:
    """A liveness check over a fixed set of PIDs that counts its calls."""

    def __init__(self, alive: set[int]) -> None:
        self.alive = alive
        self.calls: list[int] = []

    def __call__(self, pid: int) -> bool:
        self.calls.append(pid)
        return pid in self.alive


def test_states_of_slots() -> None:
    alive = Alive({100, 101})
    classifier = ProcessClassifier(alive)
    classifier.begin_tick()
    counts = classifier.classify((100, 0, 555, 101, 0, 555))
    assert counts == ProcessCounts(
        running=2, exited=2, unknown=2, exited_host_pids=frozenset({555})
    )
    assert counts.by_state() == (
        (ProcessState.RUNNING, 2),
        (ProcessState.EXITED, 2),
        (ProcessState.UNKNOWN, 2),
    )
    assert sorted(alive.calls) == [100, 101, 555]  # one check per distinct PID


def test_negative_host_pids_are_never_asked_and_count_as_exited() -> None:
    alive = Alive(set())
    classifier = ProcessClassifier(alive)
    classifier.begin_tick()
    assert classifier.classify((-1, -5)).exited == 2
    assert alive.calls == []  # kill(-1, 0) would address every process


def test_without_the_host_pid_namespace_nothing_is_exited() -> None:
    classifier = ProcessClassifier(None)
    classifier.begin_tick()
    assert not classifier.checks_liveness
    assert classifier.classify((0, 7, 8)) == ProcessCounts(running=2, unknown=1)
    assert classifier.checks == 0


def test_one_check_per_pid_per_tick_across_containers() -> None:
    alive = Alive({1})
    classifier = ProcessClassifier(alive)
    for _ in range(3):
        classifier.begin_tick()
        classifier.classify((1, 2))
        classifier.classify((2, 1))  # another container with the same host PIDs
    assert len(alive.calls) == 6  # 2 PIDs x 3 ticks
    assert classifier.checks == 6


def test_liveness_changes_are_seen_next_tick() -> None:
    alive = Alive({9})
    classifier = ProcessClassifier(alive)
    classifier.begin_tick()
    assert classifier.classify((9,)).running == 1
    alive.alive.clear()
    classifier.begin_tick()
    assert classifier.classify((9,)).exited_host_pids == {9}


def test_a_tenant_with_1024_distinct_host_pids_costs_a_bounded_number_of_checks() -> None:
    pids = tuple(range(1000, 2024))
    alive = Alive({p for p in pids if p % 2})
    classifier = ProcessClassifier(alive)
    ticks = math.ceil(len(pids) / CHECKS_PER_CONTAINER)
    for tick in range(ticks):
        before = len(alive.calls)
        classifier.begin_tick()
        counts = classifier.classify(pids)
        assert len(alive.calls) - before == CHECKS_PER_CONTAINER
        # never checked yet: counted running until its turn comes
        assert counts.exited == CHECKS_PER_CONTAINER * (tick + 1) // 2
    assert set(alive.calls) == set(pids)  # the window went round once
    assert counts == ProcessCounts(
        running=512, exited=512, exited_host_pids=frozenset(p for p in pids if p % 2 == 0)
    )
    classifier.begin_tick()
    assert classifier.classify(pids) == counts  # stale results are kept while unchecked


@given(
    slots=st.lists(st.integers(-3, 40), max_size=200),
    live=st.sets(st.integers(1, 40)),
    budget=st.integers(1, 8),
)
def test_classification_converges_within_the_budgeted_ticks(
    slots: list[int], live: set[int], budget: int
) -> None:
    alive = Alive(live)
    classifier = ProcessClassifier(alive, checks_per_container=budget)
    distinct = {p for p in slots if p != 0}
    for _ in range(max(1, math.ceil(len(distinct) / budget))):
        calls = len(alive.calls)
        classifier.begin_tick()
        counts = classifier.classify(slots)
        assert len(alive.calls) - calls <= budget
        assert counts.running + counts.exited + counts.unknown == len(slots)
    exited = [p for p in slots if p != 0 and p not in live]
    assert counts.unknown == slots.count(0)
    assert counts.exited == len(exited)
    assert counts.exited_host_pids == frozenset(exited)


def test_block_tracker_counts_episodes_and_their_duration() -> None:
    tracker: BlockTracker[str] = BlockTracker()
    assert tracker.update(0.0, [("a", False), ("b", True)]) == {
        "a": BlockState(),
        "b": BlockState(True, 0.0, 0.0, 1),
    }
    states = tracker.update(5.0, [("a", True), ("b", True)])
    assert states["a"] == BlockState(True, 5.0, 0.0, 1)
    assert states["b"] == BlockState(True, 0.0, 5.0, 1)
    states = tracker.update(10.0, [("a", False), ("b", False)])
    assert states["a"] == BlockState(False, None, 5.0, 1)
    assert states["b"] == BlockState(False, None, 10.0, 1)
    states = tracker.update(12.0, [("a", False), ("b", True)])
    assert states["b"] == BlockState(True, 12.0, 10.0, 2)  # a second episode
    assert states["a"] is tracker.update(13.0, [("a", False)])["a"]  # unchanged: same object
    assert tracker.update(14.0, [("b", True)])["b"] == BlockState(True, 14.0, 0.0, 1)  # b left


@given(st.lists(st.tuples(st.floats(0, 100), st.booleans()), max_size=50))
def test_block_counters_are_monotonic(steps: list[tuple[float, bool]]) -> None:
    tracker: BlockTracker[str] = BlockTracker()
    now, last = 0.0, BlockState()
    for delta, blocked in steps:
        now += delta
        state = tracker.update(now, [("c", blocked)])["c"]
        assert state.seconds >= last.seconds
        assert state.blocks >= last.blocks
        assert state.blocked is blocked
        assert (state.since is not None) is blocked
        last = state
    assert last.seconds <= now
