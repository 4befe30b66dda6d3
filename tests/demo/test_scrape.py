"""The demo reads the agent's real metric families (rendered by the agent's own code)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hami_trio.broker.stats import BrokerCollector, BrokerStats
from hami_trio.demo.scrape import AgentSample, bucket_quantile, parse_metrics
from hami_trio.metrics.collector import VGpuCollector
from hami_trio.metrics.endpoint import render_metrics
from hami_trio.monitor.loop import Monitor, MonitorConfig
from hami_trio.pods.source import StaticPodSource
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, write_region

GPU = "GPU-8f1c6a2e-5d3b-4c7a-9e21-0a1b2c3d4e5f"


async def test_sample_from_the_agents_own_exposition(tmp_path: Path) -> None:
    containers = tmp_path / "containers"
    for name, priority, sm in (("high", 0, 90), ("low", 1, 0)):
        directory = containers / f"pod-{name}_{name}"
        directory.mkdir(parents=True)
        slot = ProcSlot(pid=1, used=[MemoryUse(1, 2, 3, 0, 600 << 20)], util=[UtilUse(sm_util=sm)])
        spec = RegionSpec(
            uuids=[GPU], limits=[8 << 30], procs=[slot], priority=priority, recent_kernel=2
        )
        write_region(directory / "x.cache", spec)
    registry = CollectorRegistry()
    source = StaticPodSource()
    monitor = Monitor(MonitorConfig(hook_path=tmp_path), pod_source=source, registry=registry)
    registry.register(VGpuCollector(monitor, source, node_name="n", kubernetes=False))
    stats = BrokerStats()
    for duration in (0.00004, 0.00008, 0.003):
        stats.record("ok", duration)
    stats.record("eof", 0.001)
    registry.register(BrokerCollector(stats, lambda: 0))
    try:
        await monitor.tick()  # the high one is active: the low one gets recent_kernel = -1
        body, _ = render_metrics(registry, "", [])  # ... which the usage read finds
    finally:
        monitor.close()

    sample = parse_metrics(body.decode(), t=12.5)
    assert sample.t == 12.5
    high = sample.containers[("pod-high", "high")]
    assert (high.memory_used, high.memory_limit, high.sm_util) == (600 << 20, 8 << 30, 90)
    assert high.blocked is False
    low = sample.containers[("pod-low", "low")]
    assert (low.sm_util, low.blocked) == (0, True)
    assert sample.mig_paused is False
    assert sample.ticks == 1
    assert sample.exchanges["ok"] == 3
    assert sample.exchanges["eof"] == 1
    assert sample.latency_count == 4
    assert sample.latency_sum == pytest.approx(0.00412)
    assert bucket_quantile(sample.latency_buckets, 0.5) == 0.0001
    assert bucket_quantile(sample.latency_buckets, 0.99) == 0.005


def test_an_empty_page_is_an_empty_sample() -> None:
    sample = parse_metrics("", t=1.0)
    assert sample == AgentSample(t=1.0)
    assert sample.latency_count == 0
    assert bucket_quantile(sample.latency_buckets, 0.5) is None


def test_quantile_beyond_the_last_finite_bucket_is_infinite() -> None:
    assert bucket_quantile(((0.1, 1), (math.inf, 10)), 0.99) == math.inf
    assert bucket_quantile(((0.1, 0), (math.inf, 0)), 0.5) is None
