"""The agent under a descriptor limit below the broker's slots: a broker flood for real.

``hami-trio run`` is started under ``prlimit --nofile=512:512`` (a hard limit well below the
default ``max_exchanges`` 4096 + 256), with the broker on and 20 containers; a flooder keeps
a thousand idle connections open on the broker's socket (each re-opened as the broker closes
it at its exchange deadline).  The monitor must keep every container's rows, and the MIG lock
must still pause it.  The unit-level versions (an injected EMFILE in the MIG lock check and
in the lister) are in tests/monitor/test_loop.py and tests/monitor/test_lister.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, write_region
from tests.agent.agent import AgentProcess, agent_env, http_get

pytestmark = pytest.mark.slow

FD_LIMIT = 512
CONTAINERS = 20
FLOOD = 1000

# Keeps FLOOD idle connections on the socket: opens what is missing, drops what the broker
# closed; never sends a byte.
FLOODER = r"""
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
path, count = sys.argv[1], int(sys.argv[2])
conns = []
print("flooding", flush=True)
while True:
    while len(conns) < count:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(path)
        except OSError:
            c.close()
            break
        conns.append(c)
    alive = []
    for c in conns:
        try:
            if c.recv(1, socket.MSG_PEEK):
                alive.append(c)
                continue
        except BlockingIOError:
            alive.append(c)
            continue
        except OSError:
            pass
        c.close()
    conns = alive
    time.sleep(0.005)
"""


def _value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _scrape(port: int) -> str | None:
    try:
        status, text = http_get(port, timeout=5)
    except OSError:
        return None
    return text if status == 200 else None


def test_a_broker_flood_under_a_low_fd_limit_keeps_every_row_and_the_mig_pause(
    tmp_path: Path,
) -> None:
    hook = tmp_path / "hook"
    for i in range(CONTAINERS):
        spec = RegionSpec(
            uuids=["GPU-0"],
            procs=[ProcSlot(pid=7, hostpid=0, used=[MemoryUse(total=(i + 1) << 20)])],
        )
        (hook / "containers" / f"pod-{i}_main").mkdir(parents=True)
        write_region(hook / "containers" / f"pod-{i}_main" / "x.cache", spec)
    socket_path = tmp_path / "hostpid" / "broker.sock"
    lock = tmp_path / "mig" / "lock"
    args = [
        f"--hook-path={hook}",
        f"--mig-lock-path={lock}",
        f"--broker-socket-path={socket_path}",
        f"--broker-lock-path={tmp_path / 'hostpid-lock' / 'broker.lock'}",
        f"--lock-parent-path={tmp_path / 'vgpulock'}",
        "--metrics-bind-address=127.0.0.1:0",
        "--no-kubernetes",
        "--interval=0.2",
    ]
    env = agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})
    prefix = ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--"]
    with AgentProcess(args, env, prefix=prefix) as agent:
        port = agent.wait_ready()
        text = _scrape(port)
        assert text is not None
        assert _value(text, "hami_trio_monitor_containers", state="exported") == CONTAINERS
        flooder = subprocess.Popen(
            [sys.executable, "-c", FLOODER, str(socket_path), str(FLOOD)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert flooder.stdout is not None
            assert flooder.stdout.readline() == "flooding\n"
            time.sleep(2.0)  # the flood holds every slot it can get
            # Every row, on every scrape, while the flood goes on.
            seen = []
            for _ in range(10):
                text = _scrape(port)
                seen.append(
                    None
                    if text is None
                    else _value(text, "hami_trio_monitor_containers", state="exported")
                )
                time.sleep(0.2)
            assert seen == [CONTAINERS] * 10, seen
            # The MIG lock still pauses the monitor (a lock check that cannot run is never
            # "no lock").
            lock.touch()
            deadline = time.monotonic() + 20
            paused = None
            while time.monotonic() < deadline:
                text = _scrape(port)
                paused = None if text is None else _value(text, "hami_trio_monitor_mig_paused")
                if paused == 1:
                    break
                time.sleep(0.1)
            assert paused == 1
            # The flood met the clamped slots (closed at once), not the descriptor limit.
            full = [
                _value(text or "", "hami_trio_broker_exchanges_total", outcome=outcome) or 0.0
                for outcome in ("rejected_full", "evicted")
            ]
            assert sum(full) > 0, full
        finally:
            flooder.kill()
            flooder.wait()
            assert flooder.stdout is not None
            flooder.stdout.close()
        assert agent.stop() == 0, agent.output()[-3000:]
    warnings = [r for r in agent.records() if r["level"] == "warning"]
    (clamp,) = [r for r in warnings if "max_exchanges" in r["msg"]]
    assert f"descriptor limit {FD_LIMIT}" in clamp["msg"], clamp
