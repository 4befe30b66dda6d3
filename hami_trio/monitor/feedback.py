"""Observe: HAMi's priority feedback as a pure function.

Every tick the monitor hands :func:`observe` one snapshot per container and applies the
writes it returns.  The decisions are HAMi's own (``cmd/vGPUmonitor/feedback.go``):

1. *Activity.*  A container with ``recent_kernel > 0`` launched a kernel recently (HAMi-core
   sets 2 on each launch).  Decrement it; if it is still > 0, the container is *active* and
   its ``priority`` is counted once on every valid UUID slot (first byte not NUL) it lists.
   Negative priorities are never counted.
2. *Blocking.*  A container is blocked (``recent_kernel = -1``; HAMi-core holds launches
   while it is negative) when an active container with a numerically lower priority (more
   important) shares any of its UUIDs; otherwise a blocked one is released
   (``recent_kernel = 0``).
3. *Utilisation switch.*  ``utilization_switch = 1`` (HAMi-core enforces the SM limit) when
   it is blocked or when more than one activity of its own priority is counted on any of its
   UUIDs (another task of the same priority), else 0.

Where we differ from upstream, on purpose:

- Memory is bounded by the input.  Upstream grows a list per UUID to ``priority + 1``
  entries, so a tenant writing ``priority = 2147483647`` makes it allocate 16 GiB; here each
  UUID keeps a small count per priority actually seen.
- Only the final value of each word is written (upstream may first store the decremented
  ``recent_kernel`` and then ``-1``), and only when it differs from what was read.
- Output order is the input order, so the same input always gives the same writes.

Every UUID slot is considered (16 of them), not only the first ``num``, exactly as upstream.
Nothing here does I/O; :mod:`hami_trio.monitor.loop` applies the writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from hami_trio.monitor.layout import ControlField

__all__ = ["Activity", "Observable", "Observed", "Write", "observe"]

K = TypeVar("K", bound=Hashable)


class Observable(Protocol):
    """What :func:`observe` reads from a container (a ``UsageSnapshot`` qualifies)."""

    @property
    def priority(self) -> int:
        """``CUDA_TASK_PRIORITY``; lower numbers are more important."""
        ...

    @property
    def recent_kernel(self) -> int:
        """HAMi-core's activity word (2 on launch, < 0 while blocked)."""
        ...

    @property
    def utilization_switch(self) -> int:
        """1 while HAMi-core enforces the SM limit."""
        ...

    @property
    def device_keys(self) -> Sequence[bytes]:
        """The raw 96-byte value of every valid UUID slot (first byte not NUL), in slot
        order; a duplicated slot counts twice, as upstream."""
        ...


@dataclass(frozen=True, slots=True)
class Observed:
    """A minimal :class:`Observable`, for tests, fuzzing and simulations."""

    priority: int
    recent_kernel: int
    utilization_switch: int
    device_keys: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class Write(Generic[K]):
    """Store ``value`` into ``field`` of the container ``key``."""

    key: K
    field: ControlField
    value: int


class Activity:
    """Which priorities are active on which device (HAMi's ``utSwitchOn``), bounded.

    ``counts[uuid][priority]`` is how many (container, UUID slot) pairs are active at that
    priority on that device; only positive counts are stored, so the size is bounded by the
    input, never by a priority value.
    """

    __slots__ = ("_best", "_counts")

    def __init__(self, counts: Mapping[bytes, Mapping[int, int]]) -> None:
        self._counts: dict[bytes, Counter[int]] = {
            key: Counter({p: n for p, n in per.items() if n > 0}) for key, per in counts.items()
        }
        self._counts = {key: per for key, per in self._counts.items() if per}
        self._best = {key: min(per) for key, per in self._counts.items()}

    @property
    def counts(self) -> Mapping[bytes, Mapping[int, int]]:
        """``uuid -> priority -> count`` (positive counts only)."""
        return self._counts

    def blocks(self, priority: int, keys: Iterable[bytes]) -> bool:
        """HAMi's ``CheckBlocking``: a more important (lower) priority is active on any of
        ``keys``."""
        best = self._best
        return any(key in best and best[key] < priority for key in keys)

    def crowds(self, priority: int, keys: Iterable[bytes]) -> bool:
        """HAMi's ``CheckPriority``: :meth:`blocks`, or more than one activity at exactly
        ``priority`` on any of ``keys``."""
        keys = [key for key in keys if key in self._counts]
        return self.blocks(priority, keys) or any(self._counts[key][priority] > 1 for key in keys)


def observe(containers: Mapping[K, Observable]) -> tuple[Write[K], ...]:
    """Decide this tick's control writes (see the module docstring).

    Args:
        containers: the loaded containers, in the order their writes should come out.

    Returns:
        The writes, at most two per container (``recent_kernel`` first), only for values that
        change.
    """
    counts: dict[bytes, Counter[int]] = {}
    decremented: dict[K, int] = {}
    for key, c in containers.items():
        recent = c.recent_kernel
        if recent > 0:
            recent -= 1
            if recent > 0 and c.priority >= 0:
                for raw in c.device_keys:
                    counts.setdefault(raw, Counter())[c.priority] += 1
        decremented[key] = recent
    activity = Activity(counts)

    writes: list[Write[K]] = []
    for key, c in containers.items():
        # Nothing active anywhere (a quiet node): nobody is blocked or crowded.
        blocked = bool(counts) and activity.blocks(c.priority, c.device_keys)
        recent = decremented[key]
        if blocked and recent >= 0:
            recent = -1
        elif not blocked and recent < 0:
            recent = 0
        if recent != c.recent_kernel:
            writes.append(Write(key, ControlField.RECENT_KERNEL, recent))
        switch = 1 if blocked or (counts and activity.crowds(c.priority, c.device_keys)) else 0
        if switch != c.utilization_switch:
            writes.append(Write(key, ControlField.UTILIZATION_SWITCH, switch))
    return tuple(writes)
