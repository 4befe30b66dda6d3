"""The monitor's container values: one directory's key, status, rejection and state.

How this works: :class:`ContainerKey` is a container directory's name split on its first
``_`` (HAMi's rule, :func:`parse_container_dirname`); :class:`ContainerState` is what the
monitor knows of that directory as of a tick (:mod:`~hami_trio.monitor.lister`: a
:data:`TickState`) or a usage read (:mod:`~hami_trio.monitor.usage`), with its
:class:`ContainerStatus` and, for a refused file, its :class:`Rejection`.  Every value is
immutable and pure (no I/O, no clock), so the lister and the usage read make them, and the
collector (:mod:`hami_trio.metrics.collector`) and the debug document
(:mod:`hami_trio.agent.debug`) read them as they are, without restating their fields.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.snapshot import TickSnapshot, UsageSnapshot, _constructor

__all__ = [
    "ContainerKey",
    "ContainerState",
    "ContainerStatus",
    "Rejection",
    "TickState",
    "UsageState",
    "new_container_state",
    "parse_container_dirname",
]


class ContainerKey(NamedTuple):
    """A container directory ``{pod_uid}_{container_name}``, split on the first ``_``."""

    pod_uid: str
    container_name: str

    @property
    def dirname(self) -> str:
        """The directory name this key came from."""
        return f"{self.pod_uid}_{self.container_name}"


def parse_container_dirname(name: str) -> ContainerKey | None:
    """Split a container directory name on the first ``_``.

    Returns:
        The key, or None when there is no ``_`` or either part is empty (HAMi's rule).
    """
    pod_uid, sep, container = name.partition("_")
    if not sep or not pod_uid or not container:
        return None
    return ContainerKey(pod_uid, container)


class ContainerStatus(enum.Enum):
    """Where a container stands this tick."""

    LOADED = "loaded"  # snapshot is set
    NO_CACHE_FILE = "no_cache_file"  # directory exists, HAMi-core has not created the file yet
    REJECTED = "rejected"  # rejection is set


class Rejection(NamedTuple):
    """Why a container's file was not used this tick."""

    reason: RejectReason
    message: str


#: What a container state carries of its region: the tick's part (a
#: :class:`~hami_trio.monitor.snapshot.TickSnapshot`) or the usage read's (a
#: :class:`~hami_trio.monitor.snapshot.UsageSnapshot`).  Covariant, so that a reader typed
#: against a protocol of the snapshot (the collector's ``SnapshotView``) takes either.
S_co = TypeVar("S_co", covariant=True)


@dataclass(frozen=True, slots=True)
class ContainerState(Generic[S_co]):
    """One container as of the latest tick (``snapshot``: a
    :class:`~hami_trio.monitor.snapshot.TickSnapshot`) or usage read (a
    :class:`~hami_trio.monitor.snapshot.UsageSnapshot`).  Immutable; safe to share between
    tasks and threads."""

    key: ContainerKey
    directory: str
    cache_file: str | None
    status: ContainerStatus
    snapshot: S_co | None
    rejection: Rejection | None

    @property
    def pod_uid(self) -> str:
        """The pod UID from the directory name."""
        return self.key.pod_uid

    @property
    def container_name(self) -> str:
        """The container name from the directory name."""
        return self.key.container_name


#: ``ContainerState(*fields)``, faster (see snapshot's ``_constructor``); either kind.
new_container_state: Callable[..., Any] = _constructor(ContainerState)
#: A container as of the latest tick.
TickState = ContainerState[TickSnapshot]
#: A container as of a usage read.
UsageState = ContainerState[UsageSnapshot]
