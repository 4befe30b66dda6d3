"""The Prometheus collector of the vGPU monitor: upstream's metrics from the latest snapshots.

How this works: :class:`VGpuCollector` is registered into the agent's registry; each scrape
(in a worker thread, :mod:`hami_trio.metrics.endpoint`) reads the monitor's latest views
(never a ``.cache`` file), the pod source and the NVML sampler, and renders HAMi
vGPUmonitor's families through :mod:`hami_trio.metrics.exposition`.  A container's rendered
lines are reused while its snapshot, insight and pod names stay the same.  Which containers
are exported is decided by the pure :func:`~hami_trio.metrics.exportstate.export_state`.

Tenant data never fails a scrape: a failure costs only its own rows (``container``, ``mig``,
``pods``, ``host``, ``allocated``), counted in ``hami_trio_collector_errors_total{phase}`` and
logged at most once per :data:`WARNING_INTERVAL` per pod or container.  The collector depends
only on the read-only view protocols below and the monitor's pure container values
(:mod:`hami_trio.monitor.state`).  Every family and label: docs/metrics.md.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from operator import attrgetter
from typing import Any, Final, Literal, Protocol

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami_trio._version import __version__
from hami_trio.logs import RateLimiter
from hami_trio.metrics.exportstate import (
    EXPORT_STATES,
    NODE_LABEL,
    ExportState,
    export_state,
)
from hami_trio.metrics.exposition import FastCounter, FastGauge, render_labels
from hami_trio.metrics.hostgpu import HostGpuSampler, host_gpu_families
from hami_trio.monitor.state import ContainerState
from hami_trio.pods.migalloc import (
    MIG_ALLOCATIONS_ANNOTATION,
    MigAllocation,
    MigAnnotationError,
    decode_mig_allocations,
    mig_container_name,
)
from hami_trio.pods.source import PodInfo, PodSource

__all__ = [
    "COLLECTOR_ERROR_PHASES",
    "NODE_LABEL",
    "WARNING_INTERVAL",
    "ZONE",
    "BuildInfoCollector",
    "DeviceView",
    "InsightView",
    "MonitorView",
    "SnapshotView",
    "VGpuCollector",
]

logger = logging.getLogger(__name__)

#: Upstream's collector-wide ``zone`` label value.
ZONE: Final = "vGPU"

#: The ``phase`` label values of ``hami_trio_collector_errors_total`` (a fixed set).
COLLECTOR_ERROR_PHASES: Final = ("container", "mig", "pods", "host", "allocated")
#: Seconds between two warnings about the same pod or container (the rest are counted).
WARNING_INTERVAL: Final = 600.0

_MASK64: Final = (1 << 64) - 1
_SIGN64: Final = 1 << 63


# The read-only view of the monitor this collector needs (structural: the monitor's own
# Monitor / UsageSnapshot / DeviceUsage / DeviceUUID classes satisfy it; its containers are
# the monitor's own ContainerState values, read as they are).


class UUIDView(Protocol):
    """A device's UUID slot."""

    @property
    def label(self) -> str | None:
        """Upstream's label (first 40 bytes, NULs removed) or None (unused / not UTF-8)."""
        ...


class DeviceView(Protocol):
    """One device of a container's snapshot."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> UUIDView: ...
    @property
    def memory_limit(self) -> int: ...
    @property
    def memory_total(self) -> int: ...
    @property
    def context_size(self) -> int: ...
    @property
    def module_size(self) -> int: ...
    @property
    def buffer_size(self) -> int: ...
    @property
    def sm_util(self) -> int: ...


class SnapshotView(Protocol):
    """A container's usage snapshot from the latest tick."""

    @property
    def devices(self) -> Sequence[DeviceView]: ...
    @property
    def recent_kernel(self) -> int: ...
    @property
    def last_kernel_time(self) -> int: ...


class UsageViewLike(Protocol):
    """One usage read of the monitor (:class:`~hami_trio.monitor.usage.UsageView`)."""

    @property
    def containers(self) -> Mapping[Any, ContainerState[SnapshotView]]:
        """The latest tick's containers as of the read (immutable)."""
        ...

    @property
    def insights(self) -> Mapping[Any, InsightView]:
        """Per loaded container: processes, control words, blocking counters."""
        ...


class MonitorView(Protocol):
    """The monitor as the collector reads it."""

    def usage(self) -> UsageViewLike:
        """A usage view no older than the freshness window (reads when it is older)."""
        ...

    @property
    def paused(self) -> bool:
        """True while the MIG lock holds the monitor."""
        ...


class ProcessCountsView(Protocol):
    """A container's live slots by process state."""

    @property
    def running(self) -> int: ...
    @property
    def exited(self) -> int: ...
    @property
    def unknown(self) -> int: ...


class BlockView(Protocol):
    """A container's priority-blocking counters."""

    @property
    def seconds(self) -> float: ...
    @property
    def blocks(self) -> int: ...


class InsightView(Protocol):
    """What the monitor derived for one container in a usage read (``usage().insights``)."""

    @property
    def processes(self) -> ProcessCountsView: ...
    @property
    def priority(self) -> int: ...
    @property
    def utilization_switch(self) -> int: ...
    @property
    def block(self) -> BlockView: ...
    @property
    def core_limits(self) -> Sequence[int]: ...
    @property
    def device_processes(self) -> Sequence[int]: ...
    @property
    def devices(self) -> Sequence[DeviceView] | None:
        """The sums without exited slots (``--exclude-exited-processes``), or None."""
        ...


_CONTAINER_LABELS: Final = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
_OWNER_LABELS: Final = ("namespace", "pod", "container")
_LEGACY_LABELS: Final = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
_MIG_LABELS: Final = (
    *_CONTAINER_LABELS,
    "mig_uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
)


def _int64(value: int) -> int:
    """Go's ``int64(uint64)``: values with the top bit set are negative."""
    return value - (1 << 64) if value & _SIGN64 else value


_ZONE_SUFFIX: Final = f',zone="{ZONE}"}}'  # how every rendered label string ends


class _LabelCache:
    """Rendered label strings by label values, kept across scrapes (bounded).

    The same containers are scraped again and again; only their values change.  Two scrapes
    may run at once: dict reads and writes are atomic, and trimming replaces the dict.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ...], tuple[str, str]] = {}

    def get(self, values: tuple[str, ...]) -> tuple[str, str]:
        """``(new-style labels, legacy labels)`` for ``(ns, pod, container, index, uuid)``."""
        rendered = self._entries.get(values)
        if rendered is None:
            rendered = (
                render_labels((*_CONTAINER_LABELS, "zone"), (*values, ZONE)),
                render_labels((*_LEGACY_LABELS, "zone"), (*values, ZONE)),
            )
            self._entries[values] = rendered
        return rendered

    def trim(self, in_use: int) -> None:
        """Forget everything once the cache is far larger than what a scrape uses."""
        if len(self._entries) > 4 * in_use + 1024:
            self._entries = {}


_STATES: Final = ("running", "exited", "unknown")
_STATE_COUNTS: Final = attrgetter(*_STATES)
#: An owner rendered, and per ``state`` (running, exited, unknown) its label values and
#: their rendering.
_OwnerLabels = tuple[str, tuple[tuple[str, ...], ...], tuple[str, ...]]


class _InsightLabels:
    """Rendered label strings of the insight rows, kept across scrapes (bounded like
    :class:`_LabelCache`): per owner its three ``state`` label sets, per device its labels
    without ``zone``."""

    def __init__(self) -> None:
        self._owners: dict[tuple[str, str, str], _OwnerLabels] = {}
        self._devices: dict[tuple[str, ...], str] = {}

    def owner(self, owner: tuple[str, str, str]) -> _OwnerLabels:
        """``(namespace, pod, container)`` rendered, and with each ``state`` of
        :data:`_STATES`: the label values, the renderings."""
        labels = self._owners.get(owner)
        if labels is None:
            rendered = render_labels(_OWNER_LABELS, owner)
            base = rendered[:-1]
            labels = self._owners[owner] = (
                rendered,
                tuple([(*owner, state) for state in _STATES]),
                tuple([f'{base},state="{state}"}}' for state in _STATES]),
            )
        return labels

    def device(self, ids: tuple[str, ...]) -> str:
        """``(ns, pod, container, index, uuid)`` rendered without ``zone``."""
        rendered = self._devices.get(ids)
        if rendered is None:
            rendered = self._devices[ids] = render_labels(_CONTAINER_LABELS, ids)
        return rendered

    def trim(self, in_use: int) -> None:
        """Forget everything once the cache is far larger than what a scrape uses."""
        if len(self._devices) + len(self._owners) > 4 * in_use + 1024:
            self._owners, self._devices = {}, {}


# -- the container families, each declared once --------------------------------------------

#: Where a family's rows come from; the row kind also fixes the label names.
_RowKind = Literal["device", "kernel", "mig", "owner", "states", "insight", "insight-device"]

#: Label names by row kind (``zone`` only on upstream's families).
_KIND_LABELS: Final[Mapping[_RowKind, tuple[str, ...]]] = {
    # One row per exported device; value: the device's ``field`` (the sums without exited
    # slots when the monitor made them).
    "device": (*_CONTAINER_LABELS, "zone"),
    # Per exported device, ``now - last_kernel_time``: rendered again when the second changes.
    "kernel": (*_CONTAINER_LABELS, "zone"),
    # One row per realised MIG allocation of a pod (:meth:`VGpuCollector._collect_mig`).
    "mig": (*_MIG_LABELS, "zone"),
    # One row per container; value: the snapshot's ``field``.
    "owner": _OWNER_LABELS,
    # One row per ``state`` of a container with an insight; value: that state's count in the
    # insight's ``field``.
    "states": (*_OWNER_LABELS, "state"),
    # One row per container with an insight; value: the insight's ``field``.
    "insight": _OWNER_LABELS,
    # Per exported device of a container with an insight, the insight's ``field[index]``
    # where the sequence reaches that far.
    "insight-device": _CONTAINER_LABELS,
}


@dataclass(frozen=True, slots=True)
class _Legacy:
    """A family's twin under HAMi's legacy name and labels (``--legacy-metrics``): the same
    values, labels ``podnamespace, podname, ctrname, vdeviceid, deviceuuid``, then ``extra``
    (values from ``parts(device)``), then ``zone``."""

    name: str
    help: str
    extra: tuple[str, ...] = ()
    parts: Callable[[DeviceView], tuple[str, ...]] | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        return (*_LEGACY_LABELS, *self.extra, "zone")


@dataclass(frozen=True, slots=True)
class _Family:
    """One family of the collector, declared once in :data:`_FAMILIES`: its name, help text,
    type, row kind (and so its labels), the field its value is read from, its legacy twin,
    and whether it is one of HAMi vGPUmonitor's families (exposed first, their legacy twins
    right after them)."""

    name: str
    help: str
    rows: _RowKind
    #: The attribute (dotted) of the row's source that is the value: of the device, snapshot
    #: or insight (see :data:`_KIND_LABELS`); ``convert`` turns it into the value.
    field: str = ""
    convert: Callable[[Any], int] | None = None
    counter: bool = False
    upstream: bool = False
    legacy: _Legacy | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        return _KIND_LABELS[self.rows]


def _memory_parts(device: DeviceView) -> tuple[str, ...]:
    """The legacy memory description's ``context, module, data, offset``; upstream subtracts
    in uint64, so parts larger than ``memory_total`` wrap around."""
    context, module, buffer = device.context_size, device.module_size, device.buffer_size
    offset = (device.memory_total - context - module - buffer) & _MASK64
    return (str(context), str(module), str(buffer), str(offset))


def _blocked(recent_kernel: int) -> int:
    return 1 if recent_kernel < 0 else 0


#: Every container family, in exposition order (upstream's, then their legacy twins, then
#: hami-trio's own).  The process, limit and feedback-state families (``states``,
#: ``insight``, ``insight-device``) need the monitor's insights.  docs/metrics.md lists each.
_FAMILIES: Final[tuple[_Family, ...]] = (
    _Family(
        "hami_vgpu_memory_used_bytes",
        "vGPU device memory usage in bytes",
        "device",
        "memory_total",
        upstream=True,
        legacy=_Legacy("vGPU_device_memory_usage_in_bytes", "vGPU device usage"),
    ),
    _Family(
        "hami_vgpu_memory_limit_bytes",
        "vGPU device memory limit in bytes",
        "device",
        "memory_limit",
        upstream=True,
        legacy=_Legacy("vGPU_device_memory_limit_in_bytes", "vGPU device limit"),
    ),
    _Family(
        "hami_container_device_memory_bytes",
        "Container device memory usage in bytes",
        "device",
        "memory_total",
        upstream=True,
        legacy=_Legacy(
            "Device_memory_desc_of_container",
            "Container device memory description",
            ("context", "module", "data", "offset"),
            _memory_parts,
        ),
    ),
    _Family(
        "hami_container_device_utilization_ratio",
        "Container device SM utilization ratio",
        "device",
        "sm_util",
        upstream=True,
        legacy=_Legacy(
            "Device_utilization_desc_of_container", "Container device utilization description"
        ),
    ),
    _Family(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since last kernel execution in container",
        "kernel",
        upstream=True,
        legacy=_Legacy(
            "Device_last_kernel_of_container", "Container device last kernel description"
        ),
    ),
    _Family(
        "hami_mig_device_info",
        "MIG runtime identity for a container allocation",
        "mig",
        upstream=True,
        legacy=_Legacy("MigInfo", "Mig device information for container", ("instanceid",)),
    ),
    _Family(
        "hami_vgpu_memory_context_bytes",
        "Container device memory context size in bytes",
        "device",
        "context_size",
        upstream=True,
    ),
    _Family(
        "hami_vgpu_memory_module_bytes",
        "Container device memory module size in bytes",
        "device",
        "module_size",
        upstream=True,
    ),
    _Family(
        "hami_vgpu_memory_buffer_bytes",
        "Container device memory buffer size in bytes",
        "device",
        "buffer_size",
        upstream=True,
    ),
    _Family(
        "hami_trio_container_blocked",
        "1 while the monitor blocks the container's kernel launches (recent_kernel < 0)",
        "owner",
        "recent_kernel",
        _blocked,
    ),
    _Family(
        "hami_trio_container_processes",
        "Live process slots of the container by state: running (host PID alive), exited "
        "(host PID set, no such process; still in upstream's sums), unknown (host PID 0)",
        "states",
        "processes",
    ),
    _Family(
        "hami_trio_container_device_processes",
        "Live process slots of the container using this device (memory or SM use not 0)",
        "insight-device",
        "device_processes",
    ),
    _Family(
        "hami_trio_container_core_limit_ratio",
        "The container's SM limit on this device in percent (sm_limit; 0: no limit)",
        "insight-device",
        "core_limits",
    ),
    _Family(
        "hami_trio_container_priority",
        "The container's task priority (CUDA_TASK_PRIORITY; lower is more important)",
        "insight",
        "priority",
    ),
    _Family(
        "hami_trio_container_utilization_switch",
        "The utilization_switch word after the latest tick (1: SM limit enforced)",
        "insight",
        "utilization_switch",
    ),
    _Family(
        "hami_trio_container_blocked_seconds",
        "Seconds the monitor's priority blocking held the container (tick resolution)",
        "insight",
        "block.seconds",
        counter=True,
    ),
    _Family(
        "hami_trio_container_blocks",
        "Times the monitor's priority blocking started holding the container",
        "insight",
        "block.blocks",
        counter=True,
    ),
)

_Fast = FastGauge | FastCounter
#: A family whose rows a container keeps, with its legacy twin when it is the twin's rows.
_Kept = tuple[_Family, _Legacy | None]


def _fast(name: str, help_text: str, labels: Sequence[str], counter: bool) -> _Fast:
    return (FastCounter if counter else FastGauge)(name, help_text, labels)


def _only(table: Sequence[_Family], kind: _RowKind) -> _Family:
    (family,) = [family for family in table if family.rows == kind]
    return family


class _Families:
    """The families of one scrape, made from :data:`_FAMILIES`, empty, filled per container."""

    def __init__(
        self, legacy: bool, labels: _LabelCache, insight_labels: _InsightLabels | None = None
    ) -> None:
        table = _FAMILIES
        self._labels = labels
        self._insight_labels = _InsightLabels() if insight_labels is None else insight_labels
        self.legacy = legacy
        self.devices = 0
        new = {f.name: _fast(f.name, f.help, f.labels, f.counter) for f in table}
        # Legacy twins exist without --legacy-metrics too (empty, never exposed).
        old = {
            f.name: _fast(f.legacy.name, f.legacy.help, f.legacy.labels, f.counter)
            for f in table
            if f.legacy is not None
        }
        kept, self._container_rows = _plan(table, legacy)
        #: The families a container keeps lines of, in the order of ``_ContainerRows.blocks``.
        self._cached = tuple(new[f.name] if twin is None else old[f.name] for f, twin in kept)
        upstream = [f.name for f in table if f.upstream]
        self._exposed = [
            *(new[name] for name in upstream),
            *(old[name] for name in upstream if legacy and name in old),
            *(new[f.name] for f in table if not f.upstream),
            *(old[f.name] for f in table if legacy and not f.upstream and f.name in old),
        ]
        kernel, mig = _only(table, "kernel").name, _only(table, "mig").name
        self.last_kernel, self.legacy_last_kernel = new[kernel], old[kernel]
        self.mig, self.legacy_mig = new[mig], old[mig]

    def exposed(self) -> list[_Fast]:
        """Every family this scrape exposes (legacy twins with ``legacy``), in order."""
        return list(self._exposed)

    def render(
        self,
        owner: tuple[str, str, str],
        snapshot: SnapshotView,
        insight: InsightView | None,
    ) -> _ContainerRows:
        """Every row of one container, rendered (raises on data that cannot be exported:
        nothing of the container is in the families then).  Only the text is kept: the rows
        are built again from the same objects when something reads a family's samples."""
        rows, kernel = self._container_rows(
            self._labels, self._insight_labels, owner, snapshot, insight
        )
        return _ContainerRows(
            snapshot,
            insight,
            owner,
            tuple(
                [
                    family.render_rows(family_rows).encode()
                    for family, family_rows in zip(self._cached, rows, strict=True)
                ]
            ),
            kernel,
            _int64(snapshot.last_kernel_time),
        )

    def attach(self, containers: Sequence[_ContainerRows], now: int) -> None:
        """Fill the families with the containers' rows (rendered by :meth:`render`, in this
        scrape or an earlier one), in this order; ``now`` for ``last_kernel_elapsed``."""
        self.devices += sum([len(container.kernel_labels) for container in containers])
        columns = zip(*[container.blocks for container in containers], strict=True)
        for index, (family, column) in enumerate(zip(self._cached, columns, strict=False)):
            family.blocks = list(column)
            # Not a bound method: the families must not refer back to this object, or every
            # scrape's families (and the rows they hold) wait for a cyclic collection.
            family.block_rows = partial(
                _block_rows,
                self._container_rows,
                self._labels,
                self._insight_labels,
                containers,
                index,
            )
        kernel, legacy_kernel = [], []
        for container in containers:
            if container.last <= 0 or not container.kernel_labels:
                continue
            texts = container.kernel
            if texts is None or texts[0] != now:
                # The only rows that change without a new snapshot: rendered once per second.
                texts = container.kernel = (
                    now,
                    self.last_kernel.render_rows(_kernel_rows(container, now, False)).encode(),
                    self.legacy_last_kernel.render_rows(_kernel_rows(container, now, True)).encode()
                    if self.legacy
                    else b"",
                )  # two scrapes may race here: each uses what it rendered, both are right
            kernel.append(texts[1])
            legacy_kernel.append(texts[2])
        self.last_kernel.blocks = kernel
        self.last_kernel.block_rows = partial(_all_kernel_rows, containers, now, False)
        if self.legacy:
            self.legacy_last_kernel.blocks = legacy_kernel
            self.legacy_last_kernel.block_rows = partial(_all_kernel_rows, containers, now, True)


_Row = tuple[tuple[str, ...], str, int]
_AnyRow = tuple[tuple[str, ...], str, Any]
#: Label values, new-style rendering, legacy rendering.
_KernelLabels = tuple[tuple[str, ...], str, str]
#: One container's rows per kept family, and per exported device the labels of
#: ``last_kernel_elapsed``: ``(label cache, insight labels, owner, snapshot, insight)``.
_ContainerRowsOf = Callable[
    [_LabelCache, "_InsightLabels", tuple[str, str, str], SnapshotView, InsightView | None],
    tuple[list[list[_AnyRow]], tuple[_KernelLabels, ...]],
]

# How each row kind's rows are written in the function :func:`_plan` makes: per family, the
# line(s) that fill ``rows{i}`` from ``{value}`` (its field of the row's source).  In the
# device loop: ``ids``, ``values`` (with zone), ``new`` and ``old`` (the renderings).
_DEVICE_ROW: Final = "rows{i}.append((values, new, {value}))"
_LEGACY_ROW: Final = "rows{i}.append((values, old, {value}))"
_DESCRIBED_ROW: Final = "rows{i}.append(described{i}(ids, old, device, {value}))"
#: After the device loop, by row kind: ``owner``, ``rendered`` (its labels), the
#: ``state_values`` and ``state_labels``, per exported device ``insight_devices``.
_ROWS_OF_KIND: Final[Mapping[_RowKind, str]] = {
    "owner": "rows{i} = [(owner, rendered, {value})]",
    "insight": "rows{i} = [(owner, rendered, {value})]",
    "states": "rows{i} = list(zip(state_values, state_labels, state_counts({value})))",
    "insight-device": "per_device = {value}\n"
    "rows{i} = [(d, r, per_device[x]) for d, r, x in insight_devices if x < len(per_device)]",
}
#: The source object of each kept row kind's values (``kernel`` and ``mig`` rows are not a
#: container's kept rows).
_SOURCE_OF: Final[Mapping[_RowKind, str]] = {
    "device": "device",
    "owner": "snapshot",
    "states": "insight",
    "insight": "insight",
    "insight-device": "insight",
}


@cache
def _plan(table: tuple[_Family, ...], legacy: bool) -> tuple[tuple[_Kept, ...], _ContainerRowsOf]:
    """The families a container keeps lines of (each family, then with ``legacy`` the
    legacy twins) and the function that makes their rows, written out from the table once
    (as :mod:`dataclasses` writes ``__init__``): a container has few devices and many
    families, so a Python call or a ``zip`` per family would cost more than its rows.  The
    code holds only the table's attribute names (checked) and this module's templates."""
    kept: list[_Kept] = [(f, None) for f in table if f.rows in _SOURCE_OF]
    if legacy:
        kept += [(f, f.legacy) for f in table if f.rows in _SOURCE_OF and f.legacy]
    namespace: dict[str, Any] = {
        "ZONE": ZONE,
        "summed_devices": _summed_devices,
        "state_counts": _STATE_COUNTS,
    }
    per_device: list[str] = []
    per_owner: list[str] = []
    per_insight: list[str] = []
    for i, (family, twin) in enumerate(kept):
        value = f"{_SOURCE_OF[family.rows]}.{_attribute(family.field)}"
        if family.convert is not None:
            namespace[f"convert{i}"] = family.convert
            value = f"convert{i}({value})"
        if family.rows == "device":
            if twin is not None and twin.parts is not None:
                namespace[f"described{i}"] = partial(_described, twin)
            template = (
                _DEVICE_ROW
                if twin is None
                else _LEGACY_ROW
                if twin.parts is None
                else _DESCRIBED_ROW
            )
            per_device.append(template.format(i=i, value=value))
            continue
        template = _ROWS_OF_KIND[family.rows]
        (per_owner if family.rows == "owner" else per_insight).append(
            template.format(i=i, value=value)
        )
    device_lists = [f"rows{i} = []" for i, (f, _) in enumerate(kept) if f.rows == "device"]
    no_insight = [
        f"rows{i} = []" for i, (f, _) in enumerate(kept) if _SOURCE_OF[f.rows] == "insight"
    ]
    lines = [
        "def rows(label_cache, insight_labels, owner, snapshot, insight):",
        "    labels = label_cache.get",
        "    rendered, state_values, state_labels = insight_labels.owner(owner)",
        *(f"    {line}" for line in device_lists),
        "    kernel = []",
        "    exported = []",
        "    for device in summed_devices(snapshot, insight):",
        "        uuid = device.uuid.label",
        "        if uuid is None:",
        "            continue",
        "        ids = (*owner, str(device.index), uuid)",
        "        new, old = labels(ids)",
        "        values = (*ids, ZONE)",
        *(f"        {line}" for line in per_device),
        "        kernel.append((values, new, old))",
        "        exported.append((ids, device.index))",
        *(f"    {line}" for line in per_owner),
        "    if insight is None:",
        *(f"        {line}" for line in no_insight),
        "        pass",
        "    else:",
        "        device_labels = insight_labels.device",
        "        insight_devices = [(d, device_labels(d), x) for d, x in exported]",
        *(f"        {part}" for line in per_insight for part in line.split("\n")),
        f"    return [{', '.join(f'rows{i}' for i in range(len(kept)))}], tuple(kernel)",
    ]
    exec("\n".join(lines), namespace)
    made: _ContainerRowsOf = namespace.pop("rows")  # its globals must not refer back to it
    return tuple(kept), made


def _attribute(field: str) -> str:
    """``field`` checked to be a (dotted) attribute name, for the code of :func:`_plan`."""
    if not field or not all(part.isidentifier() for part in field.split(".")):
        raise ValueError(f"not an attribute name: {field!r}")
    return field


def _described(
    twin: _Legacy, ids: tuple[str, ...], old: str, device: DeviceView, value: int
) -> _AnyRow:
    """A legacy twin's row with label values of its own (``parts``) before ``zone``."""
    assert twin.parts is not None
    parts = twin.parts(device)
    extra = "".join([f',{name}="{part}"' for name, part in zip(twin.extra, parts, strict=True)])
    return ((*ids, *parts, ZONE), old[: -len(_ZONE_SUFFIX)] + extra + _ZONE_SUFFIX, value)


def _block_rows(
    container_rows: _ContainerRowsOf,
    label_cache: _LabelCache,
    insight_labels: _InsightLabels,
    containers: Sequence[_ContainerRows],
    index: int,
) -> Iterator[_AnyRow]:
    """The rows of kept family ``index`` (built again: only samples need them)."""
    for container in containers:
        rows, _ = container_rows(
            label_cache,
            insight_labels,
            container.owner,
            container.snapshot,
            container.insight,
        )
        yield from rows[index]


def _kernel_rows(container: _ContainerRows, now: int, legacy: bool) -> list[_Row]:
    """A container's ``last_kernel_elapsed`` rows at ``now``, with new-style or legacy
    labels."""
    if container.last <= 0:
        return []
    elapsed = max(now - container.last, 0)
    return [
        (values, old if legacy else new, elapsed) for values, new, old in container.kernel_labels
    ]


def _all_kernel_rows(
    containers: Sequence[_ContainerRows], now: int, legacy: bool
) -> Iterator[_Row]:
    for container in containers:
        yield from _kernel_rows(container, now, legacy)


class _ContainerRows:
    """One container's rendered rows, reused by later scrapes while its snapshot, insight and
    owner are the same objects and names (the monitor never changes a snapshot or insight:
    a changed value comes in a new object)."""

    __slots__ = ("blocks", "insight", "kernel", "kernel_labels", "last", "owner", "snapshot")

    def __init__(
        self,
        snapshot: SnapshotView,
        insight: InsightView | None,
        owner: tuple[str, str, str],
        blocks: tuple[bytes, ...],
        kernel_labels: tuple[_KernelLabels, ...],
        last: int,
    ) -> None:
        self.snapshot = snapshot
        self.insight = insight
        self.owner = owner
        #: The sample lines (UTF-8) per family of ``_Families._cached``.
        self.blocks = blocks
        #: Per exported device: label values, new-style and legacy rendering.
        self.kernel_labels = kernel_labels
        #: The snapshot's last kernel time (Go's int64).
        self.last = last
        #: ``last_kernel_elapsed`` rendered for one ``now``: (now, lines, legacy lines).
        self.kernel: tuple[int, bytes, bytes] | None = None

    def reusable(
        self, snapshot: SnapshotView, insight: InsightView | None, owner: tuple[str, str, str]
    ) -> bool:
        """Whether these rows are the container's rows for this snapshot, insight, owner."""
        return self.snapshot is snapshot and self.insight is insight and self.owner == owner


def _summed_devices(snapshot: SnapshotView, insight: InsightView | None) -> Sequence[DeviceView]:
    """The snapshot's devices, or the sums without exited slots when the monitor made them."""
    if insight is None:
        return snapshot.devices
    without = insight.devices
    return snapshot.devices if without is None else without


class VGpuCollector(Collector):
    """Upstream's vGPUmonitor metrics (plus ``hami_trio_container_blocked``) per scrape.

    Args:
        monitor: the monitor's read-only view (latest snapshots, MIG pause state).
        pod_source: resolves a container's pod UID to its namespace and name.
        node_name: this node; with ``kubernetes=True`` only pods labelled
            ``hami.io/vgpu-node=<node_name>`` are exported (upstream's selection).  Also the
            ``node`` label of the host GPU families.
        kubernetes: apply upstream's pod matching (label and ``spec.containers``); False for
            ``--no-kubernetes``, where every container is exported under its pod UID.
        all_pods: every known pod, for ``hami_mig_device_info`` (the Kubernetes source's
            ``pods``); None: no MIG rows.
        host: the NVML sampler for host GPU families; None: no host families.
        legacy: also export upstream's legacy names and labels.
        wall_clock: Unix time for ``last_kernel_elapsed`` (tests inject one).
        insights: also export the process, limit and feedback-state families (from the
            usage view's ``insights``).
    """

    def __init__(
        self,
        monitor: MonitorView,
        pod_source: PodSource,
        *,
        node_name: str,
        kubernetes: bool = True,
        all_pods: Callable[[], Mapping[str, PodInfo]] | None = None,
        host: HostGpuSampler | None = None,
        legacy: bool = False,
        wall_clock: Callable[[], float] = time.time,
        insights: bool = False,
    ) -> None:
        self._monitor = monitor
        self._pods = pod_source
        self._node = node_name
        self._kubernetes = kubernetes
        self._all_pods = all_pods
        self._host = host
        self._legacy = legacy
        self._clock = wall_clock
        self._insights = insights
        # Decoded MIG annotations by pod UID: (raw value, allocations or None when invalid).
        # Scrapes may run in two threads at once, hence the lock.
        self._mig_cache: dict[str, tuple[str, tuple[MigAllocation, ...] | None]] = {}
        self._mig_lock = threading.Lock()
        self._warnings = RateLimiter(WARNING_INTERVAL, max_keys=4096)
        self._labels = _LabelCache()
        self._insight_labels = _InsightLabels()
        # Each exported container's rendered rows as of the latest scrape, by monitor key.
        self._rendered: dict[Any, _ContainerRows] = {}
        self._errors = dict.fromkeys(COLLECTOR_ERROR_PHASES, 0)
        self._errors_lock = threading.Lock()
        self._states: dict[ExportState, int] = dict.fromkeys(EXPORT_STATES, 0)

    def describe(self) -> list[Metric]:
        """The families this collector can export (lets the registry reject duplicates)."""
        families = _Families(self._legacy, _LabelCache())
        host = host_gpu_families((), "", legacy=self._legacy, const_labels=[("zone", ZONE)])
        return [*host, *families.exposed(), self._error_family(), self._state_family()]

    def collect(self) -> list[Metric]:
        """Build every family from the latest snapshots (called by the registry per scrape)."""
        families = _Families(self._legacy, self._labels, self._insight_labels)
        self._collect_containers(families)
        self._labels.trim(families.devices)
        self._insight_labels.trim(families.devices)
        self._collect_mig(families)
        host = self._collect_host()
        # Like Go's registry, a family without samples is not exposed at all.
        return [
            *(family for family in host if family.samples),
            *(family for family in families.exposed() if family),
            self._error_family(),
            self._state_family(),
        ]

    def errors(self) -> dict[str, int]:
        """``hami_trio_collector_errors_total`` by phase (a copy)."""
        with self._errors_lock:
            return dict(self._errors)

    def _error_family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "hami_trio_collector_errors",
            "Parts of a scrape dropped because of the data they hold (tenant input), by phase",
            labels=("phase",),
        )
        for phase, count in self.errors().items():
            family.add_metric((phase,), count)
        return family

    def states(self) -> dict[ExportState, int]:
        """Container directories by export state as of the latest scrape (a copy)."""
        return dict(self._states)

    def _state_family(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "hami_trio_monitor_containers",
            "Container directories of the latest tick by export state, as of this scrape",
            labels=("state",),
        )
        for state, count in self._states.items():
            family.add_metric((state,), count)
        return family

    def report_failure(self, phase: str, key: Hashable, msg: str, *args: object) -> None:
        """Count one dropped part of a scrape in ``hami_trio_collector_errors_total{phase}``
        and warn (rate-limited per ``key``); other collectors of the agent use it too."""
        with self._errors_lock:
            self._errors[phase] += 1
        self._warnings.log(logger, logging.WARNING, key, msg, *args)

    _failed = report_failure

    def _collect_containers(self, families: _Families) -> None:
        now = int(self._clock())
        paused = self._monitor.paused
        states: dict[ExportState, int] = dict.fromkeys(EXPORT_STATES, 0)
        # One usage read for the whole scrape: its containers and insights belong together.
        view = self._monitor.usage()
        insights: Mapping[Any, InsightView] = view.insights if self._insights else {}
        previous = self._rendered
        rendered: dict[Any, _ContainerRows] = {}
        for key, container in list(view.containers.items()):
            try:
                decision = export_state(
                    container,
                    self._pods.lookup(container.pod_uid),
                    node_name=self._node,
                    kubernetes=self._kubernetes,
                    paused=paused,
                )
                states[decision.state] += 1
                snapshot = container.snapshot
                if decision.pod is None or not decision.exported or snapshot is None:
                    continue
                pod = decision.pod
                owner = (pod.namespace, pod.name, container.container_name)
                insight = insights.get(key)
                rows = previous.get(key)
                if rows is None or not rows.reusable(snapshot, insight, owner):
                    # Built whole before any of it reaches the families: a failure here
                    # costs this container all its rows and nothing else.
                    rows = families.render(owner, snapshot, insight)
            except Exception as exc:
                self._failed(
                    "container",
                    ("container", container.pod_uid, container.container_name),
                    "container %s of pod %s: left out of /metrics: %s: %s",
                    container.container_name,
                    container.pod_uid,
                    type(exc).__name__,
                    exc,
                )
                continue
            rendered[key] = rows
        families.attach(list(rendered.values()), now)
        # Only the containers of this scrape are kept (two scrapes at once: the last one's).
        self._rendered = rendered
        self._states = states

    def _allocations(self, pod: PodInfo) -> tuple[MigAllocation, ...] | None:
        raw = pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION, "")
        with self._mig_lock:
            cached = self._mig_cache.get(pod.uid)
            if cached is not None and cached[0] == raw:
                return cached[1]
        try:
            decoded: tuple[MigAllocation, ...] | None = decode_mig_allocations(raw)
        except Exception as exc:  # MigAnnotationError, or a decoder bug: this pod only
            decoded = None
            self._failed(
                "mig",
                ("mig", pod.uid),
                "pod %s/%s: ignoring annotation %s (%d characters): %s",
                pod.namespace,
                pod.name,
                MIG_ALLOCATIONS_ANNOTATION,
                len(raw),
                exc if isinstance(exc, MigAnnotationError) else f"{type(exc).__name__}: {exc}",
            )
        with self._mig_lock:
            self._mig_cache[pod.uid] = (raw, decoded)
        return decoded

    def _collect_mig(self, families: _Families) -> None:
        if self._all_pods is None:
            return
        try:
            pods = self._all_pods()
            with self._mig_lock:
                for uid in [uid for uid in self._mig_cache if uid not in pods]:
                    del self._mig_cache[uid]
        except Exception as exc:
            self._failed(
                "pods",
                "pods",
                "MIG rows left out: cannot list pods: %s: %s",
                type(exc).__name__,
                exc,
            )
            return
        for pod in list(pods.values()):
            mig_rows, legacy_rows = len(families.mig), len(families.legacy_mig)
            try:
                self._collect_pod_mig(families, pod)
            except Exception as exc:
                families.mig.truncate(mig_rows)
                families.legacy_mig.truncate(legacy_rows)
                self._failed(
                    "mig",
                    ("mig", pod.uid),
                    "pod %s/%s: MIG rows left out of /metrics: %s: %s",
                    pod.namespace,
                    pod.name,
                    type(exc).__name__,
                    exc,
                )

    def _collect_pod_mig(self, families: _Families, pod: PodInfo) -> None:
        if self._kubernetes and pod.labels.get(NODE_LABEL) != self._node:
            return
        allocations = self._allocations(pod)
        for allocation in allocations or ():
            if not allocation.realised:
                continue
            name = mig_container_name(
                pod.init_containers, pod.containers, allocation.container_index
            )
            if name is None:
                self._warnings.log(
                    logger,
                    logging.WARNING,
                    ("mig-index", pod.uid),
                    "pod %s/%s: MIG allocation container index %d is out of range",
                    pod.namespace,
                    pod.name,
                    allocation.container_index,
                )
                continue
            ids = (pod.namespace, pod.name, name, str(allocation.device_index))
            values = (
                *ids,
                allocation.gpu_uuid,
                allocation.mig_uuid,
                allocation.profile,
                str(allocation.gpu_instance_id),
                str(allocation.compute_instance_id),
                ZONE,
            )
            families.mig.add(values, render_labels(families.mig.labelnames, values), 1)
            if families.legacy:
                old = (*ids, allocation.gpu_uuid, str(allocation.gpu_instance_id), ZONE)
                families.legacy_mig.add(old, render_labels(families.legacy_mig.labelnames, old), 1)

    def _collect_host(self) -> list[Metric]:
        if self._host is None:
            return []
        # A scrape only reads: hostgpu pauses and resumes NVML (serve_nvml_release).
        # While the MIG lock holds the monitor a scrape does not touch NVML, even before
        # the release task has noticed the lock.
        try:
            if self._monitor.paused:
                return []
            return host_gpu_families(
                self._host.sample(), self._node, legacy=self._legacy, const_labels=[("zone", ZONE)]
            )
        except Exception as exc:
            self._failed(
                "host", "host", "host GPU metrics left out: %s: %s", type(exc).__name__, exc
            )
            return []


class BuildInfoCollector(Collector):
    """``hami_build_info{version, python_version, trio_version} 1`` (upstream's build info)."""

    def __init__(self) -> None:
        self._labels = (__version__, platform.python_version(), trio.__version__)

    def collect(self) -> Iterator[Metric]:
        """Yield the single constant sample."""
        family = GaugeMetricFamily(
            "hami_build_info",
            "hami build metadata exposed as labels with a constant value of 1.",
            labels=("version", "python_version", "trio_version"),
        )
        family.add_metric(self._labels, 1)
        yield family

    def describe(self) -> Iterable[Metric]:
        """Same as :meth:`collect` (the labels are constant)."""
        return self.collect()
