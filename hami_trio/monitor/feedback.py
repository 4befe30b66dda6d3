"""Observe: HAMi's priority feedback as a pure function.

How this works: every tick the monitor hands :func:`observe` one snapshot per container and
applies the writes it returns.  The decisions are HAMi's own: a container whose
``recent_kernel`` is still > 0 after the decrement is active and counts its priority on each
of its UUIDs; one outranked on a shared UUID by an active one is blocked (``recent_kernel =
-1``) and released (0) when it no longer is; ``utilization_switch`` is 1 when blocked or when
its own priority is counted twice on a UUID.  Unlike upstream, memory is bounded by the
input, only final changed values are written, and the output order is the input order.

A :class:`Grant` per container (its pod's allocation entry and spec priority) can be an input
too: the region is then read through :func:`scoped`.  A container without a grant, or whose
grant agrees with its file, is read as upstream reads it.  No I/O here.  The rules:
docs/monitor.md (Feedback).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from hami_trio.monitor.layout import ControlField

__all__ = ["Activity", "Grant", "Observable", "Observed", "Write", "observe", "scoped", "strays"]

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
class Grant:
    """What a container's pod gives it, for the feedback (the agent reads it from Kubernetes).

    Attributes:
        devices: the 96-byte slot values of the UUIDs its allocation entry lists, in vdevice
            order (a UUID as HAMi-core writes it: UTF-8, NUL-padded); None: not known (every
            UUID of the file counts, as upstream).
        priority: the ``CUDA_TASK_PRIORITY`` its pod spec sets; None: the spec does not say
            (the file's counts, as upstream).
    """

    devices: tuple[bytes, ...] | None = None
    priority: int | None = None
    allowed: frozenset[bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", frozenset(self.devices or ()))


def strays(container: Observable, grant: Grant | None) -> tuple[bytes, ...]:
    """The UUID slot values ``container`` claims that ``grant`` does not list (each once, in
    slot order); () without a grant or without devices in it."""
    if grant is None or grant.devices is None:
        return ()
    keys = container.device_keys
    allowed = grant.allowed
    if allowed.issuperset(keys):
        return ()
    return tuple(dict.fromkeys(key for key in keys if key not in allowed))


def scoped(container: Observable, grant: Grant | None) -> Observable:
    """``container`` as the feedback counts it under ``grant``.

    The grant's priority replaces the file's; the file's UUID slots count while every one of
    them is allocated (a subset is a container using fewer of its devices), else - the file
    claims a GPU the pod was not given - the allocated UUIDs count instead, each once.  The
    container itself is returned when the grant changes nothing (no grant, or an honest file).
    """
    if grant is None:
        return container
    keys = container.device_keys
    if grant.devices is not None and not grant.allowed.issuperset(keys):
        keys = tuple(dict.fromkeys(grant.devices))
    priority = container.priority if grant.priority is None else grant.priority
    if keys is container.device_keys and priority == container.priority:
        return container
    return Observed(priority, container.recent_kernel, container.utilization_switch, keys)


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
        kept = {key: {p: n for p, n in per.items() if n > 0} for key, per in counts.items()}
        self._counts: dict[bytes, dict[int, int]] = {key: per for key, per in kept.items() if per}
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
        counts = self._counts
        return self.blocks(priority, keys) or any(counts[key].get(priority, 0) > 1 for key in keys)


# Writes are built through their slot descriptors (a churning node writes one per container
# per tick); the same fields, in the same order, as Write(key, field, value).
_new_write = object.__new__
_set_key = Write.__dict__["key"].__set__
_set_field = Write.__dict__["field"].__set__
_set_value = Write.__dict__["value"].__set__


def _write(key: K, field: ControlField, value: int) -> Write[K]:
    write: Write[K] = _new_write(Write)
    _set_key(write, key)
    _set_field(write, field)
    _set_value(write, value)
    return write


_RECENT_KERNEL = ControlField.RECENT_KERNEL
_UTILIZATION_SWITCH = ControlField.UTILIZATION_SWITCH


def observe(
    containers: Mapping[K, Observable], grants: Mapping[K, Grant] | None = None
) -> tuple[Write[K], ...]:
    """Decide this tick's control writes (see the module docstring).

    Args:
        containers: the loaded containers, in the order their writes should come out.
        grants: what each container's pod gives it (:func:`scoped`); a container without
            one, or every container when None, counts as its file says.

    Returns:
        The writes, at most two per container (``recent_kernel`` first), only for values that
        change.
    """
    if grants:
        get_grant = grants.get
        containers = {key: scoped(c, get_grant(key)) for key, c in containers.items()}
    best, crowded = _active(containers)
    if not best:
        return _quiet_writes(containers)
    return _tick_writes(containers, best, crowded)


def _active(containers: Mapping[K, Observable]) -> tuple[dict[bytes, int], set[bytes]]:
    """Per UUID the most important active priority, and the UUIDs where it is crowded."""
    # Per UUID only what the decisions need: the most important active priority and whether
    # more than one (container, slot) pair is active at it.  A container is blocked when a
    # lower priority than its own is active on one of its UUIDs, and crowded when its own
    # priority is the most important one there and counted twice (a higher count at its
    # priority with a lower one active would block it anyway).  No object per container.
    best: dict[bytes, int] = {}
    crowded: set[bytes] = set()
    for c in containers.values():
        if c.recent_kernel > 1:  # still > 0 after this tick's decrement: active
            priority = c.priority
            if priority >= 0:
                for raw in c.device_keys:
                    top = best.get(raw)
                    if top is None or priority < top:
                        best[raw] = priority
                        crowded.discard(raw)
                    elif priority == top:
                        crowded.add(raw)
    return best, crowded


def _quiet_writes(containers: Mapping[K, Observable]) -> tuple[Write[K], ...]:
    """Nothing active anywhere (a quiet node): nobody is blocked or crowded."""
    writes: list[Write[K]] = []
    append = writes.append
    for key, c in containers.items():
        recent = c.recent_kernel
        if recent != 0:
            append(_write(key, _RECENT_KERNEL, recent - 1 if recent > 0 else 0))
        if c.utilization_switch != 0:
            append(_write(key, _UTILIZATION_SWITCH, 0))
    return tuple(writes)


def _tick_writes(
    containers: Mapping[K, Observable], best: Mapping[bytes, int], crowded: set[bytes]
) -> tuple[Write[K], ...]:
    """The writes of a tick where something is active (``best`` and ``crowded``:
    :func:`_active`)."""
    writes: list[Write[K]] = []
    append = writes.append
    get = best.get
    for key, c in containers.items():
        priority = c.priority
        blocked = crowd = False
        for raw in c.device_keys:
            top = get(raw)
            if top is not None:
                if top < priority:
                    blocked = True
                    break
                if top == priority and raw in crowded:
                    crowd = True
        current = c.recent_kernel
        recent = current - 1 if current > 0 else current
        if blocked:
            if recent >= 0:
                recent = -1
        elif recent < 0:
            recent = 0
        if recent != current:
            append(_write(key, _RECENT_KERNEL, recent))
        switch = 1 if blocked or crowd else 0
        if switch != c.utilization_switch:
            append(_write(key, _UTILIZATION_SWITCH, switch))
    return tuple(writes)
