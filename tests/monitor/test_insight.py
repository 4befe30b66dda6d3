"""The pure decisions behind the process and feedback-state metrics."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami_trio.monitor.insight import (
    DIRECT_CHECKS,
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


class Listing:
    """The live PIDs at once (the ``/proc`` listing), counting its calls."""

    def __init__(self, alive: set[int]) -> None:
        self.alive = alive
        self.calls = 0

    def __call__(self) -> frozenset[int]:
        self.calls += 1
        return frozenset(self.alive)


def tick(classifier: ProcessClassifier, *containers: tuple[int, ...]) -> list[ProcessCounts]:
    classifier.begin_tick(containers)
    return [classifier.classify(c) for c in containers]


def test_states_of_slots() -> None:
    alive = Alive({100, 101})
    classifier = ProcessClassifier(alive)
    (counts,) = tick(classifier, (100, 0, 555, 101, 0, 555))
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
    (counts,) = tick(ProcessClassifier(alive), (-1, -5))
    assert counts.exited == 2
    assert alive.calls == []  # kill(-1, 0) would address every process


def test_without_the_host_pid_namespace_nothing_is_exited() -> None:
    classifier = ProcessClassifier(None)
    assert not classifier.checks_liveness
    assert tick(classifier, (0, 7, 8)) == [ProcessCounts(running=2, unknown=1)]
    assert classifier.checks == 0


def test_one_check_per_pid_per_tick_across_containers() -> None:
    alive = Alive({1})
    classifier = ProcessClassifier(alive)
    for _ in range(3):
        assert (
            tick(classifier, (1, 2), (2, 1))
            == [ProcessCounts(running=1, exited=1, exited_host_pids=frozenset({2}))] * 2
        )
    assert len(alive.calls) == 6  # 2 PIDs x 3 ticks, whatever the number of containers
    assert classifier.checks == 6


def test_liveness_changes_are_seen_next_tick() -> None:
    alive = Alive({9})
    classifier = ProcessClassifier(alive)
    assert tick(classifier, (9,))[0].running == 1
    alive.alive.clear()
    assert tick(classifier, (9,))[0].exited_host_pids == {9}


def test_many_distinct_host_pids_cost_one_listing_not_one_call_each() -> None:
    # A tenant writes 1024 distinct host PIDs: no 1024 system calls per tick.
    pids = tuple(range(1000, 2024))
    alive = Alive({p for p in pids if p % 2})
    listing = Listing(alive.alive)
    classifier = ProcessClassifier(alive, listing)
    for _ in range(3):
        (counts,) = tick(classifier, pids, (1001,))[:1]
    assert alive.calls == []
    assert listing.calls == 3  # once per tick
    assert classifier.listings == 3
    assert counts == ProcessCounts(
        running=512, exited=512, exited_host_pids=frozenset(p for p in pids if p % 2 == 0)
    )
    # Few distinct PIDs: asked one by one, no listing.
    tick(classifier, tuple(range(1, DIRECT_CHECKS + 1)))
    assert (len(alive.calls), listing.calls) == (DIRECT_CHECKS, 3)


def test_the_common_result_is_one_shared_object() -> None:
    classifier = ProcessClassifier(Alive({5, 6}))
    first, second = tick(classifier, (5, 0), (6, 0))
    assert first is second  # the monitor reuses an unchanged insight by identity


@given(
    containers=st.lists(st.lists(st.integers(-3, 40), max_size=50), max_size=8),
    live=st.sets(st.integers(1, 40)),
    direct=st.integers(0, 20),
)
def test_classification_is_exact_whichever_way_liveness_is_asked(
    containers: list[list[int]], live: set[int], direct: int
) -> None:
    alive = Alive(live)
    classifier = ProcessClassifier(alive, Listing(live), direct_checks=direct)
    results = tick(classifier, *map(tuple, containers))
    assert len(alive.calls) <= direct
    for slots, counts in zip(containers, results, strict=True):
        exited = [p for p in slots if p != 0 and p not in live]
        assert counts.unknown == slots.count(0)
        assert counts.exited == len(exited)
        assert counts.exited_host_pids == frozenset(exited)
        assert counts.running + counts.exited + counts.unknown == len(slots)


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
