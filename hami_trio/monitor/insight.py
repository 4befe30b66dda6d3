"""Why a container behaves as it does: its processes' states and its feedback state (pure).

How this works: once per tick the monitor hands each loaded container's snapshot to
:class:`ProcessClassifier` and :class:`BlockTracker` and keeps one immutable
:class:`ContainerInsight` per container, which the collector and the debug view read.

- **Processes**: every live slot is ``running`` (its host PID is alive in the host PID
  namespace), ``exited`` (a host PID is set but no such process exists: the slot still counts
  in upstream's sums) or ``unknown`` (host PID 0: HAMi-core never learned it).  Whether a PID
  is alive is asked through an injected ``alive`` callable, at most once per PID per tick
  (shared by every container) and for at most :data:`CHECKS_PER_CONTAINER` PIDs of one
  container per tick: the rest keep their result from an earlier tick (a rotating window,
  so a tenant with 1024 distinct host PIDs is fully re-checked every 16 ticks) or, never
  checked yet, count as ``running``.  Without the host PID namespace there is no ``alive``:
  every set host PID counts as ``running``.
- **Blocking**: :class:`BlockTracker` turns "was this container held by priority blocking
  after this tick" into counters - how often it started (``blocks``) and for how long it
  lasted (``blocked_seconds``, on a monotonic clock the caller passes in, summed tick to
  tick).

No I/O, no clock: the monitor passes the time and the liveness check.  docs/monitor.md
(Processes and feedback state).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from hami_trio.monitor.snapshot import DeviceUsage

__all__ = [
    "CHECKS_PER_CONTAINER",
    "BlockState",
    "BlockTracker",
    "ContainerInsight",
    "ProcessClassifier",
    "ProcessCounts",
    "ProcessState",
]

K = TypeVar("K", bound=Hashable)

#: The most PIDs of one container whose liveness is asked per tick (see the module docstring).
CHECKS_PER_CONTAINER = 64


class ProcessState(enum.StrEnum):
    """The ``state`` label of ``hami_trio_container_processes``."""

    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ProcessCounts:
    """A container's live slots by state, and the host PIDs of the exited ones."""

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


class ProcessClassifier:
    """Classifies live slots by their host PID, with bounded liveness checks per tick.

    Args:
        alive: whether a host PID names a live process in the host PID namespace; None when
            the agent is not in that namespace (nothing is ever ``exited`` then).
        checks_per_container: the per-container budget of ``alive`` calls per tick.
    """

    def __init__(
        self,
        alive: Callable[[int], bool] | None,
        *,
        checks_per_container: int = CHECKS_PER_CONTAINER,
    ) -> None:
        if checks_per_container < 1:
            raise ValueError(f"checks_per_container must be >= 1, got {checks_per_container}")
        self._alive = alive
        self._budget = checks_per_container
        self._now: dict[int, bool] = {}  # asked this tick
        self._before: dict[int, bool] = {}  # what earlier ticks learned (PIDs still in use)
        self._seen: set[int] = set()  # PIDs in use this tick
        self._ticks = 0
        #: ``alive`` calls made since construction (what the budget bounds).
        self.checks = 0

    @property
    def checks_liveness(self) -> bool:
        """Whether exited processes can be told from running ones at all."""
        return self._alive is not None

    def begin_tick(self) -> None:
        """Start a tick: results of the last one become "earlier" (only PIDs it saw)."""
        before = {pid: alive for pid, alive in self._before.items() if pid in self._seen}
        before.update(self._now)
        self._before = before
        self._now = {}
        self._seen = set()
        self._ticks += 1

    def classify(self, host_pids: Sequence[int]) -> ProcessCounts:
        """Count ``host_pids`` (one per live slot) by state (see the module docstring)."""
        unknown = 0
        known: list[int] = []
        for pid in host_pids:
            if pid == 0:
                unknown += 1
            else:
                known.append(pid)
        alive = self._alive
        if alive is None or not known:
            return ProcessCounts(running=len(known), unknown=unknown)
        self._seen.update(known)
        results = self._results(alive, known)
        exited = [pid for pid in known if not results.get(pid, True)]
        return ProcessCounts(
            running=len(known) - len(exited),
            exited=len(exited),
            unknown=unknown,
            exited_host_pids=frozenset(exited),
        )

    def _results(self, alive: Callable[[int], bool], known: list[int]) -> dict[int, bool]:
        now, before = self._now, self._before
        distinct = list(dict.fromkeys(known))
        # Rotate where the budget starts, so every PID is asked within a few ticks.
        start = (self._ticks * self._budget) % len(distinct)
        left = self._budget
        results: dict[int, bool] = {}
        for pid in distinct[start:] + distinct[:start]:
            if pid in now:
                results[pid] = now[pid]
            elif left > 0:
                left -= 1
                self.checks += 1
                results[pid] = now[pid] = pid > 0 and alive(pid)
            elif pid in before:
                results[pid] = before[pid]
        return results


@dataclass(frozen=True, slots=True)
class BlockState:
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

    Containers not in the latest :meth:`update` are forgotten (their counters start from 0
    if they come back, which Prometheus reads as a counter reset).
    """

    def __init__(self) -> None:
        self._states: dict[K, BlockState] = {}
        self._last: float | None = None

    def update(self, now: float, blocked: Iterable[tuple[K, bool]]) -> Mapping[K, BlockState]:
        """Record this tick: for each container, whether it is blocked after the tick.

        Args:
            now: monotonic seconds (never decreasing between calls).
            blocked: ``(container, blocked)`` for every container of this tick.

        Returns:
            The new state of every container given (a fresh dict).
        """
        elapsed = 0.0 if self._last is None else max(now - self._last, 0.0)
        self._last = now
        previous, states = self._states, {}
        unchanged = BlockState()
        for key, is_blocked in blocked:
            last = previous.get(key, unchanged)
            seconds = last.seconds + (elapsed if last.blocked else 0.0)
            if is_blocked == last.blocked and seconds == last.seconds:
                states[key] = last
            elif is_blocked:
                since = last.since if last.blocked else now
                blocks = last.blocks if last.blocked else last.blocks + 1
                states[key] = BlockState(True, since, seconds, blocks)
            else:
                states[key] = BlockState(False, None, seconds, last.blocks)
        self._states = states
        return states


@dataclass(frozen=True, slots=True)
class ContainerInsight:
    """What the monitor knows about one container beyond its snapshot, as of the latest tick.

    Attributes:
        processes: live slots by state.
        priority: ``CUDA_TASK_PRIORITY`` as read from the region.
        utilization_switch: the word in effect after the tick: what the monitor wrote this
            tick, else what it read (what it last wrote, unless HAMi-core changed it).
        recent_kernel: the same for ``recent_kernel`` (< 0: blocked).
        block: the priority-blocking counters.
        core_limits: ``sm_limit`` per device (percent), by device index.
        device_processes: live slots using each device, by device index.
        devices: the per-device sums without the exited slots when
            ``--exclude-exited-processes`` is on and the container has exited slots, else
            None (the snapshot's sums apply).
    """

    processes: ProcessCounts
    priority: int
    utilization_switch: int
    recent_kernel: int
    block: BlockState
    core_limits: tuple[int, ...]
    device_processes: tuple[int, ...]
    devices: tuple[DeviceUsage, ...] | None = None
