"""The monitor's self-metrics: plain counters, read by one collector in a fixed order."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.stats import DURATION_BUCKETS, MonitorCollector, MonitorStats


def registry_of(stats: MonitorStats) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(MonitorCollector(stats))
    return registry


def test_describe_announces_what_collect_yields_in_the_same_order() -> None:
    collector = MonitorCollector(MonitorStats())
    described = [family.name for family in collector.describe()]
    collected = [family.name for family in collector.collect()]
    assert described == collected
    assert collected[0] == "hami_trio_monitor_tick_duration_seconds"
    assert collected[-2:] == [
        "hami_trio_monitor_stray_claim_containers",
        "hami_trio_monitor_stray_claims",
    ]


def test_a_second_collector_of_the_same_names_is_refused() -> None:
    registry = registry_of(MonitorStats())
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(MonitorCollector(MonitorStats()))


def test_histograms_are_cumulative_with_count_sum_and_created() -> None:
    stats = MonitorStats(created=1234.5)
    for seconds in (0.0005, 0.001, 0.003, 20.0):
        stats.tick.observe(seconds)
    registry = registry_of(stats)
    name = "hami_trio_monitor_tick_duration_seconds"

    def bucket(le: str) -> float | None:
        return registry.get_sample_value(f"{name}_bucket", {"le": le})

    assert bucket("0.001") == 2  # le is inclusive, as prometheus-client's
    assert bucket("0.005") == 3
    assert bucket("10.0") == 3
    assert bucket("+Inf") == 4
    assert len(DURATION_BUCKETS) == 13
    assert registry.get_sample_value(f"{name}_count") == 4
    assert registry.get_sample_value(f"{name}_sum") == 0.0005 + 0.001 + 0.003 + 20.0
    assert registry.get_sample_value(f"{name}_created") == 1234.5


def test_rejections_of_the_tick_and_the_usage_read_are_summed_every_reason_listed() -> None:
    stats = MonitorStats()
    stats.count_rejected("magic")
    stats.count_rejected_by_usage("magic")
    stats.count_rejected_by_usage("truncated")
    registry = registry_of(stats)
    name = "hami_trio_monitor_files_rejected_total"
    assert registry.get_sample_value(name, {"reason": "magic"}) == 2
    assert registry.get_sample_value(name, {"reason": "truncated"}) == 1
    assert registry.get_sample_value(name, {"reason": "too_small"}) == 0
    text = generate_latest(registry).decode()
    listed = [line for line in text.splitlines() if line.startswith(f"{name}{{")]
    assert [line.split('"')[1] for line in listed] == [reason.value for reason in RejectReason]


def test_gauges_and_unlabelled_counters_read_the_numbers_as_they_are() -> None:
    stats = MonitorStats()
    stats.paused = 1
    stats.removals_pending = 3
    stats.usage_reads = 7
    stats.count_no_descriptors("mig_lock")
    stats.strays.claims["uuid"] = 2
    registry = registry_of(stats)
    assert registry.get_sample_value("hami_trio_monitor_mig_paused") == 1
    assert registry.get_sample_value("hami_trio_monitor_removals_pending") == 3
    assert registry.get_sample_value("hami_trio_monitor_usage_reads_total") == 7
    assert (
        registry.get_sample_value(
            "hami_trio_monitor_descriptors_exhausted_total", {"check": "mig_lock"}
        )
        == 1
    )
    assert (
        registry.get_sample_value("hami_trio_monitor_stray_claims_total", {"reason": "uuid"}) == 2
    )
