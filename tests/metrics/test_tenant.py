"""Hostile tenant input against a real scrape: one pod's data must never fail ``/metrics``.

Everything here runs for real: the fake API server speaks the Kubernetes list/watch wire
format to the real kubernetes-asyncio client, the monitor ticks over real ``.cache`` files,
and ``/metrics`` is fetched over HTTP from the real endpoint.  A pod's annotations and labels
are written by whoever creates the pod (no GPU request is needed), so each case plants its
value in an ordinary pod on this node and checks that only that pod loses its rows.
"""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from pathlib import Path

import pytest
import trio

from hami_trio.metrics.hostgpu import HostGpuSampler
from hami_trio.pods.access import KubeAccess
from hami_trio.pods.source import StaticPodSource
from hami_trio.pods.watch import KubernetesPodSource, serve_pod_watch
from hami_trio.testing.regions import write_region
from tests.metrics.fake_nvml import FakeGpu, FakeNvml
from tests.metrics.test_scrape import (
    CONTAINER_FAMILIES,
    GPU_A,
    add_container,
    container_series,
    fixture_spec,
    get,
    hook,
    series,
    start_stack,
)
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import FAST, write_kubeconfig

__all__ = ["hook"]  # the fixture, re-exported for pytest

MIG_ANNOTATION = "hami.io/vgpu-mig-allocations"
NODE_LABEL = "hami.io/vgpu-node"


def mig_value(gpu_uuid: str = GPU_A, mig_uuid: str = "MIG-1", *, count: int = 1) -> str:
    return json.dumps(
        [
            {
                "containerIndex": 0,
                "deviceIndex": index,
                "gpuUUID": gpu_uuid,
                "profile": "1g.10gb",
                "placement": {"start": index, "size": 1},
                "migUUID": f"{mig_uuid}-{index}",
                "gpuInstanceID": 3,
                "computeInstanceID": 0,
            }
            for index in range(count)
        ]
    )


# Each value is what the pod's creator writes into the annotation (a plain string; the API
# server accepts any string there).
HOSTILE_MIG = {
    # 40 KB of nesting: json.loads raises RecursionError, which is not a ValueError.
    "nested-array": "[" * 20_000 + "]" * 20_000,
    # A JSON escape for a lone surrogate: decodes to a str that cannot be encoded as UTF-8.
    "lone-surrogate": mig_value(gpu_uuid="GPU-X").replace("GPU-X", "GPU-\\ud800"),
    # Cardinality: 5,000 realised allocations from one pod.
    "huge-list": mig_value(count=5_000),
    # One label value of 100 KB.
    "huge-label": mig_value(mig_uuid="MIG-" + "x" * 100_000),
}


def mig_rows(text: str) -> list[dict[str, str]]:
    return [dict(labels) for name, labels, _ in series(text) if name == "hami_mig_device_info"]


def collector_errors(text: str) -> dict[str, float]:
    return {
        dict(labels)["phase"]: value
        for name, labels, value in series(text)
        if name == "hami_trio_collector_errors_total"
    }


async def _watch(nursery: trio.Nursery, fake: FakeKubeApi, tmp_path: Path) -> KubernetesPodSource:
    source = KubernetesPodSource("node-a")
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    await nursery.start(
        partial(serve_pod_watch, source, KubeAccess(kubeconfig=kubeconfig), settings=FAST)
    )
    with trio.fail_after(10):
        while not source.ready:  # noqa: ASYNC110 - the watch and the fake are independent
            await trio.sleep(0.01)
    return source


@pytest.mark.parametrize("attack", sorted(HOSTILE_MIG))
async def test_hostile_mig_annotation_costs_only_that_pod(
    nursery: trio.Nursery,
    hook: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    attack: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="hami_trio")
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    good = fake.add_pod(
        "trainer-0",
        namespace="team-a",
        labels={NODE_LABEL: "node-a"},
        annotations={MIG_ANNOTATION: mig_value()},
    )
    fake.add_pod(
        "hostile",
        namespace="team-evil",
        labels={NODE_LABEL: "node-a"},
        annotations={MIG_ANNOTATION: HOSTILE_MIG[attack]},
    )
    spec = fixture_spec()
    add_container(hook, good, "main", spec)
    source = await _watch(nursery, fake, tmp_path)
    nvml = FakeNvml(gpus=[FakeGpu(name="H100 80GB HBM3", uuid="GPU-host-0", memory_used=4096)])
    _, port = await start_stack(
        nursery,
        hook,
        source,
        kubernetes=True,
        all_pods=source.pods,
        host=HostGpuSampler(nvml),
    )
    for _ in range(3):
        status, text = await get(port)
        assert status == 200, text
        # The other tenant's container rows, its MIG row and the host rows are all there.
        got = {s for s in series(text) if CONTAINER_FAMILIES.match(s[0])}
        assert got == container_series("team-a", "trainer-0", "main", spec, legacy=False)
        assert [(row["pod"], row["mig_uuid"]) for row in mig_rows(text)] == [
            ("trainer-0", "MIG-1-0")
        ]
        assert any(name == "hami_host_gpu_memory_used_bytes" for name, _, _ in series(text))
        # Over 64 KiB the pod watch already leaves the value out (and counts it there); below,
        # the decoder refuses it: counted once either way.
        assert collector_errors(text)["mig"] + source.cuts()["annotation-too-long"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if "team-evil/hostile" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert MIG_ANNOTATION in warnings[0]
    assert len(warnings[0]) < 1000  # the value itself is not copied into the log


async def test_undecodable_container_name_costs_only_that_container(
    nursery: trio.Nursery, hook: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without Kubernetes, a directory name that is not UTF-8 reaches the labels as
    surrogate escapes (how Python decodes file names); it must not fail the scrape."""
    caplog.set_level(logging.WARNING, logger="hami_trio")
    spec = fixture_spec()
    add_container(hook, "pod-1", "main", spec)
    bad = os.path.join(os.fsencode(hook / "containers"), b"pod-2_\xff\xfe")
    os.mkdir(bad)
    write_region(os.fsdecode(os.path.join(bad, b"abc.cache")), spec)
    monitor, port = await start_stack(nursery, hook, StaticPodSource(), kubernetes=False)
    assert len(monitor.containers()) == 2
    for scrape in (1, 2):
        status, text = await get(port)
        assert status == 200, text
        got = {s for s in series(text) if CONTAINER_FAMILIES.match(s[0])}
        assert got == container_series("", "pod-1", "main", spec, legacy=False)
        assert collector_errors(text)["container"] == scrape  # counted per scrape
    warnings = [r.getMessage() for r in caplog.records if "pod-2" in r.getMessage()]
    assert len(warnings) == 1, warnings
