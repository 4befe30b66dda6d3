"""The debug view: one JSON document of what the agent knows, per container (pure).

How this works: :func:`debug_state` turns the monitor's latest tick (one entry per container
directory: ``ContainerState`` with its ``UsageSnapshot``), the ``PodSource`` and small summaries
of the monitor, the broker and the pod watch into plain JSON values; :func:`render` encodes
them.  The agent serves the document on its debug port (``/debug/state``, and its parts on
``/debug/containers``, ``/debug/monitor``, ``/debug/broker``, ``/debug/pods``) and
``hami-trio status`` prints it as a table.  What other parts of the agent know about a
container beyond its file - each process's state, priority blocking, the allocation from the
pod's annotation, the export decision - comes in through :class:`DebugExtras`, optional
callables; one that is None is rendered as ``null``.  Everything tenant-controlled is
bounded by :class:`DebugLimits` (entries, processes and allocated devices each, text), and
every cut says so (``truncated``).  No I/O, no clock: the caller passes the time.  The
schema and the limits: docs/debug.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from hami_trio._text import quote
from hami_trio.metrics.exportstate import export_state
from hami_trio.monitor.snapshot import UsageSnapshot
from hami_trio.monitor.state import ContainerKey, UsageState
from hami_trio.pods.allocated import (
    AllocatedDevice,
    named_allocations,
)
from hami_trio.pods.source import PodInfo, PodSource

__all__ = [
    "PARTS",
    "PROCESS_STATES",
    "SCHEMA",
    "AllocatedView",
    "BlockingView",
    "BrokerSummary",
    "DebugExtras",
    "DebugLimits",
    "ExportView",
    "FeedbackView",
    "MonitorSummary",
    "PodWatchSummary",
    "ProcessState",
    "Selection",
    "allocation_of",
    "container_entry",
    "debug_state",
    "export_of",
    "part",
    "render",
]

#: The document's ``schema`` value; a change that removes or renames a key changes it.
SCHEMA: Final = "hami-trio.debug/v1"

#: What a process (a live slot of the region) is: its host PID is alive, set but gone, or 0.
ProcessState = Literal["running", "exited", "unknown"]
PROCESS_STATES: Final[tuple[ProcessState, ...]] = ("running", "exited", "unknown")


# -- what the builder reads (the monitor's, pods' and broker's own types qualify) ------------


class BlockingView(Protocol):
    """Priority blocking of one container, as the monitor tracks it.

    Attributes:
        blocked: held by priority blocking after the latest tick.
        since: Unix time the current episode began (None while not blocked).
        seconds: total seconds it was held so far.
        blocks: how many episodes began so far.
    """

    @property
    def blocked(self) -> bool: ...
    @property
    def since(self) -> float | None: ...
    @property
    def seconds(self) -> float: ...
    @property
    def blocks(self) -> int: ...


class AllocatedView(Protocol):
    """One device the scheduler gave a container (``hami.io/vgpu-devices-allocated``)."""

    @property
    def uuid(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def cores(self) -> int: ...


class ExportView(Protocol):
    """Whether a container's rows are on ``/metrics``, and why."""

    @property
    def state(self) -> str:
        """``exported``, ``no_pod``, ``completed``, ``rejected``, ``paused``, ..."""
        ...

    @property
    def reason(self) -> str: ...


class FeedbackView(Protocol):
    """How the feedback counted a container in the latest tick (the monitor's ``Claim``)."""

    @property
    def scoped(self) -> bool: ...
    @property
    def devices(self) -> Sequence[str] | None: ...
    @property
    def counted(self) -> Sequence[str]: ...
    @property
    def priority(self) -> int: ...
    @property
    def file_priority(self) -> int: ...
    @property
    def strays(self) -> Sequence[str]: ...
    @property
    def stray_reasons(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class DebugExtras:
    """What other parts of the agent add to each container; None: not available (``null``).

    Each callable is called from a worker thread while a debug request is answered, so it
    must only read immutable state (the latest tick's results), never block, and be cheap:
    it is called once per container (``process_state`` once per live slot).

    Attributes:
        process_state: ``(key, host_pid)`` -> the state of the process of that slot, or None
            (not known).  Without it a host PID of 0 is ``unknown`` and any other ``null``.
        blocking: ``key`` -> the container's priority blocking, or None.
        allocation: ``(pod, container name)`` -> the devices the scheduler allocated (in
            ``vdevice`` order), or None (no allocation, or the annotation was refused).
        export: ``(container, pod or None)`` -> whether its rows are exported and why.
        feedback: ``(key, snapshot)`` -> how the feedback counted the loaded container: its
            pod's GPUs and priority, or its file alone, and what the file claims beyond.
    """

    process_state: Callable[[Any, int], ProcessState | None] | None = None
    blocking: Callable[[Any], BlockingView | None] | None = None
    allocation: Callable[[PodInfo, str], Sequence[AllocatedView] | None] | None = None
    export: Callable[[Any, PodInfo | None], ExportView | None] | None = None
    feedback: Callable[[Any, UsageSnapshot], FeedbackView | None] | None = None


@dataclass(frozen=True, slots=True)
class DebugLimits:
    """How large the document may grow whatever the tenants do (every cut is flagged)."""

    containers: int = 1000
    processes: int = 64
    allocated: int = 16
    text: int = 512


@dataclass(frozen=True, slots=True)
class Selection:
    """Only the containers of one namespace (and pod), before the cut (query parameters)."""

    namespace: str | None = None
    pod: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, Sequence[str]]) -> Selection:
        """``?namespace=NS&pod=NAME`` (the last value of each wins)."""

        def last(name: str) -> str | None:
            values = params.get(name)
            return values[-1] if values else None

        return cls(last("namespace"), last("pod"))

    def admits(self, pod: PodInfo | None) -> bool:
        if self.namespace is None and self.pod is None:
            return True
        if pod is None:
            return False
        if self.namespace is not None and pod.namespace != self.namespace:
            return False
        return self.pod is None or pod.name == self.pod

    def to_json(self) -> dict[str, str | None] | None:
        if self.namespace is None and self.pod is None:
            return None
        return {"namespace": self.namespace, "pod": self.pod}


@dataclass(frozen=True, slots=True)
class MonitorSummary:
    """The monitor's side of the document's ``monitor`` section."""

    containers_dir: str
    interval: float
    ticks: int
    paused: bool
    mig_lock_problem: str | None = None
    removals_pending: int = 0
    checks_liveness: bool | None = None
    foreign_writer: bool = False
    #: Unix time of the usage read the containers' usage comes from (None: none yet).
    usage_read_at: float | None = None


@dataclass(frozen=True, slots=True)
class BrokerSummary:
    """The broker's counters (``hami_trio_broker_*`` as of now)."""

    socket_path: str
    exchanges: Mapping[str, int]
    in_flight: int
    #: Why the broker waits: another broker serves the socket path (None: it listens).
    foreign: str | None = None


@dataclass(frozen=True, slots=True)
class PodWatchSummary:
    """Where the pods come from and how current they are."""

    source: Literal["kubernetes", "static"]
    ready: bool
    authoritative: bool
    pods: int | None = None
    resource_version: str | None = None
    relists: int | None = None
    node_name: str = ""


# -- the builder ----------------------------------------------------------------------------


# A name that is not UTF-8 comes from the file system as lone surrogates (Python's
# surrogateescape); JSON could carry them only as unpaired \u escapes, which many readers
# refuse.  They are written out as text instead: the name stays visible, the document valid.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: str, limit: int) -> str:
    """Tenant text for the document: at most ``limit`` characters (then ``...``), and no
    lone surrogate (each becomes the six characters ``\\udcNN``)."""
    if len(value) > limit:
        value = value[:limit] + "..."
    if _SURROGATE.search(value) is None:
        return value
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", value)


def _identity(key: ContainerKey, pod: PodInfo | None, pods: PodWatchSummary) -> Any:
    if pod is not None:
        return {"known": True, "reason": None}
    uid = quote(key.pod_uid)  # the directory's name: quoted and cut, as in the export reasons
    if pods.source == "static":
        reason = f"pod UID {uid} is not known"
    elif not pods.ready:
        reason = f"pod UID {uid} is not known: the pod watch has not listed yet"
    else:
        reason = (
            f"pod UID {uid} is not known to the pod watch of node {quote(pods.node_name)} "
            "(deleted, on another node, or not scheduled by HAMi here)"
        )
    return {"known": False, "reason": reason}


def _devices(snapshot: UsageSnapshot) -> list[dict[str, Any]]:
    per_device = snapshot.device_processes
    devices = []
    for device in snapshot.devices:
        devices.append(
            {
                "index": device.index,
                "uuid": device.uuid.label,
                "uuid_state": device.uuid.state.value,
                "used_bytes": device.memory_total,
                "limit_bytes": device.memory_limit,
                "sm_util": device.sm_util,
                "core_limit": device.sm_limit,
                "processes": per_device[device.index] if device.index < len(per_device) else None,
            }
        )
    return devices


def _processes(
    key: Any, snapshot: UsageSnapshot, extras: DebugExtras, limit: int
) -> dict[str, Any]:
    state_of = extras.process_state
    counts: dict[str, int | None] = {"running": 0, "exited": 0, "unknown": 0}
    unnamed = 0
    listed = []
    for index, (pid, host_pid) in enumerate(zip(snapshot.pids, snapshot.host_pids, strict=False)):
        state: ProcessState | None
        if state_of is not None:
            state = state_of(key, host_pid)
        else:
            state = "unknown" if host_pid == 0 else None
        if state is None:
            unnamed += 1
        else:
            counts[state] = (counts[state] or 0) + 1
        if index < limit:
            listed.append({"pid": pid, "host_pid": host_pid, "state": state})
    total = len(snapshot.host_pids)
    if unnamed and state_of is None:
        counts["running"] = counts["exited"] = None  # cannot tell without the process states
    return {
        "processes": listed,
        "processes_total": total,
        "processes_truncated": total > limit,
        "process_states": counts,
    }


def _allocated(
    pod: PodInfo | None, name: str, extras: DebugExtras, limit: int
) -> dict[str, Any] | None:
    if extras.allocation is None or pod is None:
        return None
    devices = extras.allocation(pod, name)
    if devices is None:
        return None
    return {
        "devices": [
            {
                "uuid": _text(device.uuid, 128),
                "type": _text(device.type, 128),
                "memory_mib": device.memory_mib,
                "cores": device.cores,
            }
            for device in devices[:limit]
        ],
        "truncated": len(devices) > limit,
    }


def _feedback(
    key: Any, snapshot: UsageSnapshot | None, extras: DebugExtras, limit: int
) -> dict[str, Any] | None:
    if extras.feedback is None or snapshot is None:
        return None
    view = extras.feedback(key, snapshot)
    if view is None:
        return None

    def uuids(values: Sequence[str]) -> list[str]:
        return [_text(value, 128) for value in values[:limit]]

    return {
        "scoped": view.scoped,
        "devices": None if view.devices is None else uuids(view.devices),
        "counted": uuids(view.counted),
        "priority": view.priority,
        "file_priority": view.file_priority,
        "strays": uuids(view.strays),
        "stray_reasons": list(view.stray_reasons),
    }


def container_entry(
    state: UsageState,
    pod: PodInfo | None,
    *,
    pods: PodWatchSummary,
    paused: bool,
    extras: DebugExtras = DebugExtras(),
    limits: DebugLimits = DebugLimits(),
) -> dict[str, Any]:
    """One container directory's entry of ``containers`` (docs/debug.md has every key)."""
    key = state.key
    text = limits.text
    snapshot = state.snapshot
    rejection = state.rejection
    entry: dict[str, Any] = {
        "directory": _text(state.directory, text),
        "pod_uid": _text(key.pod_uid, text),
        "container": _text(key.container_name, text),
        "namespace": None if pod is None else _text(pod.namespace, text),
        "pod": None if pod is None else _text(pod.name, text),
        "identity": _identity(key, pod, pods),
        "status": state.status.value,
        "file": (
            None
            if state.cache_file is None
            else _text(f"{state.directory}/{state.cache_file}", text)
        ),
        "rejection": (
            None
            if rejection is None
            else {"reason": str(rejection.reason.value), "message": _text(rejection.message, text)}
        ),
        "paused": paused,
    }
    if snapshot is None:
        entry |= {
            "format": None,
            "version": None,
            "file_size": None,
            "priority": None,
            "utilization_switch": None,
            "recent_kernel": None,
            "devices": [],
            "processes": [],
            "processes_total": 0,
            "processes_truncated": False,
            "process_states": None,
        }
    else:
        version = None if snapshot.major is None else f"{snapshot.major}.{snapshot.minor}"
        entry |= {
            "format": snapshot.format.value,
            "version": version,
            "file_size": snapshot.file_size,
            "priority": snapshot.priority,
            "utilization_switch": snapshot.utilization_switch,
            "recent_kernel": snapshot.recent_kernel,
            "devices": _devices(snapshot),
            **_processes(key, snapshot, extras, limits.processes),
        }
    blocking = None if extras.blocking is None else extras.blocking(key)
    entry |= {
        "blocked": None if blocking is None else blocking.blocked,
        "blocked_since": None if blocking is None else blocking.since,
        "blocked_seconds": None if blocking is None else blocking.seconds,
        "blocks": None if blocking is None else blocking.blocks,
        "allocated": _allocated(pod, key.container_name, extras, limits.allocated),
        "feedback": _feedback(key, snapshot, extras, limits.allocated),
    }
    export = None if extras.export is None else extras.export(state, pod)
    entry["export"] = {
        "state": None if export is None else export.state,
        "reason": None if export is None else _text(export.reason, text),
    }
    return entry


def _order(pod: PodInfo | None, key: ContainerKey) -> tuple[int, str, str, str, str]:
    # Known pods by namespace/pod/container; directories of unknown pods after them.
    if pod is None:
        return (1, "", "", key.container_name, key.dirname)
    return (0, pod.namespace, pod.name, key.container_name, key.dirname)


def debug_state(
    containers: Mapping[Any, UsageState],
    pod_source: PodSource,
    *,
    now: float,
    node_name: str,
    version: str,
    monitor: MonitorSummary,
    pods: PodWatchSummary,
    broker: BrokerSummary | None,
    extras: DebugExtras = DebugExtras(),
    limits: DebugLimits = DebugLimits(),
    selection: Selection = Selection(),
) -> dict[str, Any]:
    """The whole debug document (docs/debug.md): summaries and one entry per container.

    Args:
        containers: the monitor's latest tick as of a usage read (``Monitor.usage()``).
        pod_source: whom to ask which pod a directory belongs to.
        now: Unix time the document describes (``generated_at``).
        node_name: this node.
        version: hami-trio's version.
        monitor: the monitor's summary.
        pods: the pod source's summary.
        broker: the broker's counters; None when it is off.
        extras: what the other parts of the agent add (None parts are ``null``).
        limits: the caps (see :class:`DebugLimits`).
        selection: only the containers of one namespace/pod (applied before the cap).
    """
    by_status: dict[str, int] = {}
    by_export: dict[str, int] | None = {} if extras.export is not None else None
    chosen: list[tuple[tuple[int, str, str, str, str], UsageState, PodInfo | None]] = []
    for state in containers.values():
        pod = pod_source.lookup(state.key.pod_uid)
        status = state.status.value
        by_status[status] = by_status.get(status, 0) + 1
        if by_export is not None and extras.export is not None:
            decision = extras.export(state, pod)
            if decision is not None:
                by_export[decision.state] = by_export.get(decision.state, 0) + 1
        if selection.admits(pod):
            chosen.append((_order(pod, state.key), state, pod))
    chosen.sort(key=lambda item: item[0])
    shown = chosen[: limits.containers]
    entries = [
        container_entry(state, pod, pods=pods, paused=monitor.paused, extras=extras, limits=limits)
        for _, state, pod in shown
    ]
    broker_json: dict[str, Any] | None = None
    if broker is not None:
        broker_json = {
            "socket_path": broker.socket_path,
            "exchanges": dict(broker.exchanges),
            "exchanges_total": sum(broker.exchanges.values()),
            "in_flight": broker.in_flight,
            "foreign_listener": broker.foreign,
        }
    return {
        "schema": SCHEMA,
        "generated_at": now,
        "node": node_name,
        "version": version,
        "monitor": {
            "containers_dir": monitor.containers_dir,
            "interval_seconds": monitor.interval,
            "ticks": monitor.ticks,
            "paused": monitor.paused,
            "mig_lock_problem": monitor.mig_lock_problem,
            "foreign_writer": monitor.foreign_writer,
            "removals_pending": monitor.removals_pending,
            "checks_liveness": monitor.checks_liveness,
            "usage_read_at": monitor.usage_read_at,
            "containers_total": len(containers),
            "by_status": dict(sorted(by_status.items())),
            "by_export_state": None if by_export is None else dict(sorted(by_export.items())),
        },
        "broker": broker_json,
        "pods": {
            "source": pods.source,
            "node": pods.node_name,
            "ready": pods.ready,
            "authoritative": pods.authoritative,
            "pods": pods.pods,
            "resource_version": pods.resource_version,
            "relists": pods.relists,
        },
        "selection": selection.to_json(),
        "containers_matched": len(chosen),
        "containers_shown": len(entries),
        "truncated": len(chosen) > len(entries),
        "containers": entries,
    }


#: The document's parts, served on their own paths (``/debug/<part>``).
PARTS: Final = ("containers", "monitor", "broker", "pods")
_CONTAINER_KEYS: Final = (
    "schema",
    "generated_at",
    "node",
    "selection",
    "containers_matched",
    "containers_shown",
    "truncated",
    "containers",
)


def part(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One part of the document (``containers`` keeps its counts and ``truncated``)."""
    if name == "containers":
        return {key: document[key] for key in _CONTAINER_KEYS}
    return {
        "schema": document["schema"],
        "generated_at": document["generated_at"],
        name: document[name],
    }


def render(document: Mapping[str, Any]) -> bytes:
    """The document as compact JSON, ASCII only (tenant text is escaped: no control bytes).

    Compact, not indented: the indenting encoder is pure Python and several times slower
    (docs/benchmarks.md, Debug view); ``hami-trio status --json`` indents, so does ``jq``.
    """
    doc = json.dumps(document, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return (doc + "\n").encode()


def allocation_of(pod: PodInfo, container: str) -> tuple[AllocatedDevice, ...] | None:
    """The devices ``hami.io/vgpu-devices-allocated`` gives ``container`` of ``pod``, in
    vdevice order; None when the pod has no allocation for it or the annotation is refused
    (the refusal is counted and logged by the pod collector, not here)."""
    named = named_allocations(pod.annotations, pod.init_containers, pod.containers)
    if named is None:
        return None
    mine = tuple(entry.device for entry in named if entry.container == container)
    return mine or None


def export_of(
    *, node_name: str, kubernetes: bool, paused: Callable[[], bool]
) -> Callable[[Any, PodInfo | None], ExportView]:
    """The ``export`` extra: the collector's own decision (``export_state``) per container."""

    def decide(container: Any, pod: PodInfo | None) -> ExportView:
        return export_state(
            container, pod, node_name=node_name, kubernetes=kubernetes, paused=paused()
        )

    return decide


class _InsightLike(Protocol):
    """What the monitor's per-container insight offers the debug view."""

    @property
    def processes(self) -> Any: ...  # .exited_host_pids: the exited slots' host PIDs
    @property
    def block(self) -> Any: ...  # .blocked .since (monotonic) .seconds .blocks


@dataclass(frozen=True, slots=True)
class _Blocking:
    blocked: bool
    since: float | None
    seconds: float
    blocks: int


def insight_extras(
    insights: Callable[[], Mapping[Any, _InsightLike]], *, wall_offset: float
) -> tuple[Callable[[Any, int], ProcessState | None], Callable[[Any], BlockingView | None]]:
    """The ``process_state`` and ``blocking`` extras over the monitor's latest insights.

    Args:
        insights: the monitor's ``insights`` (the latest completed tick's, immutable).
        wall_offset: Unix time minus the monitor's clock, taken once where that clock can
            be read: ``since`` is reported as Unix time.

    A slot whose host PID is 0 is ``unknown``, one whose host PID the tick found gone
    ``exited``, any other ``running`` (also when the agent cannot check: then nothing is ever
    ``exited``, as on ``/metrics``); a container the latest tick has no insight for yet: None.
    """

    def process_state(key: Any, host_pid: int) -> ProcessState | None:
        insight = insights().get(key)
        if insight is None:
            return None
        if host_pid == 0:
            return "unknown"
        return "exited" if host_pid in insight.processes.exited_host_pids else "running"

    def blocking(key: Any) -> BlockingView | None:
        insight = insights().get(key)
        if insight is None:
            return None
        block = insight.block
        since = None if block.since is None else block.since + wall_offset
        return _Blocking(bool(block.blocked), since, float(block.seconds), int(block.blocks))

    return process_state, blocking
