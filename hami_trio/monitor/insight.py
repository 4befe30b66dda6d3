"""Why a container behaves as it does: its processes' states and its feedback state (pure).

How this works: once per tick the monitor hands each loaded container's snapshot to
:class:`ProcessClassifier` and :class:`BlockTracker` and keeps one immutable
:class:`ContainerInsight` per container, which the collector and the debug view read.

A live slot is ``running`` (its host PID is alive in the host PID namespace), ``exited`` (a
host PID is set but no such process exists; it still counts in upstream's sums) or
``unknown`` (host PID 0).  Liveness is decided once per tick for every distinct host PID of
the node: up to :data:`DIRECT_CHECKS` through an injected ``alive`` callable, more through
one injected listing, so 1024 host PIDs cost set arithmetic, not 1024 system calls.
:class:`BlockTracker` turns "held by priority blocking after this tick" into ``blocks`` and
``blocked_seconds`` on a clock the caller passes in.  No I/O, no clock of its own:
docs/monitor.md (Processes and feedback state).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Generic, NamedTuple, TypeVar

from hami_trio.monitor.snapshot import DeviceUsage, UsageSnapshot

__all__ = [
    "DIRECT_CHECKS",
    "NEVER_BLOCKED",
    "BlockState",
    "BlockTracker",
    "ContainerInsight",
    "ProcessClassifier",
    "ProcessCounts",
    "ProcessState",
]

K = TypeVar("K", bound=Hashable)

#: Distinct host PIDs per tick up to which each is asked on its own (``kill(pid, 0)``, about
#: 1.5 us each); above it the live PIDs are listed once for the tick (``/proc``).
DIRECT_CHECKS = 256


class ProcessState(enum.StrEnum):
    """The ``state`` label of ``hami_trio_container_processes``."""

    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


class ProcessCounts(NamedTuple):
    """A container's live slots by state, and the host PIDs of the exited ones.

    (Immutable; a named tuple because the monitor builds one per container per tick.)
    """

    running: int = 0
    exited: int = 0
    unknown: int = 0
    exited_host_pids: frozenset[int] = frozenset()

    def by_state(self) -> tuple[tuple[ProcessState, int], ...]:
        """``(state, count)`` for every state, always all three, in a fixed order."""
        return (
            (ProcessState.RUNNING, self.running),
            (ProcessState.EXITED, self.exited),
            (ProcessState.UNKNOWN, self.unknown),
        )


_new_tuple = tuple.__new__  # a named tuple without its Python-level __new__


@functools.lru_cache(maxsize=1024)
def _no_exited(running: int, unknown: int) -> ProcessCounts:
    """The common result, one shared object per value (the monitor compares by identity)."""
    return ProcessCounts(running=running, unknown=unknown)


class ProcessClassifier:
    """Classifies live slots by their host PID; liveness is decided once per tick.

    :meth:`begin_tick` takes every container's host PIDs and decides which of them are dead:
    up to :data:`DIRECT_CHECKS` distinct PIDs are asked one by one (``alive``), more are
    looked up in one listing of the live PIDs (``live_pids``), so the work of a tick is
    bounded by the node's processes and the slots' count, never by what a tenant writes in
    them.  :meth:`classify` is then set arithmetic.

    Args:
        alive: whether a host PID names a live process in the host PID namespace; None when
            the agent is not in that namespace (nothing is ever ``exited`` then).
        live_pids: every live PID of the host PID namespace (None: always ask ``alive``).
        direct_checks: the most distinct PIDs asked one by one per tick.
    """

    def __init__(
        self,
        alive: Callable[[int], bool] | None,
        live_pids: Callable[[], AbstractSet[int]] | None = None,
        *,
        direct_checks: int = DIRECT_CHECKS,
    ) -> None:
        self._alive = alive
        self._live_pids = live_pids
        self._direct = direct_checks
        self._dead: frozenset[int] = frozenset()
        self._wanted: set[int] | None = None
        #: ``alive`` calls made since construction.
        self.checks = 0
        #: ``live_pids`` calls made since construction.
        self.listings = 0

    @property
    def checks_liveness(self) -> bool:
        """Whether exited processes can be told from running ones at all."""
        return self._alive is not None

    @property
    def dead(self) -> frozenset[int]:
        """This tick's dead host PIDs: the same object as last tick's when equal to it (so
        an unchanged slot list with an unchanged ``dead`` has unchanged counts)."""
        return self._dead

    def begin_tick(self, host_pids: Iterable[Sequence[int]], *, unchanged: bool = False) -> None:
        """Decide which host PIDs are dead for this tick.

        Args:
            host_pids: every container's slot host PIDs.
            unchanged: the caller knows they are the same as last tick's (the set of PIDs
                to check is reused; their liveness is decided anew).
        """
        dead: frozenset[int] = frozenset()
        alive = self._alive
        if alive is None:
            wanted: set[int] = set()
        elif unchanged and self._wanted is not None:
            wanted = self._wanted
        else:
            wanted = set().union(*host_pids)
            wanted.discard(0)
        self._wanted = wanted
        if alive is None or not wanted:
            pass
        elif len(wanted) <= self._direct or self._live_pids is None:
            self.checks += len(wanted)
            # 0 and negative numbers name process groups, never one process: never asked
            dead = frozenset([pid for pid in wanted if not (pid > 0 and alive(pid))])
        else:
            self.listings += 1
            dead = frozenset(wanted.difference(self._live_pids()))
        if dead != self._dead:
            self._dead = dead

    def classify(self, host_pids: Sequence[int]) -> ProcessCounts:
        """Count ``host_pids`` (one per live slot) by state (see :meth:`begin_tick`)."""
        unknown = host_pids.count(0)
        dead = self._dead
        if not dead or dead.isdisjoint(host_pids):
            return _no_exited(len(host_pids) - unknown, unknown)
        # Counted per slot (two slots may name one PID), collected as a set; both in C.
        exited = sum(map(dead.__contains__, host_pids))
        return _new_tuple(
            ProcessCounts,
            (len(host_pids) - unknown - exited, exited, unknown, dead.intersection(host_pids)),
        )


class BlockState(NamedTuple):
    """One container's priority-blocking counters as of the latest tick.

    ``since`` is the monotonic time of the tick that saw the current episode begin (None
    while not blocked); ``seconds`` sums the time between ticks that found it blocked.
    """

    blocked: bool = False
    since: float | None = None
    seconds: float = 0.0
    blocks: int = 0


class BlockTracker(Generic[K]):
    """Counts priority-blocking episodes and their duration per container, tick by tick.

    A tick is :meth:`begin`, one :meth:`step` per container, :meth:`finish` (or
    :meth:`update` for all three).  Containers not stepped in a tick are forgotten (their
    counters start from 0 if they come back, which Prometheus reads as a counter reset).
    """

    def __init__(self) -> None:
        self._states: dict[K, BlockState] = {}
        self._next: dict[K, BlockState] = {}
        self._last: float | None = None
        self._elapsed = 0.0
        self._now = 0.0

    def begin(self, now: float) -> None:
        """Start a tick at monotonic time ``now`` (never decreasing between ticks)."""
        self._elapsed = 0.0 if self._last is None else max(now - self._last, 0.0)
        self._now = now
        self._next = {}

    def step(self, key: K, blocked: bool) -> BlockState:
        """Record whether ``key`` is blocked after this tick; its new state."""
        last = self._states.get(key)
        if last is None:
            if not blocked:
                return _NEVER_BLOCKED  # never blocked: nothing to carry (the usual case)
            last = _NEVER_BLOCKED
        if last.blocked:
            seconds = last.seconds + self._elapsed
            state = (
                BlockState(True, last.since, seconds, last.blocks)
                if blocked
                else BlockState(False, None, seconds, last.blocks)
            )
        elif blocked:
            state = BlockState(True, self._now, last.seconds, last.blocks + 1)
        else:
            state = last  # not blocked before or now: nothing changes
        self._next[key] = state
        return state

    def states(self) -> Mapping[K, BlockState]:
        """The counters of every container blocked at least once, as of the latest finished
        tick (never changed afterwards: the next tick builds a new mapping); any other
        container's are :data:`NEVER_BLOCKED`."""
        return self._states

    def finish(self) -> None:
        """End the tick: containers not stepped are forgotten.  A tick that never finishes
        (abandoned) changes nothing: the next one counts from the last finished tick."""
        self._states, self._next = self._next, {}
        self._last = self._now

    def update(self, now: float, blocked: Iterable[tuple[K, bool]]) -> Mapping[K, BlockState]:
        """A whole tick: :meth:`begin`, :meth:`step` for each ``(container, blocked)``,
        :meth:`finish`; returns every container's new state."""
        self.begin(now)
        states = {key: self.step(key, is_blocked) for key, is_blocked in blocked}
        self.finish()
        return states


_NEVER_BLOCKED = NEVER_BLOCKED = BlockState()


class ContainerInsight(NamedTuple):
    """What the monitor knows about one container beyond its snapshot, as of the latest tick.

    Immutable (a named tuple: one is built per changed container per tick).

    Attributes:
        snapshot: the snapshot of the tick (priority, limits, per-device counts come from it).
        processes: live slots by state.
        utilization_switch: the word in effect after the tick: what the monitor wrote this
            tick, else what it read (what it last wrote, unless HAMi-core changed it).
        recent_kernel: the same for ``recent_kernel`` (< 0: blocked).
        block: the priority-blocking counters.
        devices: the per-device sums without the exited slots when
            ``--exclude-exited-processes`` is on and the container has exited slots, else
            None (the snapshot's sums apply).
    """

    snapshot: UsageSnapshot
    processes: ProcessCounts
    utilization_switch: int
    recent_kernel: int
    block: BlockState
    devices: tuple[DeviceUsage, ...] | None = None

    @property
    def priority(self) -> int:
        """``CUDA_TASK_PRIORITY`` as read from the region."""
        return self.snapshot.priority

    @property
    def core_limits(self) -> tuple[int, ...]:
        """``sm_limit`` per device (percent), by device index."""
        return tuple([device.sm_limit for device in self.snapshot.devices])

    @property
    def device_processes(self) -> tuple[int, ...]:
        """Live slots using each device, by device index."""
        return self.snapshot.device_processes
