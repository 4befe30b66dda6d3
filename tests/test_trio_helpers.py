"""hami_trio._trio: exception groups, the start recorder, the fd limit, the signal relay."""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from hami_trio._trio import (
    UNLIMITED_FD_TARGET,
    YOUNG_GC_THRESHOLD,
    StartRecorder,
    leaf_errors,
    raise_fd_limit,
    raise_young_gc_threshold,
    relay_signals,
    sole_error,
)


@pytest.fixture
def fd_limit() -> Iterator[tuple[int, int]]:
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield saved
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_fd_limit_goes_up_to_the_hard_limit(fd_limit: tuple[int, int]) -> None:
    hard = fd_limit[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    expected = UNLIMITED_FD_TARGET if hard == resource.RLIM_INFINITY else hard
    assert raise_fd_limit(10) == expected  # the caller's own need does not cap it
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)
    assert raise_fd_limit() == expected  # a second caller: nothing to do


def test_fd_limit_never_exceeds_a_finite_hard_limit() -> None:
    code = (
        "import resource; from hami_trio._trio import raise_fd_limit; "
        "print(raise_fd_limit(4096), resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    argv = ["prlimit", "--nofile=40:64", sys.executable, "-c", code]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["64", "(64,", "64)"]
    assert "cannot raise" not in out.stderr


def test_leaf_errors_walks_nested_groups_in_order() -> None:
    a, b, c = ValueError("a"), KeyError("b"), OSError("c")
    group = BaseExceptionGroup("outer", [a, ExceptionGroup("inner", [b, c])])
    assert leaf_errors(group) == [a, b, c]


def test_sole_error_only_when_there_is_exactly_one() -> None:
    only = RuntimeError("only")
    assert sole_error(ExceptionGroup("g", [ExceptionGroup("h", [only])])) is only
    assert sole_error(ExceptionGroup("g", [ValueError(), ValueError()])) is None


class _Status:
    def __init__(self) -> None:
        self.values: list[Any] = []

    def started(self, value: Any = None) -> None:
        self.values.append(value)


def test_start_recorder_remembers_and_passes_the_value_on() -> None:
    inner = _Status()
    recorder = StartRecorder(inner)
    assert not recorder.done
    recorder.started(42)
    assert recorder.done
    assert inner.values == [42]


async def _signals(*signums: int) -> AsyncIterator[int]:
    for signum in signums:
        yield signum


async def test_relay_calls_first_then_second_and_stops() -> None:
    first: list[int] = []
    second: list[int] = []
    signals = _signals(15, 2, 2)
    await relay_signals(signals, first.append, second.append)
    assert (first, second) == ([15], [2])
    assert [s async for s in signals] == [2]  # left for whoever reads next


async def test_relay_without_second_receives_and_ignores_the_rest() -> None:
    first: list[int] = []
    signals = _signals(2, 15, 2)
    await relay_signals(signals, first.append)
    assert first == [2]
    assert [s async for s in signals] == []  # all received, none acted on


def test_young_gc_threshold_goes_up_and_never_down() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        raise_young_gc_threshold()
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 7, 9)  # only the youngest
        gc.set_threshold(YOUNG_GC_THRESHOLD * 3, 10, 10)
        raise_young_gc_threshold()
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD * 3, 10, 10)
        # cycles are still collected: a cycle made now is gone after enough allocations
        raise_young_gc_threshold()

        class Node:
            other: object = None

        gone: list[str] = []
        gc.collect()  # the count starts at 0: the cycle is young when the first collection runs
        a, b = Node(), Node()
        a.other, b.other = b, a
        weakref.finalize(a, gone.append, "a")
        del a, b
        junk: list[list[int]] = [[] for _ in range(4 * YOUNG_GC_THRESHOLD)]
        assert gone == ["a"]
        del junk
    finally:
        gc.set_threshold(*saved)
