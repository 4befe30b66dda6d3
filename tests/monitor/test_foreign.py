"""The foreign-writer detector: what HAMi-core and this monitor write never fires it; another
monitor's decrements, blocks and releases do, after a few ticks, and it clears when they stop."""

from __future__ import annotations

import pytest

from hami_trio.monitor.feedback import Observed, Write, observe
from hami_trio.monitor.foreign import CLEAR_TICKS, FIRE_TICKS, WINDOW, ForeignWriterDetector
from hami_trio.monitor.layout import ControlField

RK, SW = ControlField.RECENT_KERNEL, ControlField.UTILIZATION_SWITCH
GPU = [b"GPU-0"]


def words(recent: int, switch: int, priority: int = 1) -> Observed:
    return Observed(
        priority=priority, recent_kernel=recent, utilization_switch=switch, device_keys=GPU
    )


def test_the_documented_constants() -> None:
    assert (WINDOW, FIRE_TICKS, CLEAR_TICKS) == (6, 2, 12)


def test_what_this_monitor_left_is_explained() -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    for _ in range(20):
        c = {"a": words(2, 0)}
        assert d.check(c) == ()
        d.record(c, [Write("a", RK, 1)])
        c = {"a": words(1, 0)}
        assert d.check(c) == ()
        d.record(c, [Write("a", RK, 0), Write("a", SW, 1)])
        assert d.check({"a": words(0, 1)}) == ()
        d.record({"a": words(0, 1)}, [Write("a", SW, 0)])
    assert not d.active


@pytest.mark.parametrize(
    ("left", "found"),
    [
        ((1, 0), (2, 0)),  # a kernel launch
        ((-1, 1), (2, 1)),  # a launch right after a release raced the block
        ((0, 0), (2, 1)),  # HAMi-core (re)initialised the region
        ((-1, 0), (2, 1)),
    ],
)
def test_what_hami_core_writes_is_explained(left: tuple[int, int], found: tuple[int, int]) -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    for _ in range(WINDOW * 2):
        d.record({"a": words(*left)}, [])
        assert d.check({"a": words(*found)}) == ()
    assert not d.active


def test_a_second_monitors_decrement_fires_after_two_ticks_and_names_the_word() -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    d.record({"a": words(2, 0)}, [Write("a", RK, 1)])
    seen = d.check({"a": words(0, 0)})  # somebody decremented 1 -> 0 between our ticks
    assert [(u.key, u.field, u.left, u.found) for u in seen] == [("a", RK, 1, 0)]
    assert not d.active  # one odd tick proves little
    d.record({"a": words(2, 0)}, [Write("a", RK, 1)])
    d.check({"a": words(0, 0)})
    assert d.active
    assert d.last_seen[0].found == 0


def test_a_foreign_block_and_switch_are_seen() -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    d.record({"a": words(0, 0)}, [])
    seen = d.check({"a": words(-1, 1)})
    assert {(u.field, u.left, u.found) for u in seen} == {(RK, 0, -1), (SW, 0, 1)}


def test_isolated_odd_ticks_further_apart_than_the_window_never_fire() -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    for tick in range(WINDOW * 5):
        d.record({"a": words(1, 0)}, [])
        odd = tick % WINDOW == 0
        d.check({"a": words(0 if odd else 1, 0)})
        assert not d.active


def test_it_clears_after_quiet_ticks_and_a_new_container_is_not_judged() -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    for _ in range(FIRE_TICKS):
        d.record({"a": words(1, 0)}, [])
        d.check({"a": words(0, 0)})
    assert d.active
    for n in range(1, CLEAR_TICKS + 1):
        d.record({"a": words(1, 0)}, [])
        d.check({"a": words(1, 0), "new": words(-5, 7)})
        assert d.active == (n < CLEAR_TICKS)


def test_forget_drops_every_expectation() -> None:
    d: ForeignWriterDetector[str] = ForeignWriterDetector()
    d.record({"a": words(1, 0)}, [])
    d.forget()
    assert d.check({"a": words(-1, 1)}) == ()


def test_two_monitors_running_upstreams_rules_are_told_apart_from_one() -> None:
    """Alternate our Observe with a second one on the same words while the workload launches
    kernels every other tick: alone, nothing fires; with the second monitor, it fires."""

    def run(second: bool) -> bool:
        d: ForeignWriterDetector[str] = ForeignWriterDetector()
        state = {"hi": words(2, 0, priority=0), "lo": words(2, 0, priority=1)}
        for tick in range(12):
            if tick % 2 == 0:  # both workloads launch
                state = {k: words(2, c.utilization_switch, c.priority) for k, c in state.items()}
            d.check(state)
            applied = observe(state)
            d.record(state, applied)
            state = _apply(state, applied)
            if second:
                state = _apply(state, observe(state))
        return d.active

    assert not run(second=False)
    assert run(second=True)


def _apply(state: dict[str, Observed], writes: tuple[Write[str], ...]) -> dict[str, Observed]:
    out = dict(state)
    for w in writes:
        c = out[w.key]
        if w.field is RK:
            out[w.key] = words(w.value, c.utilization_switch, c.priority)
        else:
            out[w.key] = words(c.recent_kernel, w.value, c.priority)
    return out
