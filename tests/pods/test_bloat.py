"""Pods bound to the node cannot balloon the agent: the real agent against bloated pods.

Anyone who can create a pod can set its ``spec.nodeName`` to this node (the kubelet then
fails it, but the object stays and the pod watch lists it) and give it thousands of labels
and a large ``hami.io/`` annotation.  The agent runs as a child process (``hami-trio run``)
against :mod:`tests.pods.fake_kube` over HTTPS; the test measures the child's resident set
(``VmRSS``, and its peak ``VmHWM``, from ``/proc``), never time:

1. idle, with a few ordinary pods listed and watched;
2. after 80 bloated pods (:func:`tests.pods.bloat.add_bloated_pods`) arrived as watch events;
3. after a relist of them (the watch expired), paginated;
4. a second agent started on the bloated cluster (a restart: its first list holds every
   bloated pod in one response, as the API server's watch cache sends it).

The peak of each must stay within twice the idle figure.
"""

from __future__ import annotations

import base64
import json
import re
from functools import partial
from pathlib import Path

import pytest
import trio
import trustme

from tests.agent.agent import AgentProcess, agent_env, http_get
from tests.pods.bloat import BLOAT_NAMESPACE, add_bloated_pods, memory_kib
from tests.pods.fake_kube import FakeKubeApi

pytestmark = pytest.mark.slow

BLOATED = 80


def tls_kubeconfig(path: Path, server: str, ca: trustme.CA) -> str:
    cluster = {
        "server": server,
        "certificate-authority-data": base64.b64encode(ca.cert_pem.bytes()).decode(),
    }
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "fake", "user": "me"}}],
        "current-context": "ctx",
    }
    path.write_text(json.dumps(doc))
    return str(path)


def sample(text: str, name: str) -> float | None:
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def bloated_rows(text: str) -> int:
    pattern = rf'^hami_trio_pod_info\{{[^}}]*namespace="{BLOAT_NAMESPACE}"'
    return len(re.findall(pattern, text, re.MULTILINE))


async def scrape(port: int) -> str:
    status, text = await trio.to_thread.run_sync(partial(http_get, port, timeout=60))
    assert status == 200, text[:2000]
    return text


async def wait_for_metrics(agent: AgentProcess, port: int, *, rows: int, relists: float = 0) -> str:
    """Scrape until the pod watch is synced with ``rows`` bloated pods and ``relists``."""
    text = ""
    with trio.move_on_after(120):
        while True:
            text = await scrape(port)
            if (
                sample(text, "hami_trio_pod_watch_synced") == 1
                and bloated_rows(text) == rows
                and (sample(text, "hami_trio_pod_watch_relists_total") or 0) >= relists
            ):
                return text
            await trio.sleep(0.2)
    watch_lines = [line for line in text.splitlines() if line.startswith("hami_trio_pod_watch")]
    watch_log = [r["msg"] for r in agent.records() if "pod watch" in str(r.get("msg"))]
    raise AssertionError(f"{bloated_rows(text)} rows; {watch_lines}; {watch_log[-5:]}")


def agent_args(base: Path, name: str) -> list[str]:
    hook = base / name / "hook"
    (hook / "containers").mkdir(parents=True)
    return [
        f"--hook-path={hook}",
        f"--mig-lock-path={base / name / 'mig' / 'lock'}",
        f"--lock-parent-path={base / name / 'vgpulock'}",
        "--metrics-bind-address=127.0.0.1:0",
        "--interval=1",
    ]


async def test_bloated_pods_bound_to_the_node_do_not_balloon_the_agent(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    fake = FakeKubeApi()
    pem = str(tmp_path / "server.pem")
    await nursery.start(partial(fake.serve, certfile=pem, keyfile=pem))
    for index in range(3):
        fake.add_pod(f"ordinary-{index}", labels={"hami.io/vgpu-node": "node-a"})
    kubeconfig = tls_kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{fake.port}", ca)
    env = agent_env({"NODE_NAME": "node-a", "KUBECONFIG": kubeconfig})
    figures: dict[str, dict[str, int]] = {}
    with AgentProcess(agent_args(tmp_path, "first"), env) as agent:
        port = await trio.to_thread.run_sync(agent.wait_ready)
        await wait_for_metrics(agent, port, rows=0)
        for _ in range(3):  # a few scrapes: the idle figure includes rendering
            await scrape(port)
        figures["idle"] = memory_kib(agent.proc.pid)

        add_bloated_pods(fake, count=BLOATED)  # delivered as ADDED events
        text = await wait_for_metrics(agent, port, rows=BLOATED)
        figures["watched"] = memory_kib(agent.proc.pid)
        # The decoded annotation over its cap is counted and named (pod and key) in the log.
        cut = 'hami_trio_pod_watch_cuts_total{reason="annotation-too-long"}'
        assert (sample(text.replace(cut, "cut"), "cut") or 0) >= BLOATED // 2
        assert any(
            "pod bloat/bloat-" in str(r.get("msg"))
            and "hami.io/vgpu-devices-allocated" in str(r.get("msg"))
            for r in agent.records()
        )
        cut_lines = [r for r in agent.records() if "not keeping" in str(r.get("msg"))]
        assert len(cut_lines) <= 2  # rate-limited: one a minute per reason, not one per pod

        fake.add_pod("elsewhere", node="node-b")  # moves the version past the watch's
        fake.compact()
        fake.end_watches()  # the resume point is gone: a relist of every bloated pod
        await wait_for_metrics(agent, port, rows=BLOATED, relists=1)
        figures["relisted"] = memory_kib(agent.proc.pid)

    with AgentProcess(agent_args(tmp_path, "second"), env) as agent:
        port = await trio.to_thread.run_sync(partial(agent.wait_ready, 120))
        await wait_for_metrics(agent, port, rows=BLOATED)
        figures["restarted"] = memory_kib(agent.proc.pid)

    print(json.dumps(figures))  # the figures, for the report (-s shows them)
    limit = 2 * figures["idle"]["VmRSS"]
    for phase in ("watched", "relisted", "restarted"):
        assert figures[phase]["VmHWM"] <= limit, (phase, figures)
