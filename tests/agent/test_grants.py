"""The feedback's pod grants: what the pod spec gives a container, and the real attack.

The attack tests run the whole agent (``serve_agent``) against the fake API server, with
real ``.cache`` files and a simulated HAMi-core per container: an attacker allocated GPU A
writes GPU B's UUID (or a better priority than its pod spec says) into its own region while
it keeps launching kernels; the victim on B (or sharing A) keeps launching too, and, like
HAMi-core, waits without launching while its ``recent_kernel`` is negative.  The victim's
control word is sampled every tick.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from hami_trio.agent.grants import pod_grants, slot_value
from hami_trio.agent.service import AgentHandle, serve_agent
from hami_trio.metrics.exportstate import NODE_LABEL
from hami_trio.monitor.feedback import Grant
from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.pods.source import PodInfo
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, write_region
from tests.agent.test_service import config_for, samples, scrape
from tests.metrics.fake_nvml import FakeGpu, FakeNvml
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import write_kubeconfig

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
SAMPLES = 40


def slot(uuid: str) -> bytes:
    return uuid.encode().ljust(96, b"\0")


def test_pod_grants_name_each_containers_allocation_and_spec_priority() -> None:
    pod = PodInfo(
        "u",
        "ns",
        "p",
        init_containers=("setup",),
        containers=("main", "side"),
        # init container first (nothing), main two GPUs, side none
        annotations={ALLOCATED_ANNOTATION: f";{GPU_A},NVIDIA,1,0:{GPU_B},NVIDIA,1,0:;;"},
        priorities={"main": 0, "setup": 3},
    )
    assert pod_grants(pod) == {
        "setup": Grant((), 3),
        "main": Grant((slot(GPU_A), slot(GPU_B)), 0),
        "side": Grant((), None),
    }


@pytest.mark.parametrize(
    "annotations",
    [{}, {ALLOCATED_ANNOTATION: ""}, {ALLOCATED_ANNOTATION: "GPU-a,NVIDIA,-1,0:;"}],
    ids=["none", "empty", "refused"],
)
def test_no_usable_annotation_gives_no_grants(annotations: dict[str, str]) -> None:
    pod = PodInfo("u", "ns", "p", containers=("main",), annotations=annotations)
    assert pod_grants(pod) is None


def test_a_withheld_annotation_gives_every_container_nothing() -> None:
    pod = PodInfo(
        uid="u", namespace="n", name="p", containers=("main", "side"),
        withheld=frozenset({ALLOCATED_ANNOTATION}),
    )  # fmt: skip
    assert pod_grants(pod) == {"main": Grant(devices=(), priority=None),
                               "side": Grant(devices=(), priority=None)}  # fmt: skip
    assert (
        pod_grants(
            PodInfo(uid="u", namespace="n", name="p", withheld=frozenset({ALLOCATED_ANNOTATION}))
        )
        == {}
    )
    other = PodInfo(uid="u", namespace="n", name="p", withheld=frozenset({"hami.io/x"}))
    assert pod_grants(other) is None  # not the allocation: upstream's behaviour


def test_slot_value_is_what_hami_core_writes() -> None:
    assert slot_value(GPU_A) == slot(GPU_A)
    assert slot_value("x" * 96) == b"x" * 96
    assert slot_value("x" * 97) is None


def allocation(*uuids: str) -> dict[str, str]:
    devices = ":".join(f"{uuid},NVIDIA,1024,0" for uuid in uuids)
    return {ALLOCATED_ANNOTATION: f"{devices}:;"}


def add_pod(
    fake: FakeKubeApi,
    name: str,
    gpus: Sequence[str],
    *,
    env: Sequence[Mapping[str, Any]] = (),
    limits: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> str:
    """A pod of one container ``main`` on node-a with ``gpus`` allocated (unless
    ``annotations`` replaces the allocation) and the given container ``env`` and limits."""
    uid = fake.add_pod(
        name,
        namespace=f"ns-{name}",
        labels={NODE_LABEL: "node-a"},
        annotations=allocation(*gpus) if annotations is None else annotations,
    )
    container = fake.pods_on("node-a")[uid]["spec"]["containers"][0]
    container["env"] = [dict(entry) for entry in env]
    if limits is not None:
        container["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    fake.modify_pod(uid)  # published as changed (the fake keeps what it serves per change)
    return uid


def add_region(hook: Path, uid: str, *, uuids: Sequence[str], priority: int) -> SimulatedWorkload:
    directory = hook / "containers" / f"{uid}_main"
    directory.mkdir(parents=True)
    path = directory / "x.cache"
    spec = RegionSpec(
        num=len(uuids), uuids=list(uuids), limits=[1 << 30] * len(uuids), priority=priority
    )
    write_region(path, spec)
    return SimulatedWorkload(path)


async def launch_kernels(attacker: SimulatedWorkload, victim: SimulatedWorkload) -> None:
    """HAMi-core in both containers: a launch every 10 ms; the victim's waits while
    ``recent_kernel`` is negative (blocked), as HAMi-core's rate limiter does."""
    while True:
        attacker.launch_kernel()
        if victim.read_control()[0] >= 0:
            victim.launch_kernel()
        await trio.sleep(0.01)


async def blocked_samples(
    hook: Path,
    mig_lock: Path,
    tmp_path: Path,
    fake: FakeKubeApi,
    attacker: SimulatedWorkload,
    victim: SimulatedWorkload,
) -> tuple[int, AgentHandle, dict[str, Any], dict[Any, float]]:
    """Run the agent over the fake API server; how many of :data:`SAMPLES` samples of the
    victim's ``recent_kernel`` (one per tick) were negative, the debug document and the
    metrics as of the end."""
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    config = config_for(hook, mig_lock, f"--kubeconfig={kubeconfig}", env={"NODE_NAME": "node-a"})
    nvml = FakeNvml(gpus=[FakeGpu(uuid=GPU_A), FakeGpu(uuid=GPU_B)])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
            while True:  # the watch has listed
                if handle.pod_source.authoritative:
                    break
                await trio.sleep(0.02)
            nursery.start_soon(launch_kernels, attacker, victim)
            blocked = 0
            for _ in range(SAMPLES):
                ticks = handle.monitor.ticks
                while True:  # one sample per tick
                    if handle.monitor.ticks != ticks:
                        break
                    await trio.sleep(0.005)
                blocked += victim.read_control()[0] < 0
            document = handle.debug_document()
            _, text = await scrape(handle)
            handle.request_stop()
            nursery.cancel_scope.cancel()
    return blocked, handle, document, samples(text)


def stray(found: Mapping[Any, float], reason: str, name: str = "containers") -> float:
    """A sample of ``hami_trio_monitor_stray_claim_containers`` (or ``..._claims_total``)."""
    family = f"hami_trio_monitor_stray_claim_{name}" if name == "containers" else name
    return found[(family, frozenset({("reason", reason)}))]


def entry_of(document: Mapping[str, Any], pod: str) -> dict[str, Any]:
    (entry,) = [e for e in document["containers"] if e["pod"] == pod]
    return cast(dict[str, Any], entry)


async def test_a_container_cannot_block_a_gpu_it_was_not_allocated(
    hook: Path, mig_lock: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The attack: allocated A, the attacker claims B at priority 0 in its own region.

    Upstream (and this agent before pod grants) counted the claim: the victim on B was
    blocked in about 37 of 40 samples.  Now the attacker takes part only on A.
    """
    fake = FakeKubeApi()
    async with trio.open_nursery() as outer:
        await outer.start(fake.serve)
        bad = add_pod(fake, "attacker", [GPU_A])
        good = add_pod(fake, "victim", [GPU_B], env=[{"name": "CUDA_TASK_PRIORITY", "value": "1"}])
        attacker = add_region(hook, bad, uuids=[GPU_B], priority=0)
        victim = add_region(hook, good, uuids=[GPU_B], priority=1)
        with caplog.at_level(logging.WARNING, logger="hami_trio"):
            blocked, handle, document, found = await blocked_samples(
                hook, mig_lock, tmp_path, fake, attacker, victim
            )
        fake.stop()
    assert blocked == 0, f"victim blocked in {blocked} of {SAMPLES} samples"
    # The attacker is flagged: its entry, the metric and one log line say so.
    claim = entry_of(document, "attacker")["feedback"]
    assert claim["strays"] == [GPU_B]
    assert claim["devices"] == [GPU_A]
    assert entry_of(document, "victim")["feedback"]["strays"] == []
    assert stray(found, "uuid") == 1
    assert stray(found, "uuid", "hami_trio_monitor_stray_claims_total") == 1
    assert stray(found, "priority") == 0
    lines = [r for r in caplog.records if getattr(r, "event", "") == "feedback_stray_claim"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "ns-attacker/attacker/main" in lines[0].getMessage()
    assert GPU_B in lines[0].getMessage()
    assert handle.monitor.ticks >= SAMPLES


async def test_a_container_cannot_outrank_its_pod_spec_on_a_shared_gpu(
    hook: Path, mig_lock: Path, tmp_path: Path
) -> None:
    """The attacker shares A with the victim; both pod specs say priority 1 (the webhook's
    env from ``nvidia.com/priority``), the attacker's region says 0.  Before, the victim was
    blocked; now the pod's 1 counts: they share, both with the SM limit on, nobody blocked."""
    fake = FakeKubeApi()
    async with trio.open_nursery() as outer:
        await outer.start(fake.serve)
        spec_env = [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]
        bad = add_pod(fake, "attacker", [GPU_A], env=spec_env, limits={"nvidia.com/priority": "1"})
        good = add_pod(fake, "victim", [GPU_A], env=spec_env)
        attacker = add_region(hook, bad, uuids=[GPU_A], priority=0)
        victim = add_region(hook, good, uuids=[GPU_A], priority=1)
        blocked, _, document, found = await blocked_samples(
            hook, mig_lock, tmp_path, fake, attacker, victim
        )
        fake.stop()
    assert blocked == 0, f"victim blocked in {blocked} of {SAMPLES} samples"
    claim = entry_of(document, "attacker")["feedback"]
    assert (claim["priority"], claim["file_priority"]) == (1, 0)
    assert stray(found, "priority") == 1
    assert victim.read_control()[1] == 1  # two at priority 1 on A: the SM limit is on


async def test_honest_priorities_still_block_as_upstream(
    hook: Path, mig_lock: Path, tmp_path: Path
) -> None:
    """Control: the same two containers, honest files, the pod specs saying 0 and 1: the
    priority-1 container is blocked as upstream blocks it, and nobody is flagged."""
    fake = FakeKubeApi()
    async with trio.open_nursery() as outer:
        await outer.start(fake.serve)
        high = add_pod(fake, "high", [GPU_A], env=[{"name": "CUDA_TASK_PRIORITY", "value": "0"}])
        low = add_pod(fake, "low", [GPU_A], env=[{"name": "CUDA_TASK_PRIORITY", "value": "1"}])
        attacker = add_region(hook, high, uuids=[GPU_A], priority=0)
        victim = add_region(hook, low, uuids=[GPU_A], priority=1)
        blocked, _, document, found = await blocked_samples(
            hook, mig_lock, tmp_path, fake, attacker, victim
        )
        fake.stop()
    assert blocked >= SAMPLES // 2  # 40 of 40 on an idle machine; a starved launcher loses some
    assert [e["feedback"]["strays"] for e in document["containers"]] == [[], []]
    for reason in ("uuid", "priority"):
        assert stray(found, reason) == 0


async def test_a_pod_made_too_large_to_keep_does_not_get_its_file_trusted(
    hook: Path, mig_lock: Path, tmp_path: Path
) -> None:
    """The attack on the pod watch's caps: the attacker's pod carries its honest allocation
    (A) but is made too large to keep - a 60 KiB MIG annotation it wrote itself and 3,000
    init containers - so the watch keeps only its identity.  A pod without its allocation
    must not fall back to trusting the file (which claims B at priority 0): it takes part
    on no GPU, and the victim on B is never blocked."""
    fake = FakeKubeApi()
    async with trio.open_nursery() as outer:
        await outer.start(fake.serve)
        bad = fake.add_pod(
            "attacker",
            namespace="ns-attacker",
            labels={NODE_LABEL: "node-a"},
            annotations={**allocation(GPU_A), "hami.io/vgpu-mig-allocations": "x" * 60_000},
            init_containers=[f"pad-{i:04d}-" + "p" * 50 for i in range(3000)],
        )
        good = add_pod(fake, "victim", [GPU_B], env=[{"name": "CUDA_TASK_PRIORITY", "value": "1"}])
        attacker = add_region(hook, bad, uuids=[GPU_B], priority=0)
        victim = add_region(hook, good, uuids=[GPU_B], priority=1)
        blocked, _, _, found = await blocked_samples(
            hook, mig_lock, tmp_path, fake, attacker, victim
        )
        fake.stop()
    assert found[("hami_trio_pod_watch_cuts_total", frozenset({("reason", "pod-too-large")}))] >= 1
    assert blocked == 0, f"victim blocked in {blocked} of {SAMPLES} samples"
