"""The cut-over from HAMi's vGPUmonitor, end to end: a simulated node where HAMi's monitor
(a process applying upstream's Observe to the same files) and HAMi's broker (a live socket
with its flock-held ``broker.lock``) already run, and the real agent (``hami-trio run``) is
started beside them.

Checked: the agent starts and stays up (no crash loop); it says once that another monitor
writes feedback and that another broker serves the socket, in its log, ``/metrics`` and
``hami-trio status``; it never touches the other broker's files.  Then HAMi's monitor is
stopped: the detection clears and the control words follow hami-trio's feedback alone (the
low-priority container stays blocked while the high-priority one computes).  SIGTERM drains
to exit 0.  The chart side - HAMi-WebUI's ServiceMonitor finding the agent's Service - is
tests/deploy/test_chart.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hami_trio.agent.status import format_status
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, write_region
from tests.agent.agent import AgentProcess, agent_env, http_get, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
INTERVAL = 0.2


def region(hook: Path, name: str, priority: int) -> SimulatedWorkload:
    directory = hook / "containers" / f"uid-{name}_main"
    directory.mkdir(parents=True)
    path = directory / "x.cache"
    write_region(path, RegionSpec(uuids=[GPU], priority=priority, recent_kernel=2))
    return SimulatedWorkload(path)


def gauge(port: int, name: str) -> float | None:
    status, text = http_get(port)
    assert status == 200
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_hami_trio_beside_hamis_monitor_and_broker(
    hook: Path, mig_lock: Path, socket_path: Path
) -> None:
    hi, lo = region(hook, "hi", 0), region(hook, "lo", 1)
    socket_path.parent.mkdir(mode=0o711)
    hami_broker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hami_broker.bind(str(socket_path))
    hami_broker.listen(8)
    hami_lock = open(socket_path.parent / "broker.lock", "wb")  # noqa: SIM115
    fcntl.flock(hami_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    identity = os.stat(socket_path).st_ino

    running = threading.Event()
    running.set()

    def workloads() -> None:
        # hi computes in bursts (1 s on, 1 s off); lo computes all the time but, as
        # HAMi-core does, launches nothing while its recent_kernel says it is blocked.
        pause = threading.Event()
        step = 0
        while running.is_set():
            if (step // 20) % 2 == 0:
                hi.launch_kernel()
            if lo.read_control()[0] >= 0:
                lo.launch_kernel()
            step += 1
            pause.wait(0.05)

    launcher = threading.Thread(target=workloads, daemon=True)
    launcher.start()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.monitor.upstream_writer", str(hook / "containers"), "0.15"],
        cwd=REPO,
        env={**agent_env(), "PYTHONPATH": str(REPO)},
    )
    flags = [
        f"--hook-path={hook}",
        f"--mig-lock-path={mig_lock}",
        "--metrics-bind-address=127.0.0.1:0",
        f"--interval={INTERVAL}",
        "--no-kubernetes",
        f"--broker-socket-path={socket_path}",
    ]
    try:
        with AgentProcess(flags, agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})) as agent:
            port = agent.wait_ready()
            debug = agent.debug_port()
            agent.wait_for(lambda r: r.get("event") == "foreign_broker")
            agent.wait_for(lambda r: r.get("event") == "foreign_writer")
            assert gauge(port, "hami_trio_monitor_foreign_writer") == 1
            assert gauge(port, "hami_trio_broker_foreign_listener") == 1
            status, body = http_get(debug, "/debug/state")
            assert status == 200
            shown = format_status(json.loads(body))
            assert "ANOTHER MONITOR is writing feedback" in shown
            assert "broker: WAITING: another broker serves" in shown
            assert "HAMi's own broker" in shown

            upstream.terminate()
            upstream.wait(timeout=10)
            agent.wait_for(lambda r: r.get("event") == "foreign_writer_gone", timeout=60)
            assert gauge(port, "hami_trio_monitor_foreign_writer") == 0
            # hami-trio's feedback alone: for 20 more ticks no control word holds anything
            # its own writes and HAMi-core do not explain, while lo is still blocked behind
            # hi's bursts.
            before = gauge(port, "hami_trio_monitor_foreign_writes_total")
            blocked = 0
            for _ in range(40):
                blocked += lo.read_control() == (-1, 1)
                threading.Event().wait(INTERVAL / 2)
            assert gauge(port, "hami_trio_monitor_foreign_writes_total") == before
            assert blocked > 0
            warned = [r for r in agent.records() if r.get("event") == "foreign_writer"]
            assert len(warned) == 1
            assert agent.proc.poll() is None  # never crashed, never restarted
            assert os.stat(socket_path).st_ino == identity  # the other broker's socket
            assert agent.stop() == 0
    finally:
        running.clear()
        launcher.join(timeout=5)
        if upstream.poll() is None:
            upstream.kill()
        upstream.wait()
        hami_broker.close()
        hami_lock.close()
    wait_until(lambda: not launcher.is_alive(), what="the workload thread to stop")
