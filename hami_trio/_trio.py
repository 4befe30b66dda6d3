"""trio and process helpers shared by the long-running commands and the agent.

How this works: a long-running command builds its configuration, configures logging, calls
:func:`freeze_startup_objects` once its imports are done, and runs its trio main function
under :func:`serve_under_signals`: the first SIGTERM or SIGINT asks for a graceful stop, a
second one cancels whatever is still in flight (the demo, whose first signal already cancels
its run, ignores the later ones).  Every command stops on the same signals through the same
helper, so an operator's Ctrl-C behaves the same everywhere.
"""

from __future__ import annotations

import gc
import logging
import resource
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

__all__ = [
    "STOP_SIGNALS",
    "StartRecorder",
    "freeze_startup_objects",
    "leaf_errors",
    "raise_fd_limit",
    "raise_young_gc_threshold",
    "serve_under_signals",
    "signal_name",
    "sole_error",
]

#: The signals a long-running command stops on (Kubernetes sends SIGTERM, a terminal SIGINT).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The soft descriptor limit aimed at when the hard limit is unlimited (Linux's default
#: ``fs.nr_open``, the most ``setrlimit`` accepts there).
UNLIMITED_FD_TARGET = 1 << 20

logger = logging.getLogger(__name__)
_fd_limit_refusal_logged = False
_Handle = TypeVar("_Handle")


def freeze_startup_objects() -> None:
    """Move everything allocated so far out of the cyclic garbage collector's reach.

    Call it once, after the imports and the configuration, before ``trio.run``.  Those
    objects live as long as the process; keeping them out of full collections shortens the
    pauses a flood of short-lived broker exchanges triggers (docs/benchmarks.md, Start-up and
    process helpers).
    """
    gc.freeze()


#: The youngest generation's collection threshold in the agent (CPython's default is 700).
YOUNG_GC_THRESHOLD = 50_000


def raise_young_gc_threshold() -> None:
    """Collect the youngest generation every :data:`YOUNG_GC_THRESHOLD` net allocations
    instead of every 700 (the older generations' thresholds stay as they are).

    A monitor tick at 1,000-2,000 busy containers holds some 25,000-50,000 new objects at
    once (the slots' tuples, snapshots, states, writes, insights) before last tick's are
    released by their reference counts; at 700 the collector ran dozens of times per tick
    and promoted whatever was alive at that moment, so the older generations, and the full
    collections, came round far more often than the garbage needed (10,000 was still too
    low at N=2000: docs/benchmarks.md, Monitor, round 2).  Cycles are still collected,
    only in larger batches: what that retains is bounded by the threshold (at most 50,000
    objects in reference cycles awaiting collection).
    """
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_GC_THRESHOLD, young), older, oldest)


def raise_fd_limit(needed: int = 0) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, once for every caller.

    The one policy of the process, as Go programs have at start-up (Python keeps the soft
    default, often 1024): the soft limit goes up to the hard limit, the most the operator
    allowed, which satisfies every caller whatever its count - the broker's
    ``max_exchanges`` plus a reserve, the monitor's one descriptor per container.  An
    unlimited hard limit means ``max(needed, UNLIMITED_FD_TARGET)``, and ``needed`` when
    that is refused.  The soft limit is never lowered; a refusal is logged once per
    process.  A caller that needs more than the result warns about its own consequences.

    Args:
        needed: the least this caller needs (0: no count of its own).

    Returns:
        The soft limit in force afterwards (``resource.RLIM_INFINITY`` when unlimited).
    """
    global _fd_limit_refusal_logged
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return soft
    unlimited = hard == resource.RLIM_INFINITY
    goals = [max(needed, UNLIMITED_FD_TARGET), needed] if unlimited else [hard]
    for goal in goals:
        if goal <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (goal, hard))
        except (OSError, ValueError) as exc:
            if not _fd_limit_refusal_logged:
                _fd_limit_refusal_logged = True
                logger.warning("cannot raise the open-file limit to %d: %s", goal, exc)
            continue
        return goal
    return soft


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15, and so on (the number itself if Python does not know it)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


async def serve_under_signals(  # noqa: C901 - its three nested tasks share one nursery
    serve: Callable[..., Awaitable[object]],
    drain: Callable[[_Handle], object],
    *,
    first: Callable[[int], object] | None = None,
    second: Callable[[int], object] | None = None,
    second_cancels: bool = True,
    errors: type[Exception] | tuple[type[Exception], ...] = (),
    task_status: trio.TaskStatus[_Handle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start ``serve`` and run it to its end under :data:`STOP_SIGNALS`: the first drains,
    the second cancels.

    Signals are caught from before ``serve`` starts, so none can kill the process half-way.
    The first signal calls ``first(signum)`` at once, then ``drain(handle)``: at once when
    ``serve`` has reported its handle, else as soon as it does (the start-up finishes first,
    so a signal means the same thing whenever it comes).  The next signal calls
    ``second(signum)`` and, with ``second_cancels``, cancels ``serve`` at once; without it,
    every later signal is received, told to ``second`` and otherwise ignored.  Either way
    this returns normally.

    Args:
        serve: trio's start protocol (``serve(task_status=...)``), reporting the handle
            ``drain`` receives; this returns when it returns.
        drain: starts a graceful stop of ``serve`` (it must return at once).
        first: told of the first signal (to log it), before ``drain``.
        second: told of the second signal (before the cancel) and, without
            ``second_cancels``, of each later one.
        second_cancels: whether the second signal cancels ``serve``.
        errors: what ``serve`` raises as itself, before or after its start, instead of
            inside an exception group.
        task_status: receives ``serve``'s handle once it is ready.

    Raises:
        Exception: an instance of ``errors`` that ``serve`` raised, as it is.
    """
    failure: Exception | None = None
    handle: list[_Handle] = []
    drain_requested = False

    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:

            def on_first(signum: int) -> None:
                nonlocal drain_requested
                if first is not None:
                    first(signum)
                drain_requested = True
                if handle:
                    drain(handle[0])

            async def relay() -> None:
                async for signum in signals:
                    on_first(signum)
                    break
                async for signum in signals:  # with second_cancels, only the second
                    if second is not None:
                        second(signum)
                    if second_cancels:
                        nursery.cancel_scope.cancel()
                        break

            async def run(*, task_status: trio.TaskStatus[_Handle]) -> None:
                nonlocal failure
                status = StartRecorder(task_status)
                try:
                    await serve(task_status=status)
                except errors as exc:
                    if not status.done:
                        raise  # nursery.start() below raises it as it is
                    failure = exc
                nursery.cancel_scope.cancel()  # the signal relay's job is over

            nursery.start_soon(relay)
            try:
                started: _Handle = await nursery.start(run)
            except errors as exc:
                failure = exc
                nursery.cancel_scope.cancel()
            else:
                handle.append(started)
                task_status.started(started)
                if drain_requested:
                    drain(started)
    if failure is not None:
        raise failure


class StartRecorder:
    """A ``task_status`` that remembers whether ``started()`` was called.

    Wrap the ``task_status`` a task received to tell, when it fails or returns, whether it
    had reported ready (a failure before ``started()`` is a start-up failure).
    """

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self._inner = inner
        self.done = False

    def started(self, value: Any = None) -> None:
        self.done = True
        self._inner.started(value)


def leaf_errors(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions inside ``group`` and its nested groups, depth first, in order."""
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(leaf_errors(exc))
        else:
            leaves.append(exc)
    return leaves


def sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one error out of a (nested) exception group, or None when there are several."""
    leaves = leaf_errors(group)
    return leaves[0] if len(leaves) == 1 else None
