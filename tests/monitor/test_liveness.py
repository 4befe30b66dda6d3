"""Liveness of host PIDs and the host PID namespace check, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hami_trio.monitor.liveness import (
    PROC_PID_INIT_INO,
    in_host_pid_namespace,
    live_pids,
    pid_alive,
)
from tests.sandbox import namespace_argv


def test_pid_alive_on_real_processes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        assert pid_alive(os.getpid())
    finally:
        child.kill()
        child.wait()  # reaped: the PID names no process any more
    assert not pid_alive(child.pid)
    assert not pid_alive(0)
    assert not pid_alive(-1)  # never kill(-1, 0): that would address every process


@pytest.mark.root
def test_pid_alive_for_a_process_we_may_not_signal() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # root's
    probe = (
        "import os, sys\n"
        "from hami_trio.monitor.liveness import pid_alive\n"
        "os.setuid(65534)\n"  # kill(pid, 0) on root's process is EPERM now: it exists
        f"sys.exit(0 if pid_alive({child.pid}) else 1)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=Path(__file__).parents[2], check=False, timeout=60
        )
        assert done.returncode == 0
    finally:
        child.kill()
        child.wait()


def test_the_initial_pid_namespace_has_the_fixed_inode(tmp_path: Path) -> None:
    own = os.stat("/proc/self/ns/pid").st_ino
    assert in_host_pid_namespace() is (own == PROC_PID_INIT_INO)
    assert not in_host_pid_namespace(str(tmp_path / "missing"))  # cannot tell: not the host's
    (tmp_path / "file").write_text("")
    assert not in_host_pid_namespace(str(tmp_path / "file"))


@pytest.mark.root
def test_a_new_pid_namespace_is_not_the_host_one() -> None:
    if not in_host_pid_namespace():
        pytest.skip("the test runner itself is not in the initial PID namespace")
    code = (
        "import sys; from hami_trio.monitor.liveness import in_host_pid_namespace as f; print(f())"
    )
    out = subprocess.run(
        namespace_argv([sys.executable, "-c", code]),
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
        timeout=60,
    )
    assert out.stdout.strip() == "False"


def test_live_pids_lists_the_processes_of_the_namespace(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        listed = live_pids()
        assert {os.getpid(), child.pid} <= listed
    finally:
        child.kill()
        child.wait()
    assert child.pid not in live_pids()
    (tmp_path / "12").mkdir()
    (tmp_path / "self").mkdir()
    assert live_pids(str(tmp_path)) == {12}  # only numeric names are processes
    with pytest.raises(FileNotFoundError):
        live_pids(str(tmp_path / "missing"))
