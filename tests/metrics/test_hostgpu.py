"""Tests of the NVML host GPU sampler and its Prometheus families (fake NVML, and the real
pynvml binding on this GPU-less machine)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import pynvml
import pytest
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from hami_trio.metrics.hostgpu import (
    HostGpuSample,
    HostGpuSampler,
    host_gpu_families,
    serve_nvml_release,
)
from tests.metrics.fake_nvml import FakeGpu, FakeNvml

A100 = FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", memory_used=5 << 30)
T4 = FakeGpu(name="Tesla T4", uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", gpu_util=90)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_samples_every_device() -> None:
    nvml = FakeNvml(gpus=[A100, T4])
    sampler = HostGpuSampler(nvml)
    samples = sampler.sample()
    assert samples == (
        HostGpuSample(0, A100.uuid, "NVIDIA-A100-SXM4-80GB", 5 << 30, 37, 12),
        HostGpuSample(1, T4.uuid, "NVIDIA-Tesla T4", 1 << 30, 90, 12),
    )
    assert sampler.sample() == samples
    assert nvml.init_calls == 1  # one session, kept between samples
    sampler.close()
    assert not nvml.initialized


def test_unsupported_memory_drops_only_memory() -> None:
    gpu = FakeGpu(memory_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    samples = HostGpuSampler(FakeNvml(gpus=[gpu])).sample()
    assert samples is not None
    assert samples[0].memory_used is None
    assert samples[0].utilization == gpu.gpu_util


def test_failing_device_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    lost = FakeGpu(uuid="GPU-lost", utilization_error=pynvml.NVML_ERROR_GPU_IS_LOST)
    sampler = HostGpuSampler(FakeNvml(gpus=[lost, T4]))
    for _ in range(3):
        samples = sampler.sample()
        assert samples is not None
        assert [s.uuid for s in samples] == [T4.uuid]
    lines = [r for r in caplog.records if "GPU 0" in r.getMessage()]
    assert len(lines) == 1  # rate limited
    assert "GPU is lost" in lines[0].getMessage()


def test_no_library_logs_once_and_retries_quietly(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    nvml = FakeNvml(gpus=[A100], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    sampler = HostGpuSampler(nvml, retry_interval=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="hami_trio.metrics.hostgpu"):
        assert sampler.sample() is None
        assert sampler.sample() is None
        assert nvml.init_calls == 1  # not retried within the interval
        clock.now = 61
        assert sampler.sample() is None
        assert nvml.init_calls == 2
        nvml.init_error = None  # the driver container came up
        clock.now = 122
        samples = sampler.sample()
    assert samples is not None
    assert len(samples) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "NVML unavailable" in m]) == 1
    assert "NVML Shared Library Not Found" in messages[0]
    assert any("available now" in m for m in messages)


def test_real_pynvml_without_a_driver(caplog: pytest.LogCaptureFixture) -> None:
    """This machine has no libnvidia-ml: the real binding must fail cleanly."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("NVML is available here")
    sampler = HostGpuSampler()
    assert sampler.sample() is None
    assert sampler.sample() is None
    assert not sampler.initialized
    sampler.pause()
    sampler.close()
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1


def test_pause_releases_handles_until_resume() -> None:
    nvml = FakeNvml(gpus=[A100])
    sampler = HostGpuSampler(nvml)
    assert sampler.sample() is not None
    sampler.pause()
    assert sampler.paused
    assert not nvml.initialized
    assert nvml.shutdown_calls == 1
    assert sampler.sample() is None
    assert nvml.init_calls == 1  # nothing opened while paused
    sampler.resume()
    assert sampler.sample() is not None
    assert nvml.init_calls == 2


def test_pause_until_resumes_at_the_first_sample_after_the_lock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml(gpus=[A100])
    sampler = HostGpuSampler(nvml)
    locked = [True]
    assert sampler.sample() is not None
    sampler.pause(until=lambda: locked[0])
    assert sampler.sample() is None
    assert nvml.init_calls == 1  # still locked: nothing opened
    locked[0] = False
    with caplog.at_level(logging.INFO, logger="hami_trio.metrics.hostgpu"):
        assert sampler.sample() is not None
        assert not sampler.resume()  # already resumed by the sample
    assert not sampler.paused
    assert nvml.init_calls == 2
    assert [r.getMessage() for r in caplog.records] == [
        "MIG apply lock gone: host GPU metrics resumed"
    ]


def test_broken_session_is_reopened() -> None:
    nvml = FakeNvml(gpus=[A100])
    sampler = HostGpuSampler(nvml)
    assert sampler.sample() is not None
    nvml.lose_session()
    assert sampler.sample() is None
    assert not sampler.initialized
    assert sampler.sample() is not None
    assert nvml.init_calls == 2


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _registry(families: list[Metric]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_Families(families))
    return registry


def test_families_match_upstream() -> None:
    samples = (
        HostGpuSample(0, "GPU-a", "NVIDIA-A100", 1000, 50, 7),
        HostGpuSample(1, "GPU-b", "NVIDIA-T4", None, 3, 1),
    )
    zone = [("zone", "vGPU")]
    registry = _registry(host_gpu_families(samples, "node-a", const_labels=zone))
    host = {"node": "node-a", "device_index": "0", "device_uuid": "GPU-a", "zone": "vGPU"}
    value = registry.get_sample_value
    assert value("hami_host_gpu_memory_used_bytes", {**host, "device_type": "NVIDIA-A100"}) == 1000
    assert value("hami_host_gpu_utilization_ratio", {**host, "device_type": "NVIDIA-A100"}) == 50
    no_node = {"device_index": "0", "device_uuid": "GPU-a", "device_type": "NVIDIA-A100"}
    assert (
        value("hami_host_gpu_memory_controller_utilization_ratio", {**no_node, "zone": "vGPU"}) == 7
    )
    names = {m.name for m in registry.collect() for _ in m.samples}
    assert "HostGPUMemoryUsage" not in names
    memory = next(m for m in registry.collect() if m.name == "hami_host_gpu_memory_used_bytes")
    assert [s.labels["device_uuid"] for s in memory.samples] == ["GPU-a"]  # T4: no memory
    assert memory.documentation == "GPU device memory usage in bytes"
    assert host_gpu_families(None, "node-a") == []


def test_legacy_families() -> None:
    samples = (HostGpuSample(2, "GPU-c", "NVIDIA-H100", 9, 8, 7),)
    registry = _registry(host_gpu_families(samples, "n", legacy=True))
    labels = {"nodeid": "n", "deviceidx": "2", "deviceuuid": "GPU-c", "devicetype": "NVIDIA-H100"}
    assert registry.get_sample_value("HostGPUMemoryUsage", labels) == 9
    assert registry.get_sample_value("HostCoreUtilization", labels) == 8


async def _until(predicate: Callable[[], bool]) -> None:
    # The follower works in a worker thread, which MockClock cannot see: poll in real time.
    with trio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - state changes in a worker thread
            await trio.sleep(0.005)


async def test_nvml_released_while_mig_locked() -> None:
    nvml = FakeNvml(gpus=[A100])
    sampler = HostGpuSampler(nvml)
    locked = [False]
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(serve_nvml_release, sampler, lambda: locked[0], poll_interval=0.01)
        )
        assert await trio.to_thread.run_sync(sampler.sample) is not None
        locked[0] = True
        await _until(lambda: sampler.paused and not nvml.initialized)
        assert await trio.to_thread.run_sync(sampler.sample) is None
        locked[0] = False
        await _until(lambda: not sampler.paused)
        assert await trio.to_thread.run_sync(sampler.sample) is not None
        nursery.cancel_scope.cancel()
    assert not nvml.initialized  # closed on the way out
    assert nvml.shutdown_calls == 2
