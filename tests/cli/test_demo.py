"""``hami-trio demo`` end to end: the short CI run, Ctrl-C, bad flags.

The short run (6 s at a 0.2 s interval) is what CI asserts on: every workload got its own
correct host PID, the low-priority workload was blocked while the high-priority one ran and
unblocked after, ``/metrics`` was served, the MIG pause happened and the monitor resumed,
and nothing was left behind.  The host PIDs are checked against the summary *and* against
this test's own look at ``/proc`` while the demo runs (the sandboxed workloads are PID 1 of
their namespaces; ``NSpid`` gives their host PID).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hami_trio.demo.scenario import default_workloads

pytestmark = pytest.mark.root


def _demo(*args: str) -> list[str]:
    return [sys.executable, "-m", "hami_trio", "demo", *args]


def _processes_mentioning(text: str) -> dict[int, list[str]]:
    """Live processes whose command line contains ``text`` (zombies excluded)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(text.encode() in arg for arg in argv):
            found[int(entry.name)] = [arg.decode(errors="replace") for arg in argv if arg]
    return found


def _sandboxed_host_pids(root: Path) -> set[int]:
    """Host PIDs of the demo's workloads that are PID 1 of their own namespace."""
    pids = set()
    for pid in _processes_mentioning(str(root)):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^NSpid:\s+(\d+)\s+1$", status, re.MULTILINE)
        if match:
            pids.add(int(match.group(1)))
    return pids


@pytest.mark.slow
def test_short_demo_passes_every_check_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    summary_path = tmp_path / "summary.json"
    with subprocess.Popen(
        _demo("--duration", "6", "--interval", "0.2", "--root", str(root), "--summary-json",
              str(summary_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:  # fmt: skip
        seen: set[int] = set()
        deadline = time.monotonic() + 90
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                seen |= _sandboxed_host_pids(root)
                time.sleep(0.2)
            output, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, output
    summary = json.loads(summary_path.read_text())
    specs = default_workloads(5)  # the default --workloads
    names = [spec.name for spec in specs]
    workloads = {w["name"]: w for w in summary["workloads"]}
    assert list(workloads) == names

    # Every workload got its own, correct host PID: the one this test saw in /proc.
    assert seen == {w["host_pid"] for w in workloads.values()}, output
    for spec in specs:
        w = workloads[spec.name]
        if spec.broker:
            assert w["broker_host_pid"] == w["host_pid"], w
        else:  # its pod has no broker switch: it never asks
            assert (w["broker_host_pid"], w["broker_reason"]) == (None, "disabled"), w
        assert (w["pid_in_sandbox"], w["uid_in_sandbox"]) == (1, 65534), w
    assert summary["broker"]["exchanges"]["ok"] == sum(spec.broker for spec in specs)

    # The agent explained both: the unknown host PID, the dead process still counted.
    explained = {row["workload"]: row for row in summary["explained"]["workloads"]}
    assert explained["no-broker"]["unknown_seen"] is True
    assert explained["no-broker"]["processes"]["unknown"] == 1
    crashed = explained["crashed"]
    assert crashed["crashed_at"] is not None
    assert crashed["memory_after_crash"] > 0
    assert crashed["exited_seen_after_crash"] is True
    if summary["explained"]["liveness_checked"]:  # the demo runs in the host PID namespace
        assert crashed["processes"]["exited"] == 1
    assert explained["training"]["agent_blocks"] >= 1
    assert summary["broker"]["latency_mean_seconds"] > 0

    # The low-priority workload was blocked while the high-priority one ran, then unblocked.
    blocking = {row["workload"]: row for row in summary["blocking"]}
    training = blocking["training"]
    assert training["outranked_by"] == ["inference"]
    assert training["episodes"] >= 1, training
    assert training["unexplained_episodes"] == 0, training
    assert training["unblocked_after"], training
    assert workloads["inference"]["blocked_episodes"] == []
    assert workloads["notebook"]["blocked_episodes"] == []

    # Metrics were served during the run, with every workload's memory.
    assert summary["metrics"]["workloads_with_memory_metric"] == sorted(names)
    assert summary["metrics_url"].startswith("http://127.0.0.1:")

    # The MIG pause happened in the middle, nothing ticked meanwhile, then monitoring resumed.
    mig = summary["mig"]
    assert 2.0 <= mig["lock_created_at"] < mig["lock_removed_at"] <= 4.0
    assert mig["paused_scrapes"] >= 1
    assert mig["ticks_while_paused"] == 0
    assert mig["resumed_after_seconds"] is not None
    assert mig["ticks_after_resume"] > 0

    assert summary["checks"] == dict.fromkeys(summary["checks"], True)
    assert summary["ok"] is True
    # Nothing left: no process of the demo, no socket, no lock.
    assert summary["cleanup"] == {"stray_processes": [], "socket_left": False, "agent_error": None}
    assert _processes_mentioning(str(root)) == {}
    assert not (root / "hostpid" / "broker.sock").exists()
    assert not (root / "hami" / "hami-mig-apply.lock").exists()
    assert "Summary" in output

    # The closing table came from the agent's debug view over HTTP, as hami-trio status reads
    # it: one row per workload, with what its region says.
    status = summary["status"]
    assert status["error"] is None
    command = f"hami-trio status --address {status['debug_address']}"
    assert f"why each container shows what it shows: {command}" in output
    rows = {
        line.split()[0].rsplit("/", 1)[1]: line.split()
        for line in status["table"]
        if line.startswith("-/")
    }
    assert sorted(rows) == sorted(names)
    by_name = {spec.name: spec for spec in default_workloads(len(names))}
    for name, row in rows.items():
        assert row[1] == "v1"
        assert row[3].endswith(f"/{by_name[name].memory_limit >> 20}"), row
        assert row[6] == str(by_name[name].priority)
        assert row[-1] == "exported"  # the collector's own decision
    # PROCS is running/exited/unknown: the workload without the broker never learned its PID.
    assert rows["no-broker"][8].endswith("/1"), rows["no-broker"]
    assert rows["inference"][8] == "1/0/0", rows["inference"]
    assert f"hami-trio status --address {status['debug_address']}, at the end of the run:" in output


@pytest.mark.slow
def test_ctrl_c_stops_everything_cleanly() -> None:
    with subprocess.Popen(
        _demo("--duration", "60", "--interval", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if sum(" attached: " in seen for seen in lines) == 3:
                    break
            root_line = next(line for line in lines if line.startswith("root "))
            root = Path(root_line.split()[1])
            assert _processes_mentioning(str(root))
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    output = "".join(lines) + output
    assert proc.returncode == 130, output
    assert "SIGINT, stopping everything" in output
    assert "Shutdown: no process left; broker socket removed" in output
    assert _processes_mentioning(str(root)) == {}
    assert not root.exists()  # the temporary root is removed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workloads", "1"], "--workloads: 1 is out of range"),
        (["--duration", "2", "--interval", "1"], "--duration 2 is too short for --interval 1"),
        (["--metrics-bind-address", "nope"], "--metrics-bind-address"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(_demo(*args), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_root_must_be_empty(tmp_path: Path) -> None:
    (tmp_path / "something").touch()
    result = subprocess.run(
        _demo("--root", str(tmp_path)), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "is not an empty directory" in result.stderr
    assert os.listdir(tmp_path) == ["something"]


def test_an_agent_that_cannot_start_exits_1_with_its_reason() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            _demo("--metrics-bind-address", f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"hami-trio demo: cannot listen on 127.0.0.1:{port}")
    root = Path(next(r for r in result.stdout.splitlines() if r.startswith("root ")).split()[1])
    assert not root.exists()
