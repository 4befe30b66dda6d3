"""Per-pod families: what the scheduler allocated, pod metadata for joins (a collector).

How this works: :class:`PodCollector` is registered beside the vGPU collector when the agent
watches Kubernetes.  Each scrape reads the pod source's pods on this node (labelled
``hami.io/vgpu-node=<node>``, the same selection as the container metrics) and renders
``hami_trio_container_allocated_memory_bytes`` / ``..._allocated_cores_ratio`` (one row per
device HAMi's ``hami.io/vgpu-devices-allocated`` annotation gives a container,
:mod:`hami_trio.pods.allocated`), ``hami_trio_pod_info`` and ``hami_trio_pod_labels`` (the
labels of ``--pod-labels-allowlist``, sanitised by :func:`label_names`).  A pod's rows are
rendered once and reused while the pod object is unchanged, and its annotation is decoded
only when its text changed.  A malformed annotation costs that pod's allocation rows only:
counted in ``hami_trio_collector_errors_total{phase="allocated"}``, with one rate-limited
warning naming the pod.  Every family, label and rule: docs/metrics.md.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from hami_trio.logs import RateLimiter
from hami_trio.metrics.exportstate import COMPLETED_PHASES, NODE_LABEL
from hami_trio.metrics.exposition import FastGauge, render_labels
from hami_trio.pods.allocated import (
    ALLOCATED_ANNOTATION,
    AllocatedAnnotationError,
    ContainerAllocation,
    allocated_containers,
    decode_allocated,
)
from hami_trio.pods.source import PodInfo

__all__ = [
    "MAX_ALLOWLIST",
    "MAX_LABEL_KEY_CHARS",
    "MAX_LABEL_VALUE_CHARS",
    "PodCollector",
    "label_names",
    "parse_label_allowlist",
]

_log = logging.getLogger(__name__)

#: The most pod labels ``--pod-labels-allowlist`` may name.
MAX_ALLOWLIST: Final = 32
#: The longest label key accepted in the allow-list (Kubernetes: 253 prefix + / + 63 name).
MAX_LABEL_KEY_CHARS: Final = 317
#: Label values longer than this are cut (Kubernetes allows 63 characters).
MAX_LABEL_VALUE_CHARS: Final = 128
#: Seconds between two warnings about the same pod.
WARNING_INTERVAL: Final = 600.0

_INVALID: Final = re.compile(r"[^a-zA-Z0-9_]")
_CONTAINER: Final = ("namespace", "pod", "container", "vdevice_index", "device_uuid")

#: ``(phase, key, message, *args)``: count one dropped part of a scrape and warn.
FailureReporter = Callable[..., None]


def parse_label_allowlist(text: str, *, name: str = "--pod-labels-allowlist") -> tuple[str, ...]:
    """The pod label keys of a comma-separated allow-list, in order, without duplicates.

    Spaces around a key and empty items are ignored (``"team, app,"`` is ``team`` and
    ``app``).

    Raises:
        ValueError: more than :data:`MAX_ALLOWLIST` keys, a key longer than
            :data:`MAX_LABEL_KEY_CHARS`, or one with characters a label key cannot hold
            (spaces, controls, ``=``, non-ASCII); the message starts with ``name``.
    """
    keys: list[str] = []
    for item in text.split(","):
        key = item.strip()
        if not key or key in keys:
            continue
        if len(key) > MAX_LABEL_KEY_CHARS:
            raise ValueError(f"{name}: label key of {len(key)} characters is too long")
        if not key.isascii() or not key.isprintable() or any(c in key for c in " =\"'"):
            raise ValueError(f"{name}: {key!r} is not a Kubernetes label key")
        keys.append(key)
    if len(keys) > MAX_ALLOWLIST:
        raise ValueError(f"{name}: {len(keys)} label keys, at most {MAX_ALLOWLIST}")
    return tuple(keys)


def label_names(keys: Iterable[str]) -> dict[str, str]:
    """Prometheus label names for pod label keys: ``label_`` + the key, invalid characters
    replaced by ``_`` (``app.kubernetes.io/name`` -> ``label_app_kubernetes_io_name``).

    Keys whose names collide all get ``_conflict1``, ``_conflict2``, ... in the sorted order
    of the keys, so the names do not depend on the order of the allow-list (what
    kube-state-metrics does).

    Returns:
        key -> label name, for every key.
    """
    ordered = sorted(set(keys))
    plain = {key: "label_" + _INVALID.sub("_", key) for key in ordered}
    counts: dict[str, int] = {}
    for name in plain.values():
        counts[name] = counts.get(name, 0) + 1
    taken = {name for name, count in counts.items() if count == 1}
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for key in ordered:
        name = plain[key]
        if counts[name] == 1:
            names[key] = name
            continue
        number = seen.get(name, 0)
        while True:
            number += 1
            candidate = f"{name}_conflict{number}"
            if candidate not in taken:
                break
        seen[name] = number
        taken.add(candidate)
        names[key] = candidate
    return names


def _cut(value: str) -> str:
    return value if len(value) <= MAX_LABEL_VALUE_CHARS else value[:MAX_LABEL_VALUE_CHARS]


_Row = tuple[tuple[str, ...], str, int]


class _Family(FastGauge):
    """A :class:`FastGauge` that renders its text once: the collector hands the same family
    object to every scrape of the same pod snapshot, and nothing changes it after that."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        super().__init__(name, documentation, labelnames)
        self._encoded: bytes | None = None

    def encoded(self, openmetrics: bool = False) -> bytes:
        # A gauge's lines are the same in both formats, so one cached text serves both.
        encoded = self._encoded
        if encoded is None:
            encoded = self._encoded = b"".join(super().pieces(openmetrics))
        return encoded

    def pieces(self, openmetrics: bool = False) -> list[bytes]:
        return [self.encoded(openmetrics)]


@dataclass(frozen=True, slots=True)
class _PodRows:
    """One pod's rendered rows (reused while the pod object is the same)."""

    pod: PodInfo
    info: _Row
    labels: _Row | None
    memory: tuple[_Row, ...]
    cores: tuple[_Row, ...]


class PodCollector(Collector):
    """Allocation, pod info and pod label families (see the module docstring).

    Args:
        all_pods: the pod source's pods by UID (the Kubernetes watch's ``pods``): an
            immutable snapshot, a new object after every change (the rows of the same
            object are reused as they are).
        node_name: this node: only pods labelled ``hami.io/vgpu-node=<node_name>`` count,
            and the ``node`` label of ``hami_trio_pod_info``.
        label_allowlist: the pod label keys for ``hami_trio_pod_labels`` (empty: no family).
        report_failure: counts a dropped part in ``hami_trio_collector_errors_total`` (the
            vGPU collector's :meth:`~hami_trio.metrics.collector.VGpuCollector.report_failure`);
            None: log only.
    """

    def __init__(
        self,
        all_pods: Callable[[], Mapping[str, PodInfo]],
        *,
        node_name: str,
        label_allowlist: Sequence[str] = (),
        report_failure: FailureReporter | None = None,
    ) -> None:
        self._all_pods = all_pods
        self._node = node_name
        names = label_names(label_allowlist)
        self._label_keys = tuple(sorted(names, key=names.__getitem__))
        self._label_names = ("namespace", "pod", *(names[key] for key in self._label_keys))
        self._report = report_failure
        self._warnings = RateLimiter(WARNING_INTERVAL, max_keys=4096)
        self._rows: dict[str, _PodRows] = {}
        # Decoded allocations by pod UID: (raw value, named devices or None when invalid).
        self._decoded: dict[str, tuple[str, tuple[ContainerAllocation, ...] | None]] = {}
        # The last snapshot of pods and the rows of each family it gave.
        self._last: tuple[Mapping[str, PodInfo], list[Metric]] | None = None
        # Scrapes may run in two threads at once; this collector's work is small: one at a time.
        self._lock = threading.Lock()

    def _families(self) -> list[FastGauge]:
        families: list[FastGauge] = [
            _Family(
                "hami_trio_container_allocated_memory_bytes",
                "Device memory HAMi's scheduler allocated to the container (its limit), bytes",
                _CONTAINER,
            ),
            _Family(
                "hami_trio_container_allocated_cores_ratio",
                "Share of the device's cores HAMi's scheduler allocated to the container, in "
                "percent (0-100; 0: no core limit)",
                _CONTAINER,
            ),
            _Family(
                "hami_trio_pod_info",
                "1 for every vGPU pod on this node, with its UID and phase",
                ("namespace", "pod", "pod_uid", "node", "phase"),
            ),
        ]
        if self._label_keys:
            families.append(
                _Family(
                    "hami_trio_pod_labels",
                    "1 for every vGPU pod on this node, with the labels of --pod-labels-allowlist",
                    self._label_names,
                )
            )
        return families

    def describe(self) -> list[Metric]:
        """The families this collector exports (lets the registry reject duplicates)."""
        return list(self._families())

    def collect(self) -> list[Metric]:
        """Build the families from the pod source's pods (called per scrape)."""
        with self._lock:
            return self._collect()

    def _collect(self) -> list[Metric]:
        families = self._families()
        memory, cores, info = families[0], families[1], families[2]
        labels = families[3] if len(families) > 3 else None
        try:
            pods = self._all_pods()
        except Exception as exc:
            self._failed(
                "pods",
                "pods",
                "pod rows left out: cannot list pods: %s: %s",
                type(exc).__name__,
                exc,
            )
            return []
        last = self._last
        if last is not None and last[0] is pods:
            # The same snapshot as last scrape (nothing failed then): the same families,
            # rendered once.
            return list(last[1])
        failed = False
        rows: dict[str, _PodRows] = {}
        previous = self._rows
        for uid, pod in list(pods.items()):
            if pod.labels.get(NODE_LABEL) != self._node:
                continue
            cached = previous.get(uid)
            if cached is None or cached.pod is not pod:
                try:
                    cached = self._render(pod)
                except Exception as exc:  # a name that is not valid Unicode: this pod only
                    self._failed(
                        "allocated",
                        ("pod", uid),
                        "pod %r: rows left out of /metrics: %s: %s",
                        f"{pod.namespace}/{pod.name}",
                        type(exc).__name__,
                        exc,
                    )
                    failed = True
                    continue
            rows[uid] = cached
            info.add(*cached.info)
            if labels is not None and cached.labels is not None:
                labels.add(*cached.labels)
            for row in cached.memory:
                memory.add(*row)
            for row in cached.cores:
                cores.add(*row)
        self._rows = rows
        self._decoded = {uid: value for uid, value in self._decoded.items() if uid in rows}
        exported: list[Metric] = [family for family in families if len(family)]
        self._last = None if failed else (pods, exported)
        return exported

    def _failed(self, phase: str, key: Hashable, msg: str, *args: object) -> None:
        if self._report is not None:
            self._report(phase, key, msg, *args)
        else:
            self._warnings.log(_log, logging.WARNING, key, msg, *args)

    def _allocations(self, pod: PodInfo) -> tuple[ContainerAllocation, ...] | None:
        raw = pod.annotations.get(ALLOCATED_ANNOTATION, "")
        cached = self._decoded.get(pod.uid)
        if cached is not None and cached[0] == raw:
            return cached[1]
        named: tuple[ContainerAllocation, ...] | None
        try:
            named, orphans = allocated_containers(
                pod.init_containers, pod.containers, decode_allocated(raw)
            )
        except Exception as exc:  # AllocatedAnnotationError, or a decoder bug: this pod only
            named = None
            self._failed(
                "allocated",
                ("allocated", pod.uid),
                "pod %s/%s: ignoring annotation %s (%d characters): %s",
                pod.namespace,
                pod.name,
                ALLOCATED_ANNOTATION,
                len(raw),
                exc
                if isinstance(exc, AllocatedAnnotationError)
                else f"{type(exc).__name__}: {exc}",
            )
        else:
            if orphans:
                self._warnings.log(
                    _log,
                    logging.WARNING,
                    ("allocated-index", pod.uid),
                    "pod %s/%s: annotation %s lists devices for container entries %s, but the "
                    "pod has %d init containers and %d containers",
                    pod.namespace,
                    pod.name,
                    ALLOCATED_ANNOTATION,
                    ", ".join(map(str, orphans[:5])),
                    len(pod.init_containers),
                    len(pod.containers),
                )
        self._decoded[pod.uid] = (raw, named)
        return named

    def _render(self, pod: PodInfo) -> _PodRows:
        info_values = (pod.namespace, pod.name, pod.uid, self._node, pod.phase)
        info_row: _Row = (
            info_values,
            render_labels(("namespace", "pod", "pod_uid", "node", "phase"), info_values),
            1,
        )
        labels_row: _Row | None = None
        if self._label_keys:
            values = (
                pod.namespace,
                pod.name,
                *(_cut(pod.labels.get(key, "")) for key in self._label_keys),
            )
            labels_row = (values, render_labels(self._label_names, values), 1)
        memory: list[_Row] = []
        cores: list[_Row] = []
        allocations = self._allocations(pod)
        if allocations and pod.phase not in COMPLETED_PHASES:
            for allocation in allocations:
                ids = (
                    pod.namespace,
                    pod.name,
                    allocation.container,
                    str(allocation.vdevice_index),
                    allocation.device.uuid,
                )
                rendered = render_labels(_CONTAINER, ids)
                memory.append((ids, rendered, allocation.device.memory_bytes))
                cores.append((ids, rendered, allocation.device.cores))
        return _PodRows(pod, info_row, labels_row, tuple(memory), tuple(cores))
