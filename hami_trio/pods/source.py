"""What the monitor knows about the pods on this node: the ``PodSource`` protocol.

The monitor's lister and the metrics collector need two things from Kubernetes: which pod a
container directory ``{PodUID}_{ContainerName}`` belongs to (namespace, name, container names,
annotations for MIG rows), and whether the list of pods is complete enough to delete the
directories of pods that are gone.  Both are behind this protocol so the monitor core never
imports Kubernetes code:

- :class:`StaticPodSource` (``--no-kubernetes`` and tests) knows no pod list: every directory
  counts as live with ``namespace=""`` and ``name=<PodUID>``, and nothing is ever deleted.
- The Kubernetes watch (``hami_trio.pods.watch``) is authoritative once its first list
  succeeded, and keeps the last known set while the API server is unreachable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

__all__ = ["PodInfo", "PodSource", "StaticPodSource"]


_NO_PRIORITIES: Mapping[str, int] = MappingProxyType({})


def _frozen(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a pod the monitor uses.  Immutable; share it freely between tasks."""

    uid: str
    namespace: str
    name: str
    containers: tuple[str, ...] = ()
    init_containers: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=lambda: _frozen(None))
    labels: Mapping[str, str] = field(default_factory=lambda: _frozen(None))
    #: ``status.phase`` (``Pending``, ``Running``, ``Succeeded``, ``Failed``, ``Unknown``);
    #: ``""`` when unknown (no Kubernetes, or the API left it out).
    phase: str = ""
    #: Container name -> the ``CUDA_TASK_PRIORITY`` its spec sets (``env``, else the priority
    #: resource; :mod:`hami_trio.pods.priority`), only for containers whose spec sets one.
    priorities: Mapping[str, int] = field(default_factory=lambda: _NO_PRIORITIES)
    #: The annotations the agent uses that the pod watch had to leave out (too long, or the
    #: whole pod kept as its identity only): the pod has them, their values are unknown.
    withheld: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # Copy caller-owned dicts so a later mutation cannot change a published PodInfo.
        object.__setattr__(self, "annotations", _frozen(self.annotations))
        object.__setattr__(self, "labels", _frozen(self.labels))
        if self.priorities is not _NO_PRIORITIES:  # most pods set none: share one
            priorities = dict(self.priorities)
            object.__setattr__(
                self, "priorities", MappingProxyType(priorities) if priorities else _NO_PRIORITIES
            )


class PodSource(Protocol):
    """The pods on this node, as far as the agent knows them."""

    @property
    def ready(self) -> bool:
        """Whether the source has done its first successful sync (reported on ``/readyz``)."""
        ...

    @property
    def authoritative(self) -> bool:
        """Whether a UID unknown to :meth:`lookup` means the pod is gone from this node.

        Only then may the lister delete the directories of unknown pods (after the resync
        interval).  False before the first successful list and without Kubernetes.
        """
        ...

    def lookup(self, uid: str) -> PodInfo | None:
        """The pod with this UID, or None if the source does not know it."""
        ...


class StaticPodSource:
    """A pod source without Kubernetes: fixed pods, or every UID as an anonymous pod.

    With ``pods`` given (tests), :meth:`lookup` answers from them and the source is
    authoritative (unknown UIDs are gone).  Without (``--no-kubernetes``), every UID is live as
    ``PodInfo(uid, namespace="", name=uid)`` and the source is never authoritative, so the
    lister deletes nothing.
    """

    def __init__(self, pods: Iterable[PodInfo] | None = None) -> None:
        self._pods: dict[str, PodInfo] | None = (
            None if pods is None else {pod.uid: pod for pod in pods}
        )

    @property
    def ready(self) -> bool:
        return True

    @property
    def authoritative(self) -> bool:
        return self._pods is not None

    def lookup(self, uid: str) -> PodInfo | None:
        if self._pods is None:
            return PodInfo(uid=uid, namespace="", name=uid)
        return self._pods.get(uid)
