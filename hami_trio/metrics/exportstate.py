"""Why a container directory is or is not on ``/metrics``: :func:`export_state` (pure).

How this works: the collector decides, per container directory of the latest tick, whether
its rows are exported, and counts every directory in ``hami_trio_monitor_containers{state}``;
the debug view shows the same decision with its reason.  Both call :func:`export_state`,
so the filter and its explanation cannot disagree.  The checks, in order (the first that
applies decides): ``no_pod`` (with Kubernetes: an unknown pod UID, a pod not labelled
``hami.io/vgpu-node=<this node>``, or no container of that name), ``completed`` (the pod
``Succeeded`` or ``Failed``, or an init container's directory), ``rejected`` (the monitor
refused the ``.cache`` file), ``no_cache_file`` (none yet), ``paused`` (the MIG lock: still
exported, frozen at the last tick), else ``exported``.  The rules in full and the metrics:
docs/metrics.md (Why a container is or is not exported).
"""

from __future__ import annotations

from typing import Final, Literal, NamedTuple, Protocol, get_args

from hami_trio._text import quote as _quote
from hami_trio.pods.source import PodInfo

__all__ = [
    "COMPLETED_PHASES",
    "EXPORT_STATES",
    "NODE_LABEL",
    "ExportDecision",
    "ExportState",
    "ExportView",
    "export_state",
]

#: The pod label HAMi's scheduler sets to the node a pod was assigned to.
NODE_LABEL: Final = "hami.io/vgpu-node"
#: Pod phases after which no container of the pod runs again.
COMPLETED_PHASES: Final = frozenset({"Succeeded", "Failed"})

#: Where a container directory stands (the ``state`` label of ``hami_trio_monitor_containers``).
ExportState = Literal["exported", "paused", "no_pod", "completed", "rejected", "no_cache_file"]
#: Every state, in the order the docs list them (all are always exported).
EXPORT_STATES: Final[tuple[ExportState, ...]] = get_args(ExportState)

#: The states whose rows are on ``/metrics``.
_EXPORTED: Final = frozenset({"exported", "paused"})


class RejectionView(Protocol):
    """Why the monitor refused a container's file (the monitor's ``Rejection``)."""

    @property
    def reason(self) -> str:
        """The ``reason`` label of ``hami_trio_monitor_files_rejected_total``."""
        ...

    @property
    def message(self) -> str:
        """What was wrong, for operators."""
        ...


class ExportView(Protocol):
    """One container directory as the latest tick saw it (the monitor's ``ContainerState``)."""

    @property
    def pod_uid(self) -> str: ...
    @property
    def container_name(self) -> str: ...
    @property
    def snapshot(self) -> object | None:
        """The usage snapshot; None when the file did not load this tick."""
        ...

    @property
    def rejection(self) -> RejectionView | None:
        """Why the file was refused; None when it was not."""
        ...


class ExportDecision(NamedTuple):
    """The outcome of :func:`export_state` (a named tuple: one is made per container per
    scrape, and a tuple is the cheapest immutable value to make).

    Attributes:
        state: one of :data:`EXPORT_STATES`.
        reason: one line for operators (names the pod, label or file problem).
        pod: the pod the rows are labelled with, when there is one (None for ``no_pod``).
    """

    state: ExportState
    reason: str
    pod: PodInfo | None = None

    @property
    def exported(self) -> bool:
        """Whether the container's rows are on ``/metrics`` (``exported`` or ``paused``)."""
        return self.state in _EXPORTED


def _pod_name(pod: PodInfo) -> str:
    return _quote(f"{pod.namespace}/{pod.name}")


def export_state(
    container: ExportView,
    pod: PodInfo | None,
    *,
    node_name: str,
    kubernetes: bool,
    paused: bool,
) -> ExportDecision:
    """Decide whether ``container``'s rows are exported, and why (see the module docstring).

    Args:
        container: the container directory from the monitor's latest tick.
        pod: ``pod_source.lookup(container.pod_uid)`` (None: unknown).
        node_name: this node (the value of ``hami.io/vgpu-node`` a pod must carry).
        kubernetes: whether pods come from Kubernetes (False: ``--no-kubernetes``, where
            every directory counts as its own pod and no label or phase is checked).
        paused: whether the MIG lock pauses the monitor right now.

    Returns:
        The state, a one-line reason, and the pod the rows belong to.
    """
    name = container.container_name
    if pod is None:
        return ExportDecision("no_pod", f"pod UID {_quote(container.pod_uid)} is not known")
    if kubernetes:
        label = pod.labels.get(NODE_LABEL)
        if label != node_name:
            found = "missing" if label is None else _quote(label)
            return ExportDecision(
                "no_pod",
                f"pod {_pod_name(pod)} is not labelled {NODE_LABEL}={_quote(node_name)} "
                f"(label {found})",
            )
        if name not in pod.containers:
            if name in pod.init_containers:
                return ExportDecision(
                    "completed",
                    f"{_quote(name)} is an init container of pod {_pod_name(pod)} "
                    "(only spec.containers are exported, as upstream)",
                    pod,
                )
            return ExportDecision("no_pod", f"pod {_pod_name(pod)} has no container {_quote(name)}")
        if pod.phase in COMPLETED_PHASES:
            return ExportDecision(
                "completed", f"pod {_pod_name(pod)} is {pod.phase}: its containers have ended", pod
            )
    rejection = container.rejection
    if rejection is not None:
        return ExportDecision(
            "rejected", f"cache file refused ({rejection.reason}): {rejection.message}", pod
        )
    if container.snapshot is None:
        return ExportDecision(
            "no_cache_file",
            "no .cache file yet (HAMi-core creates it when the container first calls cuInit)",
            pod,
        )
    if paused:
        return ExportDecision(
            "paused", "the MIG lock pauses the monitor: values are from the last tick", pod
        )
    return ExportDecision("exported", "exported", pod)
