"""The pod collector: allocations, pod info and pod labels, pure helpers and over real HTTP.

The HTTP tests run the real pod watch against the fake API server (tests/pods/fake_kube.py)
and the real ``/metrics`` endpoint; every expected value is what the fake serves.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from hami_trio.goparse import BindAddress
from hami_trio.metrics import pods as pods_module
from hami_trio.metrics.collector import VGpuCollector
from hami_trio.metrics.endpoint import serve_http
from hami_trio.metrics.exportstate import NODE_LABEL
from hami_trio.metrics.pods import (
    MAX_ALLOWLIST,
    MAX_LABEL_VALUE_CHARS,
    PodCollector,
    label_names,
    parse_label_allowlist,
)
from hami_trio.monitor.loop import MonitorConfig, serve_monitor
from hami_trio.pods.access import KubeAccess
from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.pods.source import PodInfo
from hami_trio.pods.watch import KubernetesPodSource, serve_pod_watch
from tests.metrics.promtool import lint, require_promtool
from tests.metrics.test_scrape import NOW, add_container, fixture_spec, get, series
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import FAST, write_kubeconfig
from tests.strategies.metrics import hostile_allocated_annotations

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
MIB = 1 << 20
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

# -- pure helpers ------------------------------------------------------------------------------


def test_label_names_are_sanitised_the_prometheus_way() -> None:
    assert label_names(["team", "app.kubernetes.io/name", "9lives", "ünï"]) == {
        "team": "label_team",
        "app.kubernetes.io/name": "label_app_kubernetes_io_name",
        "9lives": "label_9lives",
        "ünï": "label__n_",
    }


def test_colliding_names_get_numbered_in_key_order() -> None:
    names = label_names(["a_b", "a.b", "a-b", "c"])
    assert names == {
        "a-b": "label_a_b_conflict1",
        "a.b": "label_a_b_conflict2",
        "a_b": "label_a_b_conflict3",
        "c": "label_c",
    }
    # A key that already looks like a numbered name does not get the same name twice.
    tricky = label_names(["x.y", "x-y", "x_y_conflict1"])
    assert len(set(tricky.values())) == 3


@given(st.lists(st.text(st.sampled_from("ab._-/ü9"), min_size=1, max_size=4), max_size=8))
def test_names_are_valid_unique_and_independent_of_order(keys: list[str]) -> None:
    names = label_names(keys)
    assert set(names) == set(keys)
    assert len(set(names.values())) == len(names)
    assert all(_NAME.match(name) and name.startswith("label_") for name in names.values())
    assert label_names(reversed(keys)) == names


def test_allowlist_parsing() -> None:
    assert parse_label_allowlist("team, app,,team, app.kubernetes.io/name ") == (
        "team",
        "app",
        "app.kubernetes.io/name",
    )
    assert parse_label_allowlist("") == ()
    for bad, words in [
        ("te am", "not a Kubernetes label key"),
        ("a=b", "not a Kubernetes label key"),
        ("tëam", "not a Kubernetes label key"),
        ("x" * 400, "too long"),
        (",".join(f"k{i}" for i in range(MAX_ALLOWLIST + 1)), f"at most {MAX_ALLOWLIST}"),
    ]:
        with pytest.raises(ValueError, match=words) as info:
            parse_label_allowlist(bad, name="HAMI_TRIO_POD_LABELS_ALLOWLIST")
        assert str(info.value).startswith("HAMI_TRIO_POD_LABELS_ALLOWLIST: ")


# -- the collector without sockets -------------------------------------------------------------


def pod(uid: str = "u1", **kwargs: object) -> PodInfo:
    fields: dict[str, object] = {
        "uid": uid,
        "namespace": "team-a",
        "name": f"pod-{uid}",
        "containers": ("main",),
        "labels": {NODE_LABEL: "node-a"},
        "annotations": {ALLOCATED_ANNOTATION: f"{GPU_A},NVIDIA,1024,25:;"},
        "phase": "Running",
    }
    fields.update(kwargs)
    return PodInfo(**fields)  # type: ignore[arg-type]


def rows(collector: PodCollector, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(sample.labels), sample.value)
        for family in collector.collect()
        for sample in family.samples
        if sample.name == name
    ]


def test_decoding_and_rendering_happen_once_per_pod_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = pods_module.decode_allocated  # type: ignore[attr-defined]  # the name it imported

    def counting(raw: str | None) -> object:
        calls.append(raw or "")
        return real(raw)

    monkeypatch.setattr(pods_module, "decode_allocated", counting)
    # Like the watch's: a new immutable snapshot after every change.
    snapshot = {"u1": pod("u1"), "u2": pod("u2")}
    collector = PodCollector(lambda: snapshot, node_name="node-a")
    for _ in range(3):
        assert len(rows(collector, "hami_trio_container_allocated_memory_bytes")) == 2
    assert len(calls) == 2
    # The same snapshot: the very same families (each renders its text once).
    first = collector.collect()
    assert [id(f) for f in collector.collect()] == [id(f) for f in first]
    # A change of anything but the annotation renders the pod again without decoding it.
    snapshot = snapshot | {"u1": pod("u1", labels={NODE_LABEL: "node-a", "team": "x"})}
    rows(collector, "hami_trio_pod_info")
    assert len(calls) == 2
    snapshot = snapshot | {
        "u1": pod("u1", annotations={ALLOCATED_ANNOTATION: f"{GPU_B},NVIDIA,1,1:;"})
    }
    memory = rows(collector, "hami_trio_container_allocated_memory_bytes")
    assert sorted((labels["pod"], labels["device_uuid"], v) for labels, v in memory) == [
        ("pod-u1", GPU_B, 1 * MIB),
        ("pod-u2", GPU_A, 1024 * MIB),
    ]
    assert len(calls) == 3
    snapshot = {"u1": snapshot["u1"]}
    assert len(rows(collector, "hami_trio_pod_info")) == 1
    assert set(collector._decoded) == {"u1"}  # forgotten with the pod: bounded


def test_completed_pods_keep_their_info_but_lose_their_allocation() -> None:
    pods = {"u1": pod("u1", phase="Succeeded"), "u2": pod("u2", phase="Failed"), "u3": pod("u3")}
    collector = PodCollector(lambda: pods, node_name="node-a")
    memory = rows(collector, "hami_trio_container_allocated_memory_bytes")
    assert [labels["pod"] for labels, _ in memory] == ["pod-u3"]
    info = {labels["pod"]: labels["phase"] for labels, _ in rows(collector, "hami_trio_pod_info")}
    assert info == {"pod-u1": "Succeeded", "pod-u2": "Failed", "pod-u3": "Running"}


def test_pods_of_other_nodes_are_left_out() -> None:
    pods = {"u1": pod("u1", labels={NODE_LABEL: "node-b"}), "u2": pod("u2", labels={})}
    collector = PodCollector(lambda: pods, node_name="node-a", label_allowlist=("team",))
    assert collector.collect() == []


def test_label_values_are_cut_and_missing_labels_are_empty() -> None:
    long = "v" * (MAX_LABEL_VALUE_CHARS + 50)
    pods = {
        "u1": pod("u1", labels={NODE_LABEL: "node-a", "team": long}),
        "u2": pod("u2"),
    }
    collector = PodCollector(lambda: pods, node_name="node-a", label_allowlist=("team", "app"))
    got = {labels["pod"]: labels for labels, _ in rows(collector, "hami_trio_pod_labels")}
    assert got["pod-u1"]["label_team"] == "v" * MAX_LABEL_VALUE_CHARS
    assert got["pod-u2"] == {
        "namespace": "team-a",
        "pod": "pod-u2",
        "label_team": "",
        "label_app": "",
    }


@given(hostile_allocated_annotations())
def test_a_hostile_annotation_costs_only_its_pod(raw: str) -> None:
    failures: list[str] = []
    pods = {
        "good": pod("good"),
        "evil": pod("evil", annotations={ALLOCATED_ANNOTATION: raw}, containers=("a", "b")),
    }
    collector = PodCollector(
        lambda: pods,
        node_name="node-a",
        report_failure=lambda phase, *_: failures.append(phase),
    )
    memory = rows(collector, "hami_trio_container_allocated_memory_bytes")
    good = [(labels, value) for labels, value in memory if labels["pod"] == "pod-good"]
    assert good == [
        (
            {
                "namespace": "team-a",
                "pod": "pod-good",
                "container": "main",
                "vdevice_index": "0",
                "device_uuid": GPU_A,
            },
            1024 * MIB,
        )
    ]
    evil = [labels for labels, _ in memory if labels["pod"] == "pod-evil"]
    assert len(evil) <= 128
    assert failures in ([], ["allocated"])
    assert len(rows(collector, "hami_trio_pod_info")) == 2  # its info row stays


# -- over real HTTP ----------------------------------------------------------------------------


async def watch(
    nursery: trio.Nursery, fake: FakeKubeApi, tmp_path: Path, allowlist: tuple[str, ...] = ()
) -> KubernetesPodSource:
    source = KubernetesPodSource("node-a")
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    # As the agent does: the watch keeps only the labels the allow-list exports.
    settings = dataclasses.replace(FAST, keep=FAST.keep.with_labels(allowlist))
    await nursery.start(
        partial(serve_pod_watch, source, KubeAccess(kubeconfig=kubeconfig), settings=settings)
    )
    with trio.fail_after(10):
        while not source.ready:  # noqa: ASYNC110 - the watch and the fake are independent
            await trio.sleep(0.01)
    return source


async def serve_stack(
    nursery: trio.Nursery, hook: Path, source: KubernetesPodSource, allowlist: tuple[str, ...]
) -> int:
    registry = CollectorRegistry()
    config = MonitorConfig(hook_path=hook, interval=0.05, mig_lock_path=hook.parent / "mig" / "l")
    monitor = await nursery.start(
        partial(serve_monitor, config, pod_source=source, registry=registry)
    )
    vgpu = VGpuCollector(
        monitor, source, node_name="node-a", all_pods=source.pods, wall_clock=lambda: NOW
    )
    # The pod collector first, so that its failures are in the same scrape's error counter.
    registry.register(
        PodCollector(
            source.pods,
            node_name="node-a",
            label_allowlist=allowlist,
            report_failure=vgpu.report_failure,
        )
    )
    registry.register(vgpu)
    bound: BindAddress = await nursery.start(
        partial(serve_http, BindAddress("127.0.0.1", 0), registry)
    )
    return bound.port


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    path = tmp_path / "hook"
    (path / "containers").mkdir(parents=True)
    return path


def by_name(text: str, name: str) -> set[tuple[frozenset[tuple[str, str]], float]]:
    return {(labels, value) for n, labels, value in series(text) if n == name}


def labelled(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


async def wait_for(port: int, check: object) -> str:
    assert callable(check)
    with trio.fail_after(10):
        while True:
            status, text = await get(port)
            assert status == 200
            if check(text):
                return text
            await trio.sleep(0.02)


async def test_allocation_info_and_labels_over_http_before_any_cache_file(
    nursery: trio.Nursery, hook: Path, tmp_path: Path
) -> None:
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    uid = fake.add_pod(
        "trainer-0",
        namespace="team-a",
        init_containers=("setup",),
        containers=("main", "sidecar"),
        labels={NODE_LABEL: "node-a", "team": "vision", "app.kubernetes.io/name": "train"},
        # setup: one device; main: none; sidecar: two; then the encoder's trailing entry.
        annotations={
            ALLOCATED_ANNOTATION: f"{GPU_A},NVIDIA,2048,10:;;{GPU_A},NVIDIA,4096,30:"
            f"{GPU_B},NVIDIA,8192,0:;"
        },
        phase="Pending",
    )
    fake.add_pod("elsewhere", node="node-b", labels={NODE_LABEL: "node-b"})
    allowlist = ("team", "app.kubernetes.io/name")
    source = await watch(nursery, fake, tmp_path, allowlist)
    port = await serve_stack(nursery, hook, source, allowlist)
    _, text = await get(port)  # no container directory exists at all
    ids = {"namespace": "team-a", "pod": "trainer-0"}
    expected = {
        ("setup", "0", GPU_A, 2048, 10),
        ("sidecar", "0", GPU_A, 4096, 30),
        ("sidecar", "1", GPU_B, 8192, 0),
    }
    assert by_name(text, "hami_trio_container_allocated_memory_bytes") == {
        (labelled(**ids, container=c, vdevice_index=i, device_uuid=u), float(m * MIB))
        for c, i, u, m, _ in expected
    }
    assert by_name(text, "hami_trio_container_allocated_cores_ratio") == {
        (labelled(**ids, container=c, vdevice_index=i, device_uuid=u), float(cores))
        for c, i, u, _, cores in expected
    }
    assert by_name(text, "hami_trio_pod_info") == {
        (labelled(**ids, pod_uid=uid, node="node-a", phase="Pending"), 1.0)
    }
    assert by_name(text, "hami_trio_pod_labels") == {
        (labelled(**ids, label_team="vision", label_app_kubernetes_io_name="train"), 1.0)
    }
    # The pod runs, then completes: the allocation goes with the phase, the info row stays.
    fake.modify_pod(uid, phase="Running")
    await wait_for(port, lambda t: 'phase="Running"' in t)
    fake.modify_pod(uid, phase="Succeeded")
    text = await wait_for(port, lambda t: 'phase="Succeeded"' in t)
    assert by_name(text, "hami_trio_container_allocated_memory_bytes") == set()
    assert by_name(text, "hami_trio_pod_info") == {
        (labelled(**ids, pod_uid=uid, node="node-a", phase="Succeeded"), 1.0)
    }
    fake.delete_pod(uid)
    text = await wait_for(port, lambda t: "hami_trio_pod_info{" not in t)
    assert by_name(text, "hami_trio_pod_labels") == set()


async def test_a_malformed_annotation_costs_that_pod_once_over_http(
    nursery: trio.Nursery, hook: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami_trio")
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    good = fake.add_pod(
        "good",
        namespace="team-a",
        labels={NODE_LABEL: "node-a"},
        annotations={ALLOCATED_ANNOTATION: f"{GPU_A},NVIDIA,1024,50:;"},
    )
    fake.add_pod(
        "broken",
        namespace="team-evil",
        labels={NODE_LABEL: "node-a"},
        annotations={ALLOCATED_ANNOTATION: f"{GPU_A},NVIDIA,lots,50:;"},
    )
    add_container(hook, good, "main", fixture_spec())
    source = await watch(nursery, fake, tmp_path)
    port = await serve_stack(nursery, hook, source, ())
    for _ in range(3):
        status, text = await get(port)
        assert status == 200
        allocated = by_name(text, "hami_trio_container_allocated_memory_bytes")
        assert {dict(labels)["pod"] for labels, _ in allocated} == {"good"}
        # The good pod's upstream rows are all there.
        used = by_name(text, "hami_vgpu_memory_used_bytes")
        assert {dict(labels)["pod"] for labels, _ in used} == {"good"}
        errors = {
            dict(labels)["phase"]: v
            for labels, v in by_name(text, "hami_trio_collector_errors_total")
        }
        assert errors["allocated"] == 1.0  # once per value: decoding is cached
    warnings = [r.getMessage() for r in caplog.records if "team-evil/broken" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert ALLOCATED_ANNOTATION in warnings[0]
    assert "memory 'lots' is not an integer" in warnings[0]


async def test_pod_families_pass_promtool(
    nursery: trio.Nursery, hook: Path, tmp_path: Path
) -> None:
    promtool = require_promtool()
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    fake.add_pod(
        "trainer-0",
        labels={NODE_LABEL: "node-a", "team": "vision"},
        annotations={ALLOCATED_ANNOTATION: f"{GPU_A},NVIDIA,2048,10:;"},
    )
    source = await watch(nursery, fake, tmp_path, ("team",))
    port = await serve_stack(nursery, hook, source, ("team",))
    _, text = await get(port)
    for name in (
        "hami_trio_container_allocated_memory_bytes",
        "hami_trio_container_allocated_cores_ratio",
        "hami_trio_pod_info",
        "hami_trio_pod_labels",
        "hami_trio_monitor_containers",
        "hami_trio_monitor_last_tick_timestamp_seconds",
    ):
        assert f"\n{name}" in text, name
    assert await trio.to_thread.run_sync(lint, text, promtool) == set()
