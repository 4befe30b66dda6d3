"""``hami-trio status`` against a real ``hami-trio run``: the table, ``--json``, the address.

The agent is the real command in a child process (tests/agent/agent.py) with the broker on
and three container directories written by ``testing.regions``; ``status`` talks to its
debug port over real HTTP.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from hami_trio.agent.debug import SCHEMA
from hami_trio.cli.main import main
from hami_trio.cli.status import listener_pid
from tests.agent.agent import AgentProcess, agent_env, http_get, wait_until
from tests.agent.test_service import debug_fixture
from tests.broker.wire import blocking_exchange


class Ports(NamedTuple):
    metrics: int
    debug: int
    pid: int


@pytest.fixture
def agent(hook: Path, mig_lock: Path, socket_path: Path) -> Iterator[Ports]:
    """The running agent's (metrics port, debug port)."""
    debug_fixture(hook)
    flags = [
        f"--hook-path={hook}",
        f"--mig-lock-path={mig_lock}",
        "--metrics-bind-address=127.0.0.1:0",
        "--debug-bind-address=127.0.0.1:0",
        "--interval=0.05",
        "--no-kubernetes",
        f"--broker-socket-path={socket_path}",
    ]
    with AgentProcess(flags, agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})) as process:
        yield Ports(process.wait_ready(), process.debug_port(), process.proc.pid)
        assert process.stop() == 0


def test_status_prints_one_row_per_device_and_the_reasons(
    agent: Ports,
    hook: Path,
    socket_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = agent.debug
    assert len(blocking_exchange(socket_path)) == 12
    assert main(["status", "--address", f"127.0.0.1:{port}"]) == 0
    out = capsys.readouterr().out
    head, _, table = out.partition("\n\n")
    lines = head.splitlines()
    assert lines[1].startswith("monitor: ")
    assert lines[1].endswith(
        "ticks every 0.05s, running; 3 container directories (loaded 1, no_cache_file 1, "
        f"rejected 1) in {hook / 'containers'}"
    )
    assert re.fullmatch(
        r"usage \(memory, utilisation, processes\) read \d+\.\ds before this answer", lines[2]
    ), lines[2]
    del lines[2]
    assert lines[2] == "export: exported 1, no_cache_file 1, rejected 1"
    assert lines[3] == "pods: no Kubernetes (--no-kubernetes): every directory is its own pod"
    assert lines[4] == f"broker: {socket_path}: 1 exchanges (ok 1), 0 in flight"
    rows = table.splitlines()
    assert rows[0].split() == [
        "CONTAINER", "FORMAT", "DEV", "USED/LIMIT", "MiB", "SM%", "CORE%", "PRIO", "BLOCKED",
        "PROCS", "run/exit/unk", "ALLOCATED", "EXPORT",
    ]  # fmt: skip
    # used = 1 GiB + 2 MiB of the live slots; limit 8 GiB; sm_util 30; sm_limit 50; priority 0;
    # processes: this test's PID (running), a dead PID (exited), 0 (unknown)
    assert rows[1].split() == [
        "-/pod-uid-1/main", "v1", "0", "1026/8192", "30", "50", "0", "no", "1/1/1", "?",
        "exported",
    ]  # fmt: skip
    assert rows[2].strip().startswith("1 process(es) with host PID 0: HAMi-core never learned")
    assert rows[3].strip().startswith("1 process(es) exited but still hold their slot")
    assert rows[4].split() == ["-/pod-uid-2/side", "?", "-", "-", "-", "-", "?", "?", "-", "?",
                               "rejected"]  # fmt: skip
    side = f"{hook / 'containers' / 'pod-uid-2_side'}/'x.cache'"  # the tenant's name quoted
    assert (
        rows[5].strip() == f"rejected (too_small): {side}: cache file size 4 too small (< 12 bytes)"
    )
    assert rows[6].split()[0] == "-/pod-uid-3/idle"
    assert rows[6].split()[-1] == "no_cache_file"
    assert rows[7].strip().startswith("no .cache file yet")
    assert len(rows) == 8


def _differences(a: object, b: object, path: str = "") -> list[str]:
    """The paths at which two JSON documents differ (for the assertion message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_status_json_is_the_agents_document(
    agent: Ports, capsys: pytest.CaptureFixture[str]
) -> None:
    port = agent.debug
    # The first ticks still move the fixture's control words (recent_kernel 2 -> 1 -> 0):
    # compare once they have settled, so two documents a moment apart say the same.
    wait_until(
        lambda: json.loads(http_get(port, "/debug/state")[1])["monitor"]["ticks"] >= 5,
        what="five ticks",
    )
    assert main(["status", "--json", "--address", f"127.0.0.1:{port}", "--pod", "pod-uid-1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    status, body = http_get(port, "/debug/state?pod=pod-uid-1")
    served = json.loads(body)
    assert (status, printed["schema"]) == (200, SCHEMA)
    for doc in (printed, served):  # taken a moment apart, each after its own usage read
        doc.pop("generated_at")
        doc["monitor"].pop("ticks")
        assert isinstance(doc["monitor"].pop("usage_read_at"), float)
    assert printed == served, _differences(printed, served)
    assert [e["container"] for e in printed["containers"]] == ["main"]


def test_status_finds_the_agent_through_its_variable(
    agent: Ports,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = agent.debug
    # What kubectl exec inherits from the pod: the agent's own address, even a wildcard one.
    monkeypatch.setenv("HAMI_TRIO_DEBUG_BIND_ADDRESS", f":{port}")
    assert main(["status"]) == 0
    assert "-/pod-uid-1/main" in capsys.readouterr().out


def test_status_against_the_metrics_port_says_what_it_got(
    agent: Ports, capsys: pytest.CaptureFixture[str]
) -> None:
    port = agent.metrics
    assert main(["status", "--address", f"127.0.0.1:{port}"]) == 1
    assert capsys.readouterr().err == (
        f"hami-trio status: 127.0.0.1:{port} is the agent's metrics port (/metrics); its debug "
        "view is on --debug-bind-address (default 127.0.0.1:9395, "
        "$HAMI_TRIO_DEBUG_BIND_ADDRESS in its pod)\n"
    )


def test_status_says_which_agent_answered(agent: Ports, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--json", "--address", f"127.0.0.1:{agent.debug}"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)  # stdout stays the document alone
    assert err == (
        f"answered by the agent at 127.0.0.1:{agent.debug}: node {document['node']}, "
        f"hami-trio {document['version']}, pid {agent.pid}\n"
    )


def test_listener_pid_finds_this_process_and_nothing_for_a_closed_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert listener_pid(port) is None  # bound, not listening
        sock.listen()
        assert listener_pid(port) == os.getpid()


def test_status_without_an_agent_exits_1_naming_the_address(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        assert main(["status", "--address", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"hami-trio status: cannot reach the agent's debug view at 127.0.0.1:{port}"
    )
    monkeypatch.setenv("HAMI_TRIO_DEBUG_BIND_ADDRESS", "off")
    assert main(["status"]) == 2
    assert "the agent's debug view is off" in capsys.readouterr().err
    assert main(["status", "--address", "nope"]) == 2
    assert main(["status", "--timeout", "0"]) == 2
