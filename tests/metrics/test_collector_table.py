"""The container families, each pinned to its own source field, and the whole /metrics body of a
fixed tree pinned byte for byte (legacy names on and off).

The fixture gives every field of every device, snapshot and insight a value no other field
has, so a family that reads another family's field (two getters swapped in the collector's
table) shows here even where lengths, labels and types all agree.  The expected values are
written from the fixture alone, not from the collector.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hami_trio.metrics import collector as collector_module
from hami_trio.metrics.collector import VGpuCollector
from hami_trio.metrics.endpoint import render_metrics
from hami_trio.monitor.state import ContainerKey, ContainerState, ContainerStatus
from hami_trio.pods.source import PodInfo
from tests.metrics.test_collector import Pods

NOW = 1_700_000_100
GOLDEN = Path(__file__).parent / "golden"


@dataclass(frozen=True)
class UUID:
    label: str | None


@dataclass(frozen=True)
class Device:
    index: int
    uuid: UUID
    memory_limit: int
    memory_total: int
    context_size: int
    module_size: int
    buffer_size: int
    sm_util: int


def device(index: int, base: int, uuid: str | None) -> Device:
    """A device whose six fields are ``base + 1`` .. ``base + 6`` (no two alike)."""
    return Device(index, UUID(uuid), base + 1, base + 2, base + 3, base + 4, base + 5, base + 6)


@dataclass(frozen=True)
class Snapshot:
    devices: Sequence[Device]
    recent_kernel: int = 0
    last_kernel_time: int = 0


@dataclass(frozen=True)
class Counts:
    running: int
    exited: int
    unknown: int


@dataclass(frozen=True)
class Block:
    seconds: float
    blocks: int


@dataclass(frozen=True)
class Insight:
    processes: Counts
    priority: int
    utilization_switch: int
    block: Block
    core_limits: Sequence[int]
    device_processes: Sequence[int]
    devices: Sequence[Device] | None = None


def insight(base: int, **kwargs: Any) -> Insight:
    """An insight whose fields are ``base + 1`` .. (no two alike, none like a device's)."""
    fields: dict[str, Any] = {
        "processes": Counts(base + 1, base + 2, base + 3),
        "priority": base + 4,
        "utilization_switch": base + 5,
        "block": Block(base + 6.5, base + 7),
        "core_limits": (base + 8, base + 18),
        "device_processes": (base + 9, base + 19),
    }
    fields.update(kwargs)
    return Insight(**fields)


#: What the collector reads of a container: the monitor's own value, with a fake snapshot.
Container = ContainerState[Snapshot]


def container(pod_uid: str, container_name: str, snapshot: Snapshot | None) -> Container:
    key = ContainerKey(pod_uid, container_name)
    loaded = snapshot is not None
    return ContainerState(
        key,
        f"/hook/containers/{key.dirname}",
        "x.cache" if loaded else None,
        ContainerStatus.LOADED if loaded else ContainerStatus.NO_CACHE_FILE,
        snapshot,
        None,
    )


@dataclass(frozen=True)
class Usage:
    containers: Mapping[str, Container]
    insights: Mapping[str, Insight]


@dataclass
class Monitor:
    items: dict[str, Container]
    insight_of: dict[str, Insight] = field(default_factory=dict)
    paused: bool = False

    def containers(self) -> Mapping[str, Container]:
        return self.items

    def insights(self) -> Mapping[str, Insight]:
        return self.insight_of

    def usage(self) -> Usage:
        return Usage(self.items, self.insight_of)


GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
GPU_C = "GPU-cccccccc-1111-2222-3333-444444444444"

MIG_ANNOTATION = json.dumps(
    [
        {
            "containerIndex": 1,
            "deviceIndex": 1,
            "gpuUUID": GPU_B,
            "profile": "1g.10gb",
            "placement": {"start": 0, "size": 1},
            "migUUID": "MIG-1-1",
            "gpuInstanceID": 7,
            "computeInstanceID": 3,
        }
    ]
)


def pod(uid: str, namespace: str, name: str, containers: tuple[str, ...], **kw: Any) -> PodInfo:
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=name,
        containers=containers,
        labels={"hami.io/vgpu-node": "node-a"},
        **kw,
    )


PODS = (
    pod("uid-1", "team-a", "trainer-0", ("worker",), init_containers=("init",)),
    pod("uid-2", "team-b", "serve-1", ("main",)),
    pod("uid-3", "team-c", "batch-2", ("side",)),
    pod(
        "uid-5",
        "team-a",
        "mig-3",
        ("boot", "gpu"),
        annotations={"hami.io/vgpu-mig-allocations": MIG_ANNOTATION},
    ),
)


def fixture() -> Monitor:
    """Four directories: a blocked container with two devices (and an unused slot), one whose
    sums leave out exited slots (its parts exceed the total: the legacy offset wraps), one
    without an insight, and one of an unknown pod (not exported)."""
    items = {
        "uid-1_worker": container(
            "uid-1",
            "worker",
            Snapshot(
                (device(0, 100, GPU_A), device(1, 200, GPU_B), device(2, 300, None)),
                recent_kernel=-1,
                last_kernel_time=NOW - 16,
            ),
        ),
        "uid-2_main": container(
            "uid-2", "main", Snapshot((device(0, 400, GPU_C),), last_kernel_time=NOW - 60)
        ),
        "uid-3_side": container("uid-3", "side", Snapshot((device(0, 600, GPU_A),))),
        "uid-4_gone": container("uid-4", "gone", Snapshot((device(0, 700, GPU_A),))),
    }
    without_exited = Device(0, UUID(GPU_C), 501, 100, 70, 20, 30, 506)
    insights = {
        "uid-1_worker": insight(1000),
        "uid-2_main": insight(
            2000, devices=(without_exited,), core_limits=(), device_processes=(2009,)
        ),
    }
    return Monitor(items, insights)


def collector(monitor: Monitor, *, legacy: bool) -> VGpuCollector:
    source = Pods(PODS)
    return VGpuCollector(
        monitor,
        source,
        node_name="node-a",
        all_pods=source.pods,
        legacy=legacy,
        wall_clock=lambda: NOW,
        insights=True,
    )


def body(*, legacy: bool) -> bytes:
    registry = CollectorRegistry()
    registry.register(collector(fixture(), legacy=legacy))
    text, _ = render_metrics(registry, "", [])
    return text


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def expected_series(*, legacy: bool) -> Series:
    """Every container and insight series of :func:`fixture`, from its fields alone."""
    out: Series = {}

    def put(name: str, labels: dict[str, str], value: float) -> None:
        out[(name, frozenset(labels.items()))] = float(value)

    monitor = fixture()
    for key, container in monitor.items.items():
        found = [p for p in PODS if p.uid == container.pod_uid]
        if not found or container.snapshot is None:
            continue
        owner = {"namespace": found[0].namespace, "pod": found[0].name}
        owner["container"] = container.container_name
        snap = container.snapshot
        got = monitor.insight_of.get(key)
        devices = snap.devices if got is None or got.devices is None else got.devices
        put("hami_trio_container_blocked", owner, 1 if snap.recent_kernel < 0 else 0)
        for dev in devices:
            if dev.uuid.label is None:
                continue
            ids = {"vdevice_index": str(dev.index), "device_uuid": dev.uuid.label}
            new = owner | ids | {"zone": "vGPU"}
            put("hami_vgpu_memory_used_bytes", new, dev.memory_total)
            put("hami_vgpu_memory_limit_bytes", new, dev.memory_limit)
            put("hami_container_device_memory_bytes", new, dev.memory_total)
            put("hami_container_device_utilization_ratio", new, dev.sm_util)
            put("hami_vgpu_memory_context_bytes", new, dev.context_size)
            put("hami_vgpu_memory_module_bytes", new, dev.module_size)
            put("hami_vgpu_memory_buffer_bytes", new, dev.buffer_size)
            elapsed = NOW - snap.last_kernel_time
            if snap.last_kernel_time:
                put("hami_container_last_kernel_elapsed_seconds", new, elapsed)
            if got is not None:
                if dev.index < len(got.device_processes):
                    put(
                        "hami_trio_container_device_processes",
                        owner | ids,
                        got.device_processes[dev.index],
                    )
                if dev.index < len(got.core_limits):
                    put(
                        "hami_trio_container_core_limit_ratio",
                        owner | ids,
                        got.core_limits[dev.index],
                    )
            if not legacy:
                continue
            old = {
                "podnamespace": owner["namespace"],
                "podname": owner["pod"],
                "ctrname": owner["container"],
                "vdeviceid": str(dev.index),
                "deviceuuid": dev.uuid.label,
                "zone": "vGPU",
            }
            put("vGPU_device_memory_usage_in_bytes", old, dev.memory_total)
            put("vGPU_device_memory_limit_in_bytes", old, dev.memory_limit)
            put("Device_utilization_desc_of_container", old, dev.sm_util)
            if snap.last_kernel_time:
                put("Device_last_kernel_of_container", old, elapsed)
            offset = dev.memory_total - dev.context_size - dev.module_size - dev.buffer_size
            parts = {
                "context": str(dev.context_size),
                "module": str(dev.module_size),
                "data": str(dev.buffer_size),
                "offset": str(offset % (1 << 64)),
            }
            put("Device_memory_desc_of_container", old | parts, dev.memory_total)
        if got is None:
            continue
        for state in ("running", "exited", "unknown"):
            value = getattr(got.processes, state)
            put("hami_trio_container_processes", owner | {"state": state}, value)
        put("hami_trio_container_priority", owner, got.priority)
        put("hami_trio_container_utilization_switch", owner, got.utilization_switch)
        put("hami_trio_container_blocked_seconds_total", owner, got.block.seconds)
        put("hami_trio_container_blocks_total", owner, got.block.blocks)
    mig = {"namespace": "team-a", "pod": "mig-3", "container": "gpu"}
    mig |= {"vdevice_index": "1", "device_uuid": GPU_B}
    put(
        "hami_mig_device_info",
        mig
        | {"mig_uuid": "MIG-1-1", "profile": "1g.10gb", "gpu_instance_id": "7"}
        | {"compute_instance_id": "3", "zone": "vGPU"},
        1,
    )
    if legacy:
        old_mig = {"podnamespace": "team-a", "podname": "mig-3", "ctrname": "gpu"}
        old_mig |= {"vdeviceid": "1", "deviceuuid": GPU_B, "instanceid": "7", "zone": "vGPU"}
        put("MigInfo", old_mig, 1)
    return out


#: Families that are not the containers' (their values are pinned elsewhere).
OTHER = {"hami_trio_collector_errors_total", "hami_trio_monitor_containers"}


def exported_series(text: str) -> Series:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name not in OTHER
    }


def mismatches(*, legacy: bool) -> list[str]:
    """What the collector's /metrics says differently from the fixture's fields."""
    got = exported_series(body(legacy=legacy).decode())
    want = expected_series(legacy=legacy)
    return sorted(
        f"{name}{dict(labels)}: got {got.get((name, labels))}, want {want.get((name, labels))}"
        for name, labels in got.keys() | want.keys()
        if got.get((name, labels)) != want.get((name, labels))
    )


@pytest.mark.parametrize("legacy", [False, True], ids=["new", "legacy"])
def test_each_family_reads_its_own_field(legacy: bool) -> None:
    assert mismatches(legacy=legacy) == []
    names = {name for name, _ in expected_series(legacy=legacy)}
    assert len(names) == (23 if legacy else 17)  # every container family has a series


@pytest.mark.parametrize("legacy", [False, True], ids=["new", "legacy"])
def test_metrics_body_is_pinned_byte_for_byte(legacy: bool) -> None:
    """The whole body (order, help texts, label order, number formatting) of the fixed tree:
    a change that moves one byte of it must say so by updating the golden file."""
    got = body(legacy=legacy)
    golden = (GOLDEN / f"collector_{'legacy' if legacy else 'new'}.prom").read_bytes()
    assert got == golden, hashlib.sha256(got).hexdigest()


def swapped(first: str, second: str) -> tuple[collector_module._Family, ...]:
    """The collector's table with the value fields of two families swapped."""
    table = collector_module._FAMILIES
    by_name = {family.name: family for family in table}
    a, b = by_name[first], by_name[second]
    fields = {first: (b.field, b.convert), second: (a.field, a.convert)}
    return tuple(
        replace(f, field=fields[f.name][0], convert=fields[f.name][1]) if f.name in fields else f
        for f in table
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("hami_vgpu_memory_context_bytes", "hami_vgpu_memory_module_bytes"),
        ("hami_vgpu_memory_limit_bytes", "hami_container_device_utilization_ratio"),
        ("hami_vgpu_memory_used_bytes", "hami_vgpu_memory_buffer_bytes"),
        ("hami_trio_container_priority", "hami_trio_container_utilization_switch"),
        ("hami_trio_container_blocked_seconds", "hami_trio_container_blocks"),
        ("hami_trio_container_device_processes", "hami_trio_container_core_limit_ratio"),
    ],
)
def test_two_swapped_getters_are_found(
    monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    # The pin above must see a table whose families read each other's fields.
    monkeypatch.setattr(collector_module, "_FAMILIES", swapped(first, second))
    for legacy in (False, True):
        found = mismatches(legacy=legacy)
        assert any(line.startswith((first, second)) for line in found), found


def test_every_family_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    for family in collector_module._FAMILIES:
        suffix = "_total" if family.counter else ""
        assert f"`{family.name}{suffix}`" in doc, family.name
        if family.legacy is not None:
            assert f"`{family.legacy.name}`" in doc, family.legacy.name
