"""The broker's self-metrics: plain counters on the hot path, a Prometheus collector to read them.

How this works: a prometheus-client metric takes a lock on every update, a visible share of a
microsecond exchange, so :class:`BrokerStats` keeps plain integers (one per outcome in
:data:`OUTCOMES`, one per latency bucket) on the broker's trio thread, and
:class:`BrokerCollector` turns a copy of them into ``hami_trio_broker_exchanges_total``,
``..._exchanges_in_flight`` and ``..._exchange_duration_seconds`` at scrape time, from any
thread, never going backwards.  The names and why: docs/metrics.md.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Final, Literal

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "BrokerCollector", "BrokerStats", "Outcome"]

Outcome = Literal["ok", "invalid", "timeout", "eof", "rejected_full", "evicted", "peer_error"]

#: Every outcome, in export order.  Meaning:
#: ``ok`` answered with the caller's PID; ``invalid`` answered status 1; ``timeout`` the
#: deadline expired before 8 bytes came; ``eof`` the peer closed before 8 bytes; ``rejected_full``
#: closed at accept because every slot was taken; ``peer_error`` a socket error or an unusable
#: peer credential (PID <= 0), closed without answer; ``evicted`` is part of the shared metric
#: contract but this broker never evicts (a full broker closes the newcomer instead), so it stays 0.
OUTCOMES: Final[tuple[Outcome, ...]] = (
    "ok",
    "invalid",
    "timeout",
    "eof",
    "rejected_full",
    "evicted",
    "peer_error",
)

#: Upper bounds (seconds) of the latency histogram: microsecond answers up to the deadline.
DURATION_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class BrokerStats:
    """Counters of one broker.  Only the broker's trio thread writes; anyone may read."""

    __slots__ = ("bucket_counts", "counts", "duration_sum")

    def __init__(self) -> None:
        self.counts: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        # Non-cumulative: bucket_counts[i] counts durations in (BUCKETS[i-1], BUCKETS[i]];
        # the last slot is +Inf.
        self.bucket_counts: list[int] = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0

    def record(self, outcome: Outcome, duration: float | None) -> None:
        """Count one exchange; ``duration`` (seconds) is None when it was never started."""
        self.counts[outcome] += 1
        if duration is not None:
            self.bucket_counts[bisect_left(DURATION_BUCKETS, duration)] += 1
            self.duration_sum += duration

    @property
    def total(self) -> int:
        """All exchanges counted so far."""
        return sum(self.counts.values())


class BrokerCollector(Collector):
    """Exports a :class:`BrokerStats` and an in-flight count in Prometheus form."""

    def __init__(self, stats: BrokerStats, in_flight: Callable[[], int]) -> None:
        self._stats = stats
        self._in_flight = in_flight

    def describe(self) -> Iterator[Metric]:
        """Names only, so registering does not read the stats (and checks for clashes)."""
        yield CounterMetricFamily("hami_trio_broker_exchanges", _EXCHANGES_HELP, labels=["outcome"])
        yield GaugeMetricFamily("hami_trio_broker_exchanges_in_flight", _IN_FLIGHT_HELP)
        yield HistogramMetricFamily("hami_trio_broker_exchange_duration_seconds", _DURATION_HELP)

    def collect(self) -> Iterator[Metric]:
        """One consistent-enough snapshot of the counters."""
        counts = dict(self._stats.counts)
        buckets = list(self._stats.bucket_counts)
        total_sum = self._stats.duration_sum
        exchanges = CounterMetricFamily(
            "hami_trio_broker_exchanges", _EXCHANGES_HELP, labels=["outcome"]
        )
        for outcome in OUTCOMES:
            exchanges.add_metric([outcome], counts[outcome])
        yield exchanges
        yield GaugeMetricFamily(
            "hami_trio_broker_exchanges_in_flight", _IN_FLIGHT_HELP, value=self._in_flight()
        )
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*DURATION_BUCKETS, float("inf")), buckets, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
        yield HistogramMetricFamily(
            "hami_trio_broker_exchange_duration_seconds",
            _DURATION_HELP,
            buckets=cumulative,
            sum_value=total_sum,
        )


_EXCHANGES_HELP = "Host PID broker exchanges by outcome."
_IN_FLIGHT_HELP = "Host PID broker exchanges waiting for their request (holding a slot)."
_DURATION_HELP = "Host PID broker exchange time from accept to close, in seconds."
