"""The monitor's self-metrics: plain counters where it works, a Prometheus collector to read them.

How this works: as in the broker (:mod:`hami_trio.broker.stats`), the monitor keeps plain
numbers - :class:`MonitorStats` for the loop, the lister, the removals and the usage read,
:class:`~hami_trio.monitor.scope.StrayStats` for the feedback's stray claims - and
:class:`MonitorCollector` turns a copy of them into the ``hami_trio_monitor_*`` families at
scrape time, from any thread, in one fixed order.  Each number has one writer: the trio
thread (the tick, the MIG pause, the removals) or the usage read (one at a time, under the
monitor's usage lock, in a worker thread); the rejections both count have one table each,
summed when read.  The names, help texts and labels are those the monitor has always
exported: docs/metrics.md.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.miglock import MIG_LOCK_REASONS
from hami_trio.monitor.scope import StrayStats
from hami_trio.monitor.watch import WATCH_FALLBACKS

__all__ = [
    "DURATION_BUCKETS",
    "DurationStats",
    "MonitorCollector",
    "MonitorStats",
    "StrayCollector",
]

#: Upper bounds (seconds) of the tick and usage-read histograms.
DURATION_BUCKETS: Final = (
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
    2.5,
    5.0,
    10.0,
)
#: The ``check`` label values of ``hami_trio_monitor_descriptors_exhausted_total``.
DESCRIPTOR_CHECKS: Final = ("mig_lock", "containers")
#: The ``outcome`` label values of ``hami_trio_monitor_removals_total``.
REMOVAL_OUTCOMES: Final = ("removed", "failed")


def _count(counts: dict[str, int], key: str, by: int = 1) -> None:
    # A label value outside the table is added after it, as prometheus-client's own
    # counters do for a new child.
    counts[key] = counts.get(key, 0) + by


class DurationStats:
    """One histogram's counts: non-cumulative, ``bucket_counts[i]`` counts the durations in
    ``(DURATION_BUCKETS[i-1], DURATION_BUCKETS[i]]``, the last slot ``+Inf``."""

    __slots__ = ("bucket_counts", "total")

    def __init__(self) -> None:
        self.bucket_counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration."""
        self.bucket_counts[bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.total += seconds


class MonitorStats:
    """Counters and gauges of one monitor (see the module docstring for who writes what).

    ``created`` is the Unix time the counters started from (the ``_created`` samples).
    """

    def __init__(self, *, created: float | None = None) -> None:
        self.created = time.time() if created is None else created
        self.tick = DurationStats()
        self.last_tick = 0.0
        #: Rejections the tick found (the lister's), and those the usage read found.
        self.rejected: dict[str, int] = dict.fromkeys((r.value for r in RejectReason), 0)
        self.rejected_by_usage: dict[str, int] = {}
        self.paused = 0
        self.mig_dir_unsafe = 0
        self.mig_dir_refusals: dict[str, int] = dict.fromkeys(MIG_LOCK_REASONS, 0)
        self.removals: dict[str, int] = dict.fromkeys(REMOVAL_OUTCOMES, 0)
        self.removals_pending = 0
        self.removal_oldest = 0.0
        self.resync_interval = 0.0
        self.liveness = 0
        self.liveness_checks = 0
        self.liveness_listings = 0
        self.watched = 0
        self.unwatched = 0
        self.watch_fallbacks: dict[str, int] = dict.fromkeys(WATCH_FALLBACKS, 0)
        self.foreign_writer = 0
        self.foreign_writes = 0
        self.no_descriptors: dict[str, int] = dict.fromkeys(DESCRIPTOR_CHECKS, 0)
        self.usage_read = 0.0
        self.usage_reads = 0
        self.usage_duration = DurationStats()
        self.strays = StrayStats()

    # The callbacks the lister and the usage reader are given (one writer each).

    def count_rejected(self, reason: str) -> None:
        """A container's file started being rejected at the tick."""
        _count(self.rejected, reason)

    def count_rejected_by_usage(self, reason: str) -> None:
        """A container's file started being rejected at a usage read."""
        _count(self.rejected_by_usage, reason)

    def count_removal(self, outcome: str) -> None:
        """A removal of a gone pod's directory ended (``removed`` or ``failed``)."""
        _count(self.removals, outcome)

    def count_watch_fallback(self, reason: str) -> None:
        """A tick on which no directory could rely on its inotify watch."""
        _count(self.watch_fallbacks, reason)

    def count_no_descriptors(self, check: str) -> None:
        """A check that found the process out of descriptors."""
        _count(self.no_descriptors, check)

    def count_mig_refusal(self, reason: str) -> None:
        """The MIG lock directory started being refused."""
        _count(self.mig_dir_refusals, reason)


class StrayCollector(Collector):
    """Exports a :class:`~hami_trio.monitor.scope.StrayStats` (the feedback's stray claims)."""

    def __init__(self, stats: StrayStats, *, created: float | None = None) -> None:
        self._stats = stats
        self._created = time.time() if created is None else created

    def describe(self) -> Iterator[Metric]:
        """Names only, so registering does not read the stats (and checks for clashes)."""
        yield GaugeMetricFamily(_STRAY_CONTAINERS, _STRAY_CONTAINERS_HELP, labels=["reason"])
        yield CounterMetricFamily(_STRAY_CLAIMS, _STRAY_CLAIMS_HELP, labels=["reason"])

    def collect(self) -> Iterator[Metric]:
        """The two families, every reason in :data:`STRAY_REASONS` order."""
        containers = dict(self._stats.containers)
        claims = dict(self._stats.claims)
        yield _gauges(_STRAY_CONTAINERS, _STRAY_CONTAINERS_HELP, "reason", containers)
        yield _counters(_STRAY_CLAIMS, _STRAY_CLAIMS_HELP, "reason", claims, self._created)


class MonitorCollector(Collector):
    """Exports a :class:`MonitorStats` in Prometheus form, the stray claims last."""

    def __init__(self, stats: MonitorStats) -> None:
        self._stats = stats
        self._strays = StrayCollector(stats.strays, created=stats.created)

    def describe(self) -> Iterator[Metric]:
        """Names only, so registering does not read the stats (and checks for clashes)."""
        for name, kind, help_text, label, _ in _FAMILIES:
            if kind == "histogram":
                yield HistogramMetricFamily(name, help_text)
            elif kind == "counter":
                yield CounterMetricFamily(name, help_text, labels=[label] if label else None)
            else:
                yield GaugeMetricFamily(name, help_text)
        yield from self._strays.describe()

    def collect(self) -> Iterator[Metric]:
        """One consistent-enough snapshot of the numbers, in the order of :data:`_FAMILIES`."""
        stats = self._stats
        created = stats.created
        for name, kind, help_text, label, read in _FAMILIES:
            value = read(stats)
            if isinstance(value, DurationStats):
                yield _histogram(name, help_text, value, created)
            elif isinstance(value, dict):
                assert label is not None
                yield _counters(name, help_text, label, value, created)
            elif kind == "counter":
                yield CounterMetricFamily(name, help_text, value=value, created=created)
            else:
                yield GaugeMetricFamily(name, help_text, value=value)
        yield from self._strays.collect()


def _rejected(stats: MonitorStats) -> dict[str, int]:
    """The tick's rejections and the usage read's, summed (each table has one writer)."""
    rejected = dict(stats.rejected)
    for reason, count in list(stats.rejected_by_usage.items()):
        _count(rejected, reason, count)
    return rejected


def _counters(
    name: str, help_text: str, label: str, counts: Mapping[str, int], created: float
) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count, created=created)
    return family


def _gauges(name: str, help_text: str, label: str, values: Mapping[str, int]) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=[label])
    for value, number in values.items():
        family.add_metric([value], number)
    return family


def _histogram(name: str, help_text: str, durations: DurationStats, created: float) -> Metric:
    counts: Sequence[int] = list(durations.bucket_counts)
    total = durations.total
    cumulative: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*DURATION_BUCKETS, float("inf")), counts, strict=True):
        running += count
        cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
    family = HistogramMetricFamily(name, help_text, buckets=cumulative, sum_value=total)
    family.samples.append(Sample(f"{name}_created", {}, created))
    return family


_TICK = "hami_trio_monitor_tick_duration_seconds"
_TICK_HELP = "Wall time of one monitor tick (refresh, Observe, write back)."
_LAST_TICK = "hami_trio_monitor_last_tick_timestamp_seconds"
_LAST_TICK_HELP = "Unix time at which the latest monitor tick completed (0 before the first)."
_REJECTED = "hami_trio_monitor_files_rejected"
_REJECTED_HELP = "Times a container's .cache file started being rejected, by reason."
_PAUSED = "hami_trio_monitor_mig_paused"
_PAUSED_HELP = "1 while the MIG apply lock holds the feedback loop paused."
_MIG_UNSAFE = "hami_trio_monitor_mig_lock_dir_unsafe"
_MIG_UNSAFE_HELP = (
    "1 while the MIG lock directory is refused as unsafe (not a directory of root or "
    "the agent that only they can write to); MIG locks in it are ignored meanwhile."
)
_MIG_REFUSALS = "hami_trio_monitor_mig_lock_refusals"
_MIG_REFUSALS_HELP = "Times the MIG lock directory started being refused as unsafe, by reason."
_REMOVALS = "hami_trio_monitor_removals"
_REMOVALS_HELP = (
    "Removals of gone pods' container directories that ended, by outcome "
    "(removed, failed: something was left behind)."
)
_PENDING = "hami_trio_monitor_removals_pending"
_PENDING_HELP = (
    "Gone pods' container directories scheduled for removal and not yet removed, as "
    "of the latest tick."
)
_OLDEST = "hami_trio_monitor_removal_oldest_pending_seconds"
_OLDEST_HELP = (
    "Seconds the longest-waiting pending removal has waited since it was scheduled "
    "(0: none pending), as of the latest tick."
)
_RESYNC = "hami_trio_monitor_resync_interval_seconds"
_RESYNC_HELP = "How long a gone pod's directory is kept before it is scheduled for removal."
_LIVENESS = "hami_trio_monitor_process_liveness_checked"
_LIVENESS_HELP = (
    "1 when the agent is in the host PID namespace and tells exited processes from "
    "running ones (hami_trio_container_processes); 0: every set host PID counts as "
    "running."
)
_CHECKS = "hami_trio_monitor_process_liveness_checks"
_CHECKS_HELP = "Host PIDs checked one by one for liveness (kill(pid, 0); at most 256 per tick)."
_LISTINGS = "hami_trio_monitor_process_listings"
_LISTINGS_HELP = "Ticks that listed /proc once instead (more than 256 distinct host PIDs)."
_WATCHED = "hami_trio_monitor_watched_directories"
_WATCHED_HELP = (
    "Container directories watched with inotify (a quiet one is read without an "
    "lstat of its .cache file), as of the latest tick."
)
_UNWATCHED = "hami_trio_monitor_unwatched_directories"
_UNWATCHED_HELP = (
    "Containers of the latest tick with an open .cache file but no inotify watch "
    "(watch cap, fs.inotify.max_user_watches used up, or no inotify): checked with "
    "lstat every tick."
)
_FALLBACKS = "hami_trio_monitor_watch_fallbacks"
_FALLBACKS_HELP = (
    "Ticks on which no container directory could rely on its inotify watch, so every "
    "one was checked with lstat, by reason (overflow, flood, error, root)."
)
_FOREIGN = "hami_trio_monitor_foreign_writer"
_FOREIGN_HELP = (
    "1 while another writer (HAMi's own vGPUmonitor during a cut-over) is changing "
    "the regions' control words in ways neither this monitor nor HAMi-core explains."
)
_FOREIGN_WRITES = "hami_trio_monitor_foreign_writes"
_FOREIGN_WRITES_HELP = (
    "Control words found holding a value neither this monitor's last write nor "
    "HAMi-core explains (recent_kernel, utilization_switch)."
)
_NO_FDS = "hami_trio_monitor_descriptors_exhausted"
_NO_FDS_HELP = (
    "Monitor checks that could not get a file descriptor (EMFILE, ENFILE), by check: "
    "mig_lock (the monitor pauses, regions untouched) or containers (the last view of "
    "the directory or container is kept)."
)
_USAGE_READ = "hami_trio_monitor_usage_read_timestamp_seconds"
_USAGE_READ_HELP = (
    "Unix time at which the latest usage read (memory, utilisation, processes of "
    "every loaded container, made when /metrics, the debug view or status asks) "
    "started; 0 before the first."
)
_USAGE_READS = "hami_trio_monitor_usage_reads"
_USAGE_READS_HELP = (
    "Usage reads made (at most one per freshness window and tick, however many ask)."
)
_USAGE_DURATION = "hami_trio_monitor_usage_read_duration_seconds"
_USAGE_DURATION_HELP = "Wall time of one usage read (in a worker thread, off the event loop)."
_STRAY_CONTAINERS = "hami_trio_monitor_stray_claim_containers"
_STRAY_CONTAINERS_HELP = (
    "Containers whose .cache file claims a GPU UUID that their pod's allocation does "
    "not list (uuid) or a priority other than their pod spec's (priority), as of the "
    "latest tick; the feedback counts them as their pod says."
)
_STRAY_CLAIMS = "hami_trio_monitor_stray_claims"
_STRAY_CLAIMS_HELP = (
    "Times a container's .cache file started claiming what its pod does not give it, "
    "by reason (uuid, priority)."
)

#: What one row reads: a gauge's or a counter's value, a labelled counter's copy of its
#: table (in label order), or a histogram's counts.
_Read = Callable[[MonitorStats], float | dict[str, int] | DurationStats]

#: Every family :class:`MonitorCollector` exports before the stray claims, in export order:
#: name (a counter's without ``_total``), kind, help text, label, what it reads.
_FAMILIES: Final[Sequence[tuple[str, str, str, str | None, _Read]]] = (
    (_TICK, "histogram", _TICK_HELP, None, lambda s: s.tick),
    (_LAST_TICK, "gauge", _LAST_TICK_HELP, None, lambda s: s.last_tick),
    (_REJECTED, "counter", _REJECTED_HELP, "reason", _rejected),
    (_PAUSED, "gauge", _PAUSED_HELP, None, lambda s: s.paused),
    (_MIG_UNSAFE, "gauge", _MIG_UNSAFE_HELP, None, lambda s: s.mig_dir_unsafe),
    (_MIG_REFUSALS, "counter", _MIG_REFUSALS_HELP, "reason", lambda s: dict(s.mig_dir_refusals)),
    (_REMOVALS, "counter", _REMOVALS_HELP, "outcome", lambda s: dict(s.removals)),
    (_PENDING, "gauge", _PENDING_HELP, None, lambda s: s.removals_pending),
    (_OLDEST, "gauge", _OLDEST_HELP, None, lambda s: s.removal_oldest),
    (_RESYNC, "gauge", _RESYNC_HELP, None, lambda s: s.resync_interval),
    (_LIVENESS, "gauge", _LIVENESS_HELP, None, lambda s: s.liveness),
    (_CHECKS, "counter", _CHECKS_HELP, None, lambda s: s.liveness_checks),
    (_LISTINGS, "counter", _LISTINGS_HELP, None, lambda s: s.liveness_listings),
    (_WATCHED, "gauge", _WATCHED_HELP, None, lambda s: s.watched),
    (_UNWATCHED, "gauge", _UNWATCHED_HELP, None, lambda s: s.unwatched),
    (_FALLBACKS, "counter", _FALLBACKS_HELP, "reason", lambda s: dict(s.watch_fallbacks)),
    (_FOREIGN, "gauge", _FOREIGN_HELP, None, lambda s: s.foreign_writer),
    (_FOREIGN_WRITES, "counter", _FOREIGN_WRITES_HELP, None, lambda s: s.foreign_writes),
    (_NO_FDS, "counter", _NO_FDS_HELP, "check", lambda s: dict(s.no_descriptors)),
    (_USAGE_READ, "gauge", _USAGE_READ_HELP, None, lambda s: s.usage_read),
    (_USAGE_READS, "counter", _USAGE_READS_HELP, None, lambda s: s.usage_reads),
    (_USAGE_DURATION, "histogram", _USAGE_DURATION_HELP, None, lambda s: s.usage_duration),
)
