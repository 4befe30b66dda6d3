"""hami_trio._trio: exception groups, the start recorder, the fd limit, serving under signals."""

from __future__ import annotations

import gc
import os
import resource
import signal
import subprocess
import sys
import textwrap
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from hami_trio._trio import (
    UNLIMITED_FD_TARGET,
    YOUNG_GC_THRESHOLD,
    StartRecorder,
    leaf_errors,
    raise_fd_limit,
    raise_young_gc_threshold,
    serve_under_signals,
    signal_name,
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


# -- serve_under_signals: real signals sent to this process (or a child) ------------------------


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


class _Server:
    """A served task that records what happens to it; its drain never finishes on its own
    unless ``drain_returns``."""

    def __init__(self, *, start_delay: float = 0.0, drain_returns: bool = False) -> None:
        self.start_delay = start_delay
        self.drain_returns = drain_returns
        self.events: list[str] = []
        self.draining = trio.Event()
        self.cancelled = False

    def drain(self, handle: str) -> None:
        self.events.append(f"drain {handle}")
        self.draining.set()

    async def serve(self, *, task_status: trio.TaskStatus[str]) -> None:
        await trio.sleep(self.start_delay)
        self.events.append("started")
        task_status.started("handle")
        try:
            await self.draining.wait()
            if not self.drain_returns:
                await trio.sleep_forever()  # an exchange that never finishes
        except trio.Cancelled:
            self.cancelled = True
            raise
        self.events.append("returned")


async def _until(predicate: Any) -> None:
    with trio.fail_after(30):
        while not predicate():  # noqa: ASYNC110 - set by a signal handler or another task
            await trio.sleep(0.001)


@pytest.mark.usefixtures("restore_signals")
async def test_first_signal_drains_second_cancels(autojump_clock: MockClock) -> None:
    server = _Server()
    told: list[str] = []
    handles: list[str] = []

    async def main(*, task_status: trio.TaskStatus[None]) -> None:
        await serve_under_signals(
            server.serve,
            server.drain,
            first=lambda signum: told.append(f"first {signal_name(signum)}"),
            second=lambda signum: told.append(f"second {signal_name(signum)}"),
            task_status=_Recorder(handles, task_status),
        )
        told.append("returned")

    async with trio.open_nursery() as nursery:
        await nursery.start(main)
        assert handles == ["handle"]
        os.kill(os.getpid(), signal.SIGTERM)
        await _until(server.draining.is_set)
        await trio.sleep(3600)  # the drain waits, however long
        assert not server.cancelled
        os.kill(os.getpid(), signal.SIGINT)
    assert server.cancelled
    assert told == ["first SIGTERM", "second SIGINT", "returned"]  # returns normally
    assert server.events == ["started", "drain handle"]


@pytest.mark.usefixtures("restore_signals")
async def test_a_signal_during_start_up_drains_once_started(autojump_clock: MockClock) -> None:
    server = _Server(start_delay=10, drain_returns=True)
    told: list[str] = []

    async def main() -> None:
        await serve_under_signals(server.serve, server.drain, first=lambda _: told.append("first"))

    async with trio.open_nursery() as nursery:
        default = signal.getsignal(signal.SIGTERM)
        nursery.start_soon(main)
        await _until(lambda: signal.getsignal(signal.SIGTERM) is not default)
        os.kill(os.getpid(), signal.SIGTERM)
        await _until(lambda: told)
        assert server.events == []  # told at once, drained only once started
    assert server.events == ["started", "drain handle", "returned"]
    assert trio.current_time() >= 10  # the start-up was not cut short


@pytest.mark.usefixtures("restore_signals")
async def test_without_second_cancels_later_signals_are_ignored(
    autojump_clock: MockClock,
) -> None:
    server = _Server()
    told: list[int] = []

    async def main() -> None:
        await serve_under_signals(
            server.serve, server.drain, second=told.append, second_cancels=False
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(main)
        await _until(lambda: server.events)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), signum)
            await trio.sleep(1)
        assert not server.cancelled  # still serving: no signal cancelled it, none killed us
        assert told == [signal.SIGINT, signal.SIGTERM]
        nursery.cancel_scope.cancel()


@pytest.mark.usefixtures("restore_signals")
async def test_the_listed_errors_come_out_as_themselves() -> None:
    async def fails_at_start(*, task_status: trio.TaskStatus[str]) -> None:
        raise KeyError("before")

    async def fails_later(*, task_status: trio.TaskStatus[str]) -> None:
        task_status.started("handle")
        await trio.lowlevel.checkpoint()
        raise KeyError("after")

    for serve, text in ((fails_at_start, "before"), (fails_later, "after")):
        with pytest.raises(KeyError, match=text):
            await serve_under_signals(serve, lambda _: None, errors=KeyError)
    # Not listed: inside the nursery's exception group, as trio raises it.
    with pytest.raises(ExceptionGroup) as caught:
        await serve_under_signals(fails_later, lambda _: None, errors=ValueError)
    assert isinstance(sole_error(caught.value), KeyError)


def test_a_child_process_drains_on_sigterm_and_exits_cleanly() -> None:
    code = textwrap.dedent(
        """
        import sys, trio
        from hami_trio._trio import serve_under_signals

        async def serve(*, task_status):
            stop = trio.Event()
            task_status.started(stop)
            print("ready", flush=True)
            await stop.wait()
            print("drained", flush=True)

        trio.run(serve_under_signals, serve, trio.Event.set)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (0, "drained\n", "")


class _Recorder:
    def __init__(self, values: list[str], inner: trio.TaskStatus[None]) -> None:
        self.values = values
        self.inner = inner

    def started(self, value: str) -> None:
        self.values.append(value)
        self.inner.started()
