"""``hami-trio run`` as a real process: what the DaemonSet runs, end to end.

Each test starts ``python -m hami_trio run`` on temporary paths with a free metrics port and
reads its JSON log (tests/agent/agent.py).  The broker is queried by the C reference client
from inside a container-like sandbox (own PID namespace, read-only bind mount of the broker
directory, uid 65534), exactly as HAMi-core would; its fatal failure is a real accept error
caused from outside the process.
"""

from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from hami_trio.agent.service import mig_dir_detached
from hami_trio.broker.boundary import default_lock_path
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, write_region
from tests.agent.agent import (
    AgentProcess,
    agent_env,
    break_listener,
    http_get,
    wait_until,
)
from tests.broker.wire import present
from tests.clients.clients import CClient
from tests.clients.harness import build_c_client, make_sandbox
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import write_kubeconfig
from tests.sandbox import world_readable_dir

GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


@pytest.fixture(scope="module")
def c_client() -> Iterator[Path]:
    with world_readable_dir("ht-agent-cclient-") as dest:
        yield build_c_client(dest)


def common_flags(hook: Path, mig_lock: Path) -> list[str]:
    return [
        f"--hook-path={hook}",
        f"--mig-lock-path={mig_lock}",
        "--metrics-bind-address=127.0.0.1:0",
        "--interval=0.05",
    ]


def add_container(hook: Path, uid: str = "pod-uid-1", name: str = "main") -> Path:
    directory = hook / "containers" / f"{uid}_{name}"
    directory.mkdir(parents=True)
    path = directory / "abc.cache"
    write_region(path, RegionSpec(uuids=[GPU], limits=[8 << 30]))
    return path


def metric(port: int, name: str, **labels: str) -> float | None:
    _, text = http_get(port)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


@pytest.mark.root
def test_agent_serves_broker_monitor_and_metrics_and_drains_on_sigterm(
    hook: Path, mig_lock: Path, c_client: Path
) -> None:
    add_container(hook)
    env = agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})
    with make_sandbox() as box:
        flags = [*common_flags(hook, mig_lock), "--no-kubernetes"]
        flags.append(f"--broker-socket-path={box.host_socket}")
        with AgentProcess(flags, env) as agent:
            port = agent.wait_ready()
            ready = agent.wait_for(lambda r: r.get("event") == "ready")
            assert ready["broker_socket"] == str(box.host_socket)

            # HAMi-core's view: the C client in its own PID namespace, through the read-only
            # mount, gets its PID as the host sees it.
            outcome = CClient(c_client).run(box)
            assert outcome.pid == outcome.run.host_pid, outcome.run.stderr
            assert outcome.run.ns_pids == (outcome.run.host_pid, 1)

            assert http_get(port, "/healthz") == (200, "ok\n")
            assert http_get(port, "/readyz") == (
                200,
                "[+]broker ok\n[+]monitor ok\n[+]mig-lock-dir ok\nreadyz check passed\n",
            )
            assert metric(port, "hami_trio_broker_exchanges_total", outcome="ok") == 1
            assert metric(port, "hami_vgpu_memory_limit_bytes", pod="pod-uid-1") == 8 << 30
            assert metric(port, "hami_trio_monitor_mig_paused") == 0

            assert agent.stop(signal.SIGTERM) == 0
            assert not box.host_socket.exists()
    events = [record.get("event") for record in agent.records()]
    assert events.count("ready") == 1
    assert "stopping" in events
    assert "stopped" in events
    # One JSON object per line, all of them (text logs are the default, not tested here).
    assert all(json.loads(line) for line in agent.lines)
    stopped = next(r for r in agent.records() if r.get("event") == "stopped")
    assert stopped["broker_exchanges"] == 1


@pytest.mark.root
def test_broker_failure_after_start_exits_1_with_the_broker_error(
    hook: Path, mig_lock: Path, socket_path: Path
) -> None:
    env = agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})
    flags = [
        *common_flags(hook, mig_lock),
        "--no-kubernetes",
        f"--broker-socket-path={socket_path}",
    ]
    with AgentProcess(flags, env) as agent:
        port = agent.wait_ready()
        break_listener(agent.proc.pid, socket_path)
        assert agent.finish() == 1
    assert agent.lines[-1] == (
        f"hami-trio run: broker failed: --broker-socket-path {socket_path}: accept failed: "
        "Invalid argument\n"
    )
    assert not socket_path.exists()
    with open(default_lock_path(socket_path), "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    with pytest.raises(OSError, match="Connection refused"):
        http_get(port, "/healthz", timeout=2)


def test_start_up_refusal_is_one_line_and_leaves_nothing_running(
    hook: Path, mig_lock: Path, socket_path: Path
) -> None:
    socket_path.parent.mkdir(mode=0o711)
    socket_path.write_text("data")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_trio",
            "run",
            *common_flags(hook, mig_lock),
            "--no-kubernetes",
            f"--broker-socket-path={socket_path}",
        ],
        capture_output=True,
        text=True,
        env=agent_env({"LIBVGPU_HOSTPID_BROKER": "1"}),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == (
        f"hami-trio run: --broker-socket-path {socket_path}: path is a regular file, not a socket; "
        "refusing to replace it\n"
    )
    assert socket_path.read_text() == "data"
    assert sorted(p.name for p in socket_path.parent.iterdir()) == ["broker.sock"]
    assert default_lock_path(socket_path).is_file()  # beside the socket's directory
    assert not mig_lock.parent.exists()  # the monitor never started


def test_mig_lock_pauses_and_resumes_the_running_monitor(hook: Path, mig_lock: Path) -> None:
    workload = SimulatedWorkload(add_container(hook))
    with AgentProcess([*common_flags(hook, mig_lock), "--no-kubernetes"]) as agent:
        port = agent.wait_ready()
        workload.launch_kernel()  # recent_kernel = 2; each tick takes one off
        wait_until(lambda: workload.read_control()[0] == 0, what="the monitor to decrement")

        mig_lock.touch()
        wait_until(lambda: metric(port, "hami_trio_monitor_mig_paused") == 1, what="pause")
        agent.wait_for(lambda r: "monitor paused" in str(r.get("msg")))
        workload.launch_kernel()
        ticks = metric(port, "hami_trio_monitor_tick_duration_seconds_count")
        time.sleep(0.3)  # six intervals: a running monitor would have decremented twice
        assert workload.read_control()[0] == 2
        assert metric(port, "hami_trio_monitor_tick_duration_seconds_count") == ticks
        assert http_get(port, "/readyz")[0] == 200  # paused is not stalled

        mig_lock.unlink()
        wait_until(lambda: metric(port, "hami_trio_monitor_mig_paused") == 0, what="resume")
        wait_until(lambda: workload.read_control()[0] == 0, what="ticks to resume")
        agent.wait_for(lambda r: "monitor resumed" in str(r.get("msg")))
        assert agent.stop() == 0


async def test_kubernetes_path_with_the_broker(
    nursery: trio.Nursery, hook: Path, mig_lock: Path, socket_path: Path
) -> None:
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    uid = fake.add_pod(
        "trainer-0",
        namespace="team-a",
        containers=("main",),
        labels={"hami.io/vgpu-node": "node-a"},
    )
    add_container(hook, uid, "main")
    add_container(hook, "not-a-pod-here", "main")
    kubeconfig = write_kubeconfig(hook.parent / "kc", f"http://127.0.0.1:{fake.port}")
    env = agent_env(
        {"NODE_NAME": "node-a", "KUBECONFIG": kubeconfig, "LIBVGPU_HOSTPID_BROKER": "1"}
    )
    flags = [*common_flags(hook, mig_lock), f"--broker-socket-path={socket_path}"]
    with AgentProcess(flags, env) as agent:
        port = await trio.to_thread.run_sync(agent.wait_ready)

        def synced() -> bool:
            status, _ = http_get(port, "/readyz")
            return status == 200 and metric(port, "hami_vgpu_memory_limit_bytes") is not None

        await trio.to_thread.run_sync(lambda: wait_until(synced, what="the pod watch"))
        assert await trio.to_thread.run_sync(http_get, port, "/readyz") == (
            200,
            "[+]broker ok\n[+]pod-watch ok\n[+]monitor ok\n[+]mig-lock-dir ok\n"
            "readyz check passed\n",
        )
        _, text = await trio.to_thread.run_sync(http_get, port)
        pods = {
            sample.labels["pod"]
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "hami_vgpu_memory_limit_bytes"
        }
        assert pods == {"trainer-0"}  # the directory of an unknown pod is not exported
        assert await trio.to_thread.run_sync(metric, port, "hami_trio_pod_watch_synced") == 1
        ready = agent.wait_for(lambda r: r.get("event") == "ready")
        assert ready["pod_watch"] == f"kubeconfig {kubeconfig}"
        assert any(r.field_selector == "spec.nodeName=node-a" for r in fake.requests)
        assert await trio.to_thread.run_sync(agent.stop) == 0
    assert not present(socket_path)


# --- the MIG lock directory as a hostPath mount whose source is deleted on the host ---------


@pytest.mark.root
def test_mig_dir_deleted_on_the_host_under_its_mount_makes_the_agent_exit(
    hook: Path, base_dir: Path
) -> None:
    # The chart mounts the host's /tmp/hami (not all of /tmp): if that directory is removed on
    # the host (tmpfiles ageing, an operator), the mount keeps the dead directory and a MIG
    # lock in the host's new /tmp/hami would never be seen.  The agent must not go on blind.
    host_dir = base_dir / "host-hami"
    host_dir.mkdir()
    mounted = base_dir / "mig"
    mounted.mkdir()
    # Read-only, like the chart's mount: the agent only looks at the directory.
    mount_then_exec = (
        'mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && shift 2 && exec "$@"'
    )
    prefix = ["unshare", "--mount", "--propagation", "private", "--"]
    prefix += ["sh", "-c", mount_then_exec, "sh", str(host_dir), str(mounted)]
    flags = [*common_flags(hook, mounted / "hami-mig-apply.lock"), "--no-kubernetes"]
    with AgentProcess(flags, prefix=prefix) as agent:
        port = agent.wait_ready()
        # Through the read-only mount the monitor still sees the device plugin's lock come
        # and go on the host (inotify and lstat need no write access).
        (host_dir / "hami-mig-apply.lock").touch()
        wait_until(lambda: metric(port, "hami_trio_monitor_mig_paused") == 1, what="pause")
        (host_dir / "hami-mig-apply.lock").unlink()
        wait_until(lambda: metric(port, "hami_trio_monitor_mig_paused") == 0, what="resume")
        assert agent.proc.poll() is None  # a healthy mount: no false alarm
        host_dir.rmdir()  # on the host; the agent's mount namespace keeps the dead directory
        assert agent.finish() == 1
    assert f"MIG lock directory {mounted} was deleted on the host while mounted" in (agent.output())
    assert list(mounted.iterdir()) == []  # the host's view of the mount point: untouched


def test_mig_dir_detached_only_for_a_deleted_directory(base_dir: Path) -> None:
    assert not mig_dir_detached(base_dir)  # a live directory
    assert not mig_dir_detached(base_dir / "missing")  # missing: the monitor reports it
    (base_dir / "file").write_text("x")
    assert not mig_dir_detached(base_dir / "file")
