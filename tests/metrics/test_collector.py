"""Tests of the metrics collector's rules on hand-made snapshots (label sets, pod matching,
legacy families, MIG rows, host families, lint).  End-to-end scrapes of real ``.cache``
files through the monitor are in ``test_metrics_scrape.py``."""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from hami_trio.metrics.collector import BuildInfoCollector, VGpuCollector
from hami_trio.metrics.endpoint import render_metrics
from hami_trio.metrics.hostgpu import HostGpuSampler
from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.state import ContainerKey, ContainerState, ContainerStatus, Rejection
from hami_trio.pods.source import PodInfo, StaticPodSource
from tests.metrics.fake_nvml import FakeGpu, FakeNvml
from tests.metrics.promtool import lint
from tests.strategies import metrics as st_metrics

UUID = "GPU-12345678-1234-1234-1234-123456789012"  # 40 characters
NOW = 1_700_000_100


@dataclass(frozen=True)
class FakeUUID:
    label: str | None


@dataclass(frozen=True)
class FakeDevice:
    index: int
    uuid: FakeUUID = FakeUUID(UUID)
    memory_limit: int = 10_000
    memory_total: int = 8_000
    context_size: int = 1_000
    module_size: int = 500
    buffer_size: int = 300
    sm_util: int = 42


@dataclass(frozen=True)
class FakeSnapshot:
    devices: Sequence[FakeDevice] = (FakeDevice(0),)
    recent_kernel: int = 0
    last_kernel_time: int = 0


#: A refused file, as the monitor reports it.
MAGIC = Rejection(RejectReason.MAGIC, "x.cache: magic 0 is not HAMi-core's")
#: What the collector reads of a container: the monitor's own value, with a fake snapshot.
FakeContainer = ContainerState[FakeSnapshot]


def fake_container(
    pod_uid: str,
    container_name: str,
    snapshot: FakeSnapshot | None = FakeSnapshot(),
    rejection: Rejection | None = None,
) -> FakeContainer:
    key = ContainerKey(pod_uid, container_name)
    if snapshot is not None:
        status = ContainerStatus.LOADED
    elif rejection is not None:
        status = ContainerStatus.REJECTED
    else:
        status = ContainerStatus.NO_CACHE_FILE
    cache_file = None if status is ContainerStatus.NO_CACHE_FILE else "x.cache"
    return ContainerState(
        key, f"/hook/containers/{key.dirname}", cache_file, status, snapshot, rejection
    )


@dataclass
class FakeMonitor:
    items: list[FakeContainer] = field(default_factory=list)
    paused: bool = False

    insights: dict[str, Any] = field(default_factory=dict)

    def containers(self) -> Mapping[str, FakeContainer]:
        return {f"{c.pod_uid}_{c.container_name}": c for c in self.items}

    def usage(self) -> FakeUsage:
        return FakeUsage(self.containers(), self.insights)


@dataclass(frozen=True)
class FakeUsage:
    containers: Mapping[str, FakeContainer]
    insights: Mapping[str, Any]


def hami_pod(uid: str = "uid-1", **kwargs: object) -> PodInfo:
    base: dict[str, object] = {
        "uid": uid,
        "namespace": "team-a",
        "name": "trainer-0",
        "containers": ("worker",),
        "labels": {"hami.io/vgpu-node": "node-a"},
    }
    base.update(kwargs)
    return PodInfo(**base)  # type: ignore[arg-type]


class Pods(StaticPodSource):
    """An authoritative pod source that also offers ``pods()`` (like the Kubernetes one)."""

    def __init__(self, pods: Sequence[PodInfo]) -> None:
        super().__init__(pods)
        self._all = {pod.uid: pod for pod in pods}

    def pods(self) -> Mapping[str, PodInfo]:
        return self._all


def scrape(collector: VGpuCollector, *, openmetrics: bool = False) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    render = generate_openmetrics if openmetrics else generate_latest
    return render(registry).decode()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def collector(
    monitor: FakeMonitor,
    pods: Sequence[PodInfo] = (),
    *,
    kubernetes: bool = True,
    **kwargs: object,
) -> VGpuCollector:
    source = Pods(pods) if kubernetes else StaticPodSource()
    return VGpuCollector(
        monitor,
        source,
        node_name="node-a",
        kubernetes=kubernetes,
        all_pods=source.pods if isinstance(source, Pods) else None,
        wall_clock=lambda: NOW,
        **kwargs,  # type: ignore[arg-type]
    )


LABELS = {
    "namespace": "team-a",
    "pod": "trainer-0",
    "container": "worker",
    "vdevice_index": "0",
    "device_uuid": UUID,
    "zone": "vGPU",
}


def test_container_metrics_match_upstream() -> None:
    # The same fixture as HAMi's TestCollectContainerMetrics, with last kernel 60 s ago.
    snap = FakeSnapshot(last_kernel_time=NOW - 60)
    text = scrape(collector(FakeMonitor([fake_container("uid-1", "worker", snap)]), [hami_pod()]))
    expected = {
        "hami_vgpu_memory_used_bytes": 8000,
        "hami_vgpu_memory_limit_bytes": 10000,
        "hami_container_device_memory_bytes": 8000,
        "hami_container_device_utilization_ratio": 42,
        "hami_vgpu_memory_context_bytes": 1000,
        "hami_vgpu_memory_module_bytes": 500,
        "hami_vgpu_memory_buffer_bytes": 300,
        "hami_container_last_kernel_elapsed_seconds": 60,
    }
    for name, value in expected.items():
        assert samples(text, name) == [(LABELS, value)], name
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["hami_vgpu_memory_used_bytes"].documentation == (
        "vGPU device memory usage in bytes"
    )
    errors = families.pop("hami_trio_collector_errors")
    assert errors.type == "counter"
    assert all(f.type == "gauge" for f in families.values())
    assert samples(text, "hami_trio_container_blocked") == [
        ({"namespace": "team-a", "pod": "trainer-0", "container": "worker"}, 0)
    ]
    assert samples(text, "vGPU_device_memory_usage_in_bytes") == []  # legacy off


def test_no_kernel_activity_has_no_elapsed_metric() -> None:
    monitor = FakeMonitor([fake_container("uid-1", "worker")])
    text = scrape(collector(monitor, [hami_pod()]))
    assert samples(text, "hami_container_last_kernel_elapsed_seconds") == []
    assert len(samples(text, "hami_vgpu_memory_used_bytes")) == 1


@pytest.mark.parametrize(
    ("last_kernel_time", "expected"),
    [(NOW + 30, [0.0]), (1, [NOW - 1.0]), ((1 << 63) + 5, []), ((1 << 64) - 1, [])],
    ids=["future-floored", "epoch", "negative-int64", "minus-one"],
)
def test_last_kernel_time_like_go(last_kernel_time: int, expected: list[float]) -> None:
    snap = FakeSnapshot(last_kernel_time=last_kernel_time)
    text = scrape(collector(FakeMonitor([fake_container("uid-1", "worker", snap)]), [hami_pod()]))
    got = samples(text, "hami_container_last_kernel_elapsed_seconds")
    assert [value for _, value in got] == expected


def test_unused_and_non_utf8_devices_are_skipped() -> None:
    devices = (
        FakeDevice(0, FakeUUID(None)),
        FakeDevice(1, FakeUUID("GPU-b")),
        FakeDevice(2, FakeUUID(None)),
    )
    monitor = FakeMonitor([fake_container("uid-1", "worker", FakeSnapshot(devices))])
    text = scrape(collector(monitor, [hami_pod()]))
    got = samples(text, "hami_vgpu_memory_limit_bytes")
    assert [(labels["vdevice_index"], labels["device_uuid"]) for labels, _ in got] == [
        ("1", "GPU-b")
    ]


def test_pod_matching_with_kubernetes() -> None:
    monitor = FakeMonitor(
        [
            fake_container("uid-1", "worker"),  # exported
            fake_container("uid-1", "init"),  # an init container: not in spec.containers
            fake_container("uid-2", "worker"),  # pod lacks the hami.io/vgpu-node label
            fake_container("uid-3", "worker"),  # pod assigned to another node
            fake_container("uid-4", "worker"),  # unknown pod
            fake_container("uid-1", "worker2", None),  # no loaded file
        ]
    )
    pods = [
        hami_pod("uid-1", init_containers=("init",), containers=("worker", "worker2")),
        hami_pod("uid-2", labels={}),
        hami_pod("uid-3", labels={"hami.io/vgpu-node": "node-b"}),
    ]
    text = scrape(collector(monitor, pods))
    got = samples(text, "hami_vgpu_memory_used_bytes")
    assert [(labels["pod"], labels["container"]) for labels, _ in got] == [("trainer-0", "worker")]
    states = {
        labels["state"]: value for labels, value in samples(text, "hami_trio_monitor_containers")
    }
    assert states == {
        "exported": 1,
        "paused": 0,
        "no_pod": 3,  # uid-2, uid-3, uid-4
        "completed": 1,  # the init container
        "rejected": 0,
        "no_cache_file": 1,
    }


def test_completed_pods_rejected_files_and_the_pause_are_counted_by_state() -> None:
    monitor = FakeMonitor(
        [
            fake_container("done", "worker"),  # its pod Succeeded
            fake_container("crashed", "worker"),  # its pod Failed
            fake_container("live", "worker"),  # running: exported
            fake_container("live", "bad", None, MAGIC),  # file refused
        ]
    )
    pods = [
        hami_pod("done", phase="Succeeded"),
        hami_pod("crashed", phase="Failed"),
        hami_pod("live", containers=("worker", "bad"), phase="Running"),
    ]
    vgpu = collector(monitor, pods)
    text = scrape(vgpu)
    got = samples(text, "hami_vgpu_memory_used_bytes")
    assert [(labels["container"], value) for labels, value in got] == [("worker", 8000)]
    assert {(k, v) for k, v in vgpu.states().items() if v} == {
        ("completed", 2),
        ("exported", 1),
        ("rejected", 1),
    }
    monitor.paused = True  # the rows stay (frozen at the last tick), counted as paused
    text = scrape(vgpu)
    assert len(samples(text, "hami_vgpu_memory_used_bytes")) == 1
    states = {
        labels["state"]: value for labels, value in samples(text, "hami_trio_monitor_containers")
    }
    assert (states["paused"], states["exported"], states["completed"]) == (1, 0, 2)


def test_without_kubernetes_pods_are_named_by_uid() -> None:
    monitor = FakeMonitor([fake_container("0b6c1e7a-uid", "main")])
    text = scrape(collector(monitor, kubernetes=False))
    ((labels, value),) = samples(text, "hami_vgpu_memory_used_bytes")
    assert labels == {**LABELS, "namespace": "", "pod": "0b6c1e7a-uid", "container": "main"}
    assert value == 8000
    assert samples(text, "hami_mig_device_info") == []


def test_blocked_gauge() -> None:
    monitor = FakeMonitor(
        [
            fake_container("uid-1", "worker", FakeSnapshot(recent_kernel=-1)),
            fake_container("uid-1", "other", FakeSnapshot(recent_kernel=2)),
        ]
    )
    text = scrape(collector(monitor, [hami_pod(containers=("worker", "other"))]))
    assert sorted(
        samples(text, "hami_trio_container_blocked"), key=lambda s: s[0]["container"]
    ) == [
        ({"namespace": "team-a", "pod": "trainer-0", "container": "other"}, 0),
        ({"namespace": "team-a", "pod": "trainer-0", "container": "worker"}, 1),
    ]


def test_legacy_metrics() -> None:
    snap = FakeSnapshot(last_kernel_time=NOW - 5)
    monitor = FakeMonitor([fake_container("uid-1", "worker", snap)])
    text = scrape(collector(monitor, [hami_pod()], legacy=True))
    old = {
        "podnamespace": "team-a",
        "podname": "trainer-0",
        "ctrname": "worker",
        "vdeviceid": "0",
        "deviceuuid": UUID,
        "zone": "vGPU",
    }
    assert samples(text, "vGPU_device_memory_usage_in_bytes") == [(old, 8000)]
    assert samples(text, "vGPU_device_memory_limit_in_bytes") == [(old, 10000)]
    assert samples(text, "Device_utilization_desc_of_container") == [(old, 42)]
    assert samples(text, "Device_last_kernel_of_container") == [(old, 5)]
    memory = {**old, "context": "1000", "module": "500", "data": "300", "offset": "6200"}
    assert samples(text, "Device_memory_desc_of_container") == [(memory, 8000)]
    # The new names are still there.
    assert samples(text, "hami_vgpu_memory_used_bytes") == [(LABELS, 8000)]


def test_legacy_offset_wraps_as_uint64() -> None:
    device = FakeDevice(0, memory_total=100, context_size=70, module_size=20, buffer_size=30)
    monitor = FakeMonitor([fake_container("uid-1", "worker", FakeSnapshot((device,)))])
    text = scrape(collector(monitor, [hami_pod()], legacy=True))
    ((labels, _),) = samples(text, "Device_memory_desc_of_container")
    assert labels["offset"] == str((1 << 64) - 20)


def mig_pod(uid: str, annotation: object, **kwargs: object) -> PodInfo:
    value = annotation if isinstance(annotation, str) else json.dumps(annotation)
    fields: dict[str, object] = {
        "init_containers": ("init",),
        "containers": ("main-a", "main-b"),
        "annotations": {"hami.io/vgpu-mig-allocations": value},
    }
    fields.update(kwargs)
    return hami_pod(uid, **fields)


def allocation(container: int, device: int, *, realised: bool = True) -> dict[str, object]:
    entry: dict[str, object] = {
        "containerIndex": container,
        "deviceIndex": device,
        "gpuUUID": f"GPU-{device}",
        "profile": "1g.10gb",
        "placement": {"start": 0, "size": 1},
    }
    if realised:
        entry |= {
            "migUUID": f"MIG-{container}-{device}",
            "gpuInstanceID": 7,
            "computeInstanceID": 0,
        }
    return entry


def test_mig_rows(caplog: pytest.LogCaptureFixture) -> None:
    pods = [
        mig_pod(
            "uid-1",
            [
                allocation(0, 0),
                allocation(2, 1),
                allocation(1, 0, realised=False),
                allocation(9, 0),
            ],
        ),
        mig_pod("uid-2", "{not json", name="broken"),
        mig_pod("uid-3", [allocation(1, 0)], labels={}),  # not HAMi's pod on this node
    ]
    mig = collector(FakeMonitor(), pods, legacy=True)
    with caplog.at_level(logging.WARNING, logger="hami_trio.metrics.collector"):
        text = scrape(mig)
        text_again = scrape(mig)
    rows = samples(text, "hami_mig_device_info")
    assert rows == [
        (
            {
                "namespace": "team-a",
                "pod": "trainer-0",
                "container": "init",
                "vdevice_index": "0",
                "device_uuid": "GPU-0",
                "mig_uuid": "MIG-0-0",
                "profile": "1g.10gb",
                "gpu_instance_id": "7",
                "compute_instance_id": "0",
                "zone": "vGPU",
            },
            1,
        ),
        (
            {
                "namespace": "team-a",
                "pod": "trainer-0",
                "container": "main-b",
                "vdevice_index": "1",
                "device_uuid": "GPU-1",
                "mig_uuid": "MIG-2-1",
                "profile": "1g.10gb",
                "gpu_instance_id": "7",
                "compute_instance_id": "0",
                "zone": "vGPU",
            },
            1,
        ),
    ]
    assert samples(text_again, "hami_mig_device_info") == rows
    legacy = samples(text, "MigInfo")
    assert legacy[0] == (
        {
            "podnamespace": "team-a",
            "podname": "trainer-0",
            "ctrname": "init",
            "vdeviceid": "0",
            "deviceuuid": "GPU-0",
            "instanceid": "7",
            "zone": "vGPU",
        },
        1,
    )
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "team-a/broken" in w]) == 1  # one warning per value
    assert len([w for w in warnings if "index 9 is out of range" in w]) == 1


def test_mig_annotation_change_is_picked_up() -> None:
    pods = {"uid-1": mig_pod("uid-1", [allocation(1, 0, realised=False)])}
    source = Pods(list(pods.values()))
    mig = VGpuCollector(
        FakeMonitor(), source, node_name="node-a", all_pods=lambda: pods, wall_clock=lambda: NOW
    )
    assert samples(scrape(mig), "hami_mig_device_info") == []
    pods["uid-1"] = mig_pod("uid-1", [allocation(1, 0)])
    assert len(samples(scrape(mig), "hami_mig_device_info")) == 1
    del pods["uid-1"]
    assert samples(scrape(mig), "hami_mig_device_info") == []


def test_host_families_and_mig_pause() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(name="Tesla T4", uuid="GPU-host", memory_used=1024)])
    monitor = FakeMonitor()
    sampler = HostGpuSampler(nvml)
    host = collector(monitor, host=sampler)
    text = scrape(host)
    assert samples(text, "hami_host_gpu_memory_used_bytes") == [
        (
            {
                "node": "node-a",
                "device_index": "0",
                "device_uuid": "GPU-host",
                "device_type": "NVIDIA-Tesla T4",
                "zone": "vGPU",
            },
            1024,
        )
    ]
    monitor.paused = True  # the MIG lock holds the monitor
    calls = nvml.init_calls, nvml.shutdown_calls
    text = scrape(host)
    assert samples(text, "hami_host_gpu_memory_used_bytes") == []
    # A scrape only reads: releasing NVML is serve_nvml_release's job (test_hostgpu.py).
    assert nvml.initialized
    assert (nvml.init_calls, nvml.shutdown_calls) == calls
    sampler.pause()  # what serve_nvml_release does when it sees the lock
    monitor.paused = False
    assert samples(scrape(host), "hami_host_gpu_utilization_ratio") == []  # not resumed yet
    assert nvml.init_calls == 1
    sampler.resume()  # serve_nvml_release again, once the lock is gone
    assert len(samples(scrape(host), "hami_host_gpu_utilization_ratio")) == 1
    assert nvml.init_calls == 2


def test_build_info() -> None:
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector())
    ((labels, value),) = samples(generate_latest(registry).decode(), "hami_build_info")
    assert value == 1
    assert set(labels) == {"version", "python_version", "trio_version"}


def test_registering_twice_is_refused() -> None:
    registry = CollectorRegistry()
    registry.register(collector(FakeMonitor(), []))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(collector(FakeMonitor(), []))


def _full_output(legacy: bool) -> str:
    monitor = FakeMonitor(
        [
            fake_container(
                "uid-1", "main-a", FakeSnapshot(last_kernel_time=NOW - 1, recent_kernel=-1)
            )
        ]
    )
    nvml = FakeNvml(gpus=[FakeGpu()])
    mig = collector(
        monitor, [mig_pod("uid-1", [allocation(1, 0)])], legacy=legacy, host=HostGpuSampler(nvml)
    )
    registry = CollectorRegistry()
    registry.register(mig)
    registry.register(BuildInfoCollector())
    return render_metrics(registry, "", [])[0].decode()  # what the endpoint serves


LEGACY_CAMEL_CASE = {
    "HostGPUMemoryUsage",
    "HostCoreUtilization",
    "vGPU_device_memory_usage_in_bytes",
    "vGPU_device_memory_limit_in_bytes",
    "MigInfo",
}


def test_lint_clean() -> None:
    assert lint(_full_output(legacy=False)) == set()
    # With legacy names, the only findings are upstream's camelCase legacy names.
    problems = lint(_full_output(legacy=True))
    assert {metric for metric, _ in problems} == LEGACY_CAMEL_CASE
    assert {text for _, text in problems} == {
        "metric names should be written in 'snake_case' not 'camelCase'"
    }


def test_lint_finds_problems() -> None:
    bad = (
        "# TYPE fooCount counter\nfooCount 1\n"
        "# HELP x_total x\n# TYPE x_total gauge\nx_total 1\n"
        '# HELP t_milliseconds t\n# TYPE t_milliseconds gauge\nt_milliseconds{le="1"} 1\n'
    )
    found = lint(bad)
    assert ("fooCount", "no help text") in found
    assert ("fooCount", 'counter metrics should have "_total" suffix') in found
    assert ("fooCount", "metric names should be written in 'snake_case' not 'camelCase'") in found
    assert ("x_total", 'non-counter metrics should not have "_total" suffix') in found
    assert ("t_milliseconds", 'use base unit "seconds" instead of "milliseconds"') in found
    assert ("t_milliseconds", 'non-histogram metrics should not have "le" label') in found


def test_lint_refuses_text_it_cannot_parse() -> None:
    with pytest.raises(AssertionError, match="could not lint"):
        lint("garbage{\n")


def test_openmetrics_rendering_parses() -> None:
    monitor = FakeMonitor([fake_container("uid-1", "worker")])
    text = scrape(collector(monitor, [hami_pod()], legacy=True), openmetrics=True)
    names = {f.name for f in parse_openmetrics(text)}
    assert {"hami_vgpu_memory_used_bytes", "Device_memory_desc_of_container"} <= names


def _samples_of(families: object) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    # Values as float64, as Prometheus reads them (the fast path writes integers exactly).
    return {
        (s.name, frozenset(s.labels.items()), float(s.value))
        for family in families  # type: ignore[attr-defined]
        for s in family.samples
    }


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_fast_rendering_equals_prometheus_client(openmetrics: bool) -> None:
    """The endpoint's self-rendered families parse to exactly what prometheus-client writes,
    including label values a tenant controls (the UUID bytes of its file)."""
    from prometheus_client import Counter, Histogram

    hostile = 'GPU-"q"\\b\nc{}=,'
    devices = (FakeDevice(0), FakeDevice(1, FakeUUID(hostile), memory_total=(1 << 64) - 1))
    snap = FakeSnapshot(devices, recent_kernel=-1, last_kernel_time=NOW - 3)
    monitor = FakeMonitor([fake_container("uid-1", "worker", snap)])
    registry = CollectorRegistry()
    registry.register(
        collector(
            monitor, [mig_pod("uid-1", [allocation(1, 0)], containers=("worker",))], legacy=True
        )
    )
    registry.register(BuildInfoCollector())
    Counter("test_requests", "requests", ["code"], registry=registry).labels("200").inc(3)
    Histogram("test_seconds", "latency", registry=registry).observe(0.2)
    if openmetrics:
        accept = "application/openmetrics-text;version=1.0.0"
        body, content_type = render_metrics(registry, accept, [])
        assert content_type.startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n")
        assert body.count(b"# EOF") == 1
        fast = _samples_of(parse_openmetrics(body.decode()))
        slow = _samples_of(parse_openmetrics(generate_openmetrics(registry).decode()))
    else:
        body, content_type = render_metrics(registry, "", [])
        assert content_type == "text/plain; version=0.0.4; charset=utf-8"
        fast = _samples_of(text_string_to_metric_families(body.decode()))
        slow = _samples_of(text_string_to_metric_families(generate_latest(registry).decode()))
    assert fast == slow
    assert any(dict(labels).get("device_uuid") == hostile for _, labels, _ in fast)
    assert len(fast) > 30
    # name[] filtering goes through prometheus-client and still works.
    filtered, _ = render_metrics(registry, "", ["hami_vgpu_memory_used_bytes"])
    assert {f.name for f in text_string_to_metric_families(filtered.decode())} == {
        "hami_vgpu_memory_used_bytes"
    }


# Tenant data never fails a scrape -----------------------------------------------------------


@dataclass(frozen=True)
class ExplodingDevice:
    """A device whose rows cannot be built (stands for any failure inside one container)."""

    index: int
    uuid: FakeUUID = FakeUUID(UUID)

    @property
    def memory_total(self) -> int:
        raise RuntimeError("boom")


def errors(text: str) -> dict[str, float]:
    return {
        labels["phase"]: value
        for labels, value in samples(text, "hami_trio_collector_errors_total")
    }


def test_a_failing_container_drops_only_its_own_rows(caplog: pytest.LogCaptureFixture) -> None:
    good = fake_container("uid-1", "worker")
    # Its first device renders, then the second raises: nothing of it may remain.
    devices = (FakeDevice(0), ExplodingDevice(1))
    bad = fake_container("uid-2", "worker", FakeSnapshot(devices))  # type: ignore[arg-type]
    pods = [hami_pod(), hami_pod("uid-2", name="hostile")]
    mig = collector(FakeMonitor([bad, good]), pods, legacy=True)
    with caplog.at_level(logging.WARNING, logger="hami_trio.metrics.collector"):
        text = scrape(mig)
        text_again = scrape(mig)
    for name in (
        "hami_vgpu_memory_used_bytes",
        "hami_trio_container_blocked",
        "Device_memory_desc_of_container",
    ):
        assert {labels.get("pod", labels.get("podname")) for labels, _ in samples(text, name)} == {
            "trainer-0"
        }, name
    assert errors(text) == {"container": 1, "mig": 0, "pods": 0, "host": 0, "allocated": 0}
    assert errors(text_again)["container"] == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["container worker of pod uid-2: left out of /metrics: RuntimeError: boom"]


def test_surrogates_in_names_cost_only_that_container() -> None:
    pods = [hami_pod(), hami_pod("uid-2", name="bad\udcff", containers=("worker",))]
    mig = collector(
        FakeMonitor([fake_container("uid-1", "worker"), fake_container("uid-2", "worker")]), pods
    )
    registry = CollectorRegistry()
    registry.register(mig)
    text = render_metrics(registry, "", [])[0].decode("utf-8")  # what the endpoint encodes
    assert {labels["pod"] for labels, _ in samples(text, "hami_vgpu_memory_used_bytes")} == {
        "trainer-0"
    }
    assert errors(text)["container"] == 1


def test_failing_sources_cost_only_their_part() -> None:
    class BrokenNvml(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("nvml gone")

    def no_pods() -> Mapping[str, PodInfo]:
        raise RuntimeError("no pods")

    source = Pods([hami_pod()])
    mig = VGpuCollector(
        FakeMonitor([fake_container("uid-1", "worker")]),
        source,
        node_name="node-a",
        all_pods=no_pods,
        host=HostGpuSampler(BrokenNvml(gpus=[FakeGpu()])),
        wall_clock=lambda: NOW,
    )
    text = scrape(mig)
    assert samples(text, "hami_vgpu_memory_used_bytes") == [(LABELS, 8000)]
    assert errors(text) == {"container": 0, "mig": 0, "pods": 1, "host": 1, "allocated": 0}


# Tenants as (pod name, container name, MIG annotation); the fuzz target reuses this.
TENANTS = st.lists(
    st.tuples(
        st_metrics.hostile_text(), st_metrics.hostile_text(), st_metrics.hostile_mig_annotations()
    ),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(TENANTS)
def test_no_tenant_data_fails_a_scrape(tenants: list[tuple[str, str, str]]) -> None:
    good = mig_pod("uid-good", [allocation(1, 0)])
    pods = [good]
    containers = [fake_container("uid-good", "main-a")]
    for index, (name, container, annotation) in enumerate(tenants):
        uid = f"uid-{index}"
        # (namespace, name) is unique in Kubernetes: each tenant gets its own namespace.
        namespace = f"tenant-{index}"
        pods.append(
            mig_pod(uid, annotation, name=name, namespace=namespace, containers=(container,))
        )
        containers.append(fake_container(uid, container))
    registry = CollectorRegistry()
    registry.register(collector(FakeMonitor(containers), pods))
    text = render_metrics(registry, "", [])[0].decode("utf-8")
    mine = [
        labels
        for labels, _ in samples(text, "hami_vgpu_memory_used_bytes")
        if labels["namespace"] == "team-a"
    ]
    assert [labels["container"] for labels in mine] == ["main-a"]
    rows = samples(text, "hami_mig_device_info")
    assert [labels["mig_uuid"] for labels, _ in rows if labels["namespace"] == "team-a"] == [
        "MIG-1-0"
    ]
    per_pod: dict[tuple[str, str], int] = {}
    for labels, _ in rows:
        key = (labels["namespace"], labels["pod"])
        per_pod[key] = per_pod.get(key, 0) + 1
        assert all(len(value) <= 256 for value in labels.values())
    assert all(count <= 128 for count in per_pod.values())


# Rendered lines kept across scrapes ----------------------------------------------------------


class RenamingPods(Pods):
    """Pods whose objects the test replaces between scrapes (a pod renamed under its UID)."""

    def rename(self, pod: PodInfo) -> None:
        self._all = {**self._all, pod.uid: pod}

    def lookup(self, uid: str) -> PodInfo | None:
        return self._all.get(uid)


def test_kept_lines_follow_the_pod_names_for_the_same_snapshot() -> None:
    # The very same container and snapshot objects: only the pod's names change.
    monitor = FakeMonitor([fake_container("uid-1", "worker")])
    source = RenamingPods([hami_pod()])
    mig = VGpuCollector(monitor, source, node_name="node-a", wall_clock=lambda: NOW)
    registry = CollectorRegistry()
    registry.register(mig)

    def pods_of(name: str) -> list[str]:
        text = render_metrics(registry, "", [])[0].decode()
        return [labels["pod"] for labels, _ in samples(text, name)]

    assert pods_of("hami_vgpu_memory_used_bytes") == ["trainer-0"]
    source.rename(hami_pod(name="trainer-renamed"))
    for name in ("hami_vgpu_memory_used_bytes", "hami_trio_container_blocked"):
        assert pods_of(name) == ["trainer-renamed"], name


def test_samples_of_kept_lines_equal_the_text() -> None:
    # The samples path (name[] filtering, generate_latest) builds the rows again from the
    # kept objects: it must give exactly what the text says, on the second scrape too.
    snap = FakeSnapshot(
        devices=(FakeDevice(0), FakeDevice(1, memory_total=123, sm_util=7)),
        recent_kernel=-1,
        last_kernel_time=NOW - 9,
    )
    monitor = FakeMonitor([fake_container("uid-1", "worker", snap)])
    mig = collector(monitor, [hami_pod()], legacy=True)
    registry = CollectorRegistry()
    registry.register(mig)

    def parsed(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
        return {
            (s.name, frozenset(s.labels.items()), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    for _ in range(2):
        fast = parsed(render_metrics(registry, "", [])[0].decode())
        assert parsed(generate_latest(registry).decode()) == fast
        assert (
            "hami_trio_container_blocked",
            frozenset({"namespace": "team-a", "pod": "trainer-0", "container": "worker"}.items()),
            1.0,
        ) in fast
        assert {v for n, _, v in fast if n == "Device_last_kernel_of_container"} == {9.0}


def test_kept_lines_only_for_the_containers_of_the_latest_scrape() -> None:
    containers = [fake_container(f"uid-{i}", "worker") for i in range(5)]
    monitor = FakeMonitor(list(containers))
    pods = [hami_pod(f"uid-{i}", name=f"p-{i}") for i in range(5)]
    mig = collector(monitor, pods)
    scrape(mig)
    assert len(mig._rendered) == 5
    monitor.items = containers[:1]
    text = scrape(mig)
    assert len(mig._rendered) == 1  # bounded by what the monitor holds now
    assert [labels["pod"] for labels, _ in samples(text, "hami_vgpu_memory_used_bytes")] == ["p-0"]


def test_two_scrapes_at_once_give_what_one_gives() -> None:
    # The HTTP server renders in up to two worker threads: both read and replace the kept
    # lines (and one container's elapsed-seconds lines) without a lock.
    import threading

    containers = [
        fake_container(f"uid-{i}", "worker", FakeSnapshot(last_kernel_time=NOW - i))
        for i in range(50)
    ]
    pods = [hami_pod(f"uid-{i}", name=f"p-{i}") for i in range(50)]
    clock = [float(NOW)]
    mig = VGpuCollector(
        FakeMonitor(containers),
        Pods(pods),
        node_name="node-a",
        legacy=True,
        wall_clock=lambda: clock[0],
    )
    registry = CollectorRegistry()
    registry.register(mig)
    first = render_metrics(registry, "", [])[0]
    results: list[bytes] = []

    def scrape_many() -> None:
        for _ in range(40):
            results.append(render_metrics(registry, "", [])[0])

    threads = [threading.Thread(target=scrape_many) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 80
    assert all(result == first for result in results)
    clock[0] += 3  # one second later (three): every elapsed value moves, in both threads
    results.clear()
    threads = [threading.Thread(target=scrape_many) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    later = {
        labels["podname"]: value
        for labels, value in samples(results[-1].decode(), "Device_last_kernel_of_container")
    }
    assert later == {f"p-{i}": i + 3.0 for i in range(50)}
    assert len(set(results)) == 1


def test_a_scrape_makes_no_reference_cycles() -> None:
    """Every scrape's families and rows are freed by reference counting when the scrape is
    done: held in a cycle, megabytes of them would wait for a cyclic collection."""
    good = mig_pod("uid-good", [allocation(1, 0)])
    registry = CollectorRegistry()
    registry.register(collector(FakeMonitor([fake_container("uid-good", "main-a")]), [good]))
    render_metrics(registry, "", [])  # caches filled
    gc.collect()
    gc.disable()
    try:
        text = render_metrics(registry, "", [])[0]
        assert b"hami_vgpu_memory_used_bytes" in text
        del text
        assert gc.collect() == 0
    finally:
        gc.enable()
