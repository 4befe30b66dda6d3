"""What the demo reads from the agent's ``/metrics``: one scrape, one :class:`AgentSample`.

The demo looks at the agent only from outside, the way Prometheus and an operator do: the
live table's memory, SM utilisation and "blocked" columns, the MIG pause, the monitor's tick
count and the broker's exchange counters and latency histogram all come from the Prometheus
text the agent serves.  :func:`parse_metrics` is pure (text in, sample out); :func:`scrape`
fetches the page in a worker thread with the standard library, never through a proxy (the
agent listens on the loopback interface).
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import trio
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "AgentSample",
    "ContainerMetrics",
    "bucket_quantile",
    "parse_metrics",
    "scrape",
]

#: Seconds one scrape may take before it counts as failed.
SCRAPE_TIMEOUT: Final = 3.0

_BROKER_EXCHANGES: Final = "hami_trio_broker_exchanges_total"
_BROKER_DURATION: Final = "hami_trio_broker_exchange_duration_seconds"
_TICKS: Final = "hami_trio_monitor_tick_duration_seconds_count"


@dataclass(frozen=True, slots=True)
class ContainerMetrics:
    """One container as the agent exports it (device 0; the demo's workloads have one).

    ``processes`` maps each state of ``hami_trio_container_processes`` (``running``,
    ``exited``, ``unknown``) to its count; ``core_limit`` is device 0's
    ``hami_trio_container_core_limit_ratio``; ``switch``, ``blocked_seconds`` and ``blocks``
    are the monitor's ``utilization_switch`` and blocking counters.
    """

    memory_used: int | None = None
    memory_limit: int | None = None
    sm_util: int | None = None
    blocked: bool | None = None
    processes: Mapping[str, int] = field(default_factory=dict)
    core_limit: int | None = None
    switch: int | None = None
    blocked_seconds: float | None = None
    blocks: int | None = None


@dataclass(frozen=True, slots=True)
class AgentSample:
    """One scrape of ``/metrics``.

    Attributes:
        t: ``time.monotonic()`` when the answer arrived.
        containers: by ``(pod, container)`` label values.
        mig_paused: ``hami_trio_monitor_mig_paused``.
        ticks: monitor ticks completed (the tick histogram's count).
        exchanges: broker exchanges by outcome.
        latency_buckets: the broker latency histogram, ``(upper bound, cumulative count)``.
        latency_sum: the histogram's sum (seconds).
        liveness_checked: ``hami_trio_monitor_process_liveness_checked`` (exited processes
            are told from running ones).
    """

    t: float
    containers: Mapping[tuple[str, str], ContainerMetrics] = field(default_factory=dict)
    mig_paused: bool | None = None
    ticks: int | None = None
    exchanges: Mapping[str, int] = field(default_factory=dict)
    latency_buckets: tuple[tuple[float, int], ...] = ()
    latency_sum: float = 0.0
    liveness_checked: bool | None = None

    @property
    def latency_count(self) -> int:
        """Exchanges in the latency histogram."""
        return self.latency_buckets[-1][1] if self.latency_buckets else 0


def _container(values: Mapping[str, float]) -> ContainerMetrics:
    def number(name: str) -> int | None:
        value = values.get(name)
        return None if value is None else int(value)

    blocked = values.get("blocked")
    return ContainerMetrics(
        memory_used=number("memory_used"),
        memory_limit=number("memory_limit"),
        sm_util=number("sm_util"),
        blocked=None if blocked is None else blocked == 1,
        processes={
            key.removeprefix("state:"): int(v) for key, v in values.items() if key[:6] == "state:"
        },
        core_limit=number("core_limit"),
        switch=number("switch"),
        blocked_seconds=values.get("blocked_seconds"),
        blocks=number("blocks"),
    )


def parse_metrics(text: str, t: float) -> AgentSample:
    """Pick the demo's figures out of Prometheus text (pure).

    Args:
        text: the ``/metrics`` body (text format 0.0.4).
        t: the time to stamp the sample with.

    Raises:
        ValueError: the text is not Prometheus text format.
    """
    fields: dict[tuple[str, str], dict[str, float]] = {}
    exchanges: dict[str, int] = {}
    buckets: list[tuple[float, int]] = []
    latency_sum = 0.0
    paused: bool | None = None
    ticks: int | None = None
    liveness: bool | None = None
    per_container = {
        "hami_vgpu_memory_used_bytes": "memory_used",
        "hami_vgpu_memory_limit_bytes": "memory_limit",
        "hami_container_device_utilization_ratio": "sm_util",
        "hami_trio_container_core_limit_ratio": "core_limit",
    }
    per_owner = {
        "hami_trio_container_blocked": "blocked",
        "hami_trio_container_utilization_switch": "switch",
        "hami_trio_container_blocked_seconds_total": "blocked_seconds",
        "hami_trio_container_blocks_total": "blocks",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name in per_container and labels.get("vdevice_index") == "0":
                key = (labels.get("pod", ""), labels.get("container", ""))
                fields.setdefault(key, {})[per_container[name]] = value
            elif name in per_owner:
                key = (labels.get("pod", ""), labels.get("container", ""))
                fields.setdefault(key, {})[per_owner[name]] = value
            elif name == "hami_trio_container_processes":
                key = (labels.get("pod", ""), labels.get("container", ""))
                fields.setdefault(key, {})[f"state:{labels.get('state', '')}"] = value
            elif name == "hami_trio_monitor_process_liveness_checked":
                liveness = value == 1
            elif name == "hami_trio_monitor_mig_paused":
                paused = value == 1
            elif name == _TICKS:
                ticks = int(value)
            elif name == _BROKER_EXCHANGES:
                exchanges[labels.get("outcome", "")] = int(value)
            elif name == f"{_BROKER_DURATION}_bucket":
                buckets.append((float(labels["le"]), int(value)))
            elif name == f"{_BROKER_DURATION}_sum":
                latency_sum = value
    return AgentSample(
        t=t,
        containers={key: _container(values) for key, values in fields.items()},
        mig_paused=paused,
        ticks=ticks,
        liveness_checked=liveness,
        exchanges=exchanges,
        latency_buckets=tuple(sorted(buckets)),
        latency_sum=latency_sum,
    )


def bucket_quantile(buckets: tuple[tuple[float, int], ...], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile ``q`` (None when empty).

    An upper bound, not an interpolation: "p99 <= 0.5 ms" is what the buckets can say.
    """
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    for bound, count in buckets:
        if count >= rank:
            return bound
    return math.inf


def _fetch(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=SCRAPE_TIMEOUT) as response:
        body: bytes = response.read()
    return body.decode("utf-8")


async def scrape(url: str) -> AgentSample:
    """Fetch and parse ``url`` (in a worker thread; abandoned after :data:`SCRAPE_TIMEOUT`).

    Raises:
        OSError: the agent did not answer (``urllib.error.URLError`` is one).
        ValueError: the answer was not Prometheus text.
    """
    text = await trio.to_thread.run_sync(_fetch, url, abandon_on_cancel=True)
    return parse_metrics(text, time.monotonic())
