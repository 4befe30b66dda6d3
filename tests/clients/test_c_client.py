"""The C reference client's own command line: usage, the switch, storm mode, sanitizers.

The security checks and response handling are contract tests (test_contract.py); these
cover what only the C command has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.harness import (
    Sandbox,
    build_c_client,
    rogue_server,
    run_in_sandbox,
    world_readable_tempdir,
)

_STORM_LINE = re.compile(
    r"clients=(?P<clients>\d+) successful=(?P<ok>\d+) failed=(?P<failed>\d+)"
    r" wall_ms=(?P<wall>[\d.]+)"
)
_STORM_DETAIL = re.compile(
    r"distinct_pids=(?P<distinct>\d+) answers_equal_local_pid=(?P<local>\d+)"
)


def _run(binary: Path, *args: str, switch: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if switch is not None:
        env["LIBVGPU_HOSTPID_BROKER"] = switch
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--deadline", "soon"],
        ["--deadline", "0"],
        ["--deadline", "-1"],
        ["--storm", "0"],
        ["--storm", "many"],
        ["--bogus"],
        ["a.sock", "b.sock"],
    ],
)
def test_usage_errors_exit_2(c_client: Path, args: list[str]) -> None:
    proc = _run(c_client, *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "hostpid-client:" in proc.stderr


def test_help(c_client: Path) -> None:
    proc = _run(c_client, "--help")
    assert proc.returncode == 0
    assert "/tmp/vgpulock/hostpid/broker.sock" in proc.stdout


@pytest.mark.parametrize("value", [None, "", "true", " 1", "01", "yes"])
def test_switch_off_reports_disabled_without_touching_the_path(
    c_client: Path, tmp_path: Path, value: str | None
) -> None:
    proc = _run(c_client, str(tmp_path / "absent" / "broker.sock"), switch=value)
    assert (proc.returncode, proc.stdout) == (1, "disabled\n")
    assert "LIBVGPU_HOSTPID_BROKER" in proc.stderr


def test_switch_1_queries(c_client: Path, tmp_path: Path) -> None:
    proc = _run(c_client, str(tmp_path / "absent" / "broker.sock"), switch="1")
    assert (proc.returncode, proc.stdout) == (1, "missing\n")


def test_ignore_switch_queries_with_switch_off(c_client: Path, tmp_path: Path) -> None:
    proc = _run(c_client, "--ignore-switch", str(tmp_path / "absent" / "broker.sock"), switch="0")
    assert (proc.returncode, proc.stdout) == (1, "missing\n")


def test_storm_counts_every_failure(c_client: Path, tmp_path: Path) -> None:
    proc = _run(c_client, "--storm", "20", str(tmp_path / "absent" / "broker.sock"), switch="1")
    assert proc.returncode == 1
    match = _STORM_LINE.search(proc.stdout)
    assert match is not None, proc.stdout
    assert (match["clients"], match["ok"], match["failed"]) == ("20", "0", "20")
    assert "failures: missing=20" in proc.stdout


@pytest.mark.root
def test_storm_in_a_pid_namespace_gets_distinct_host_pids(c_client: Path, sandbox: Sandbox) -> None:
    with rogue_server(sandbox.host_socket, "ok"):
        run = run_in_sandbox(
            sandbox,
            [str(c_client), "--storm", "100", "--ignore-switch", str(sandbox.client_socket)],
        )
    assert run.returncode == 0, run.stdout + run.stderr
    line = _STORM_LINE.search(run.stdout)
    detail = _STORM_DETAIL.search(run.stdout)
    assert line is not None, run.stdout
    assert detail is not None, run.stdout
    assert (line["clients"], line["ok"], line["failed"]) == ("100", "100", "0")
    assert detail["distinct"] == "100"
    # Inside the sandbox's PID namespace no host PID equals the child's own PID.
    assert detail["local"] == "0"


@pytest.fixture(scope="module")
def sanitized_client() -> Iterator[Path]:
    """The C client built with AddressSanitizer and UBSan, aborting on the first error."""
    dest = world_readable_tempdir("hami-trio-cclient-asan-")
    try:
        yield build_c_client(
            dest,
            extra_cflags="-fsanitize=address,undefined -fno-sanitize-recover=all "
            "-fno-omit-frame-pointer",
        )
    finally:
        shutil.rmtree(dest, ignore_errors=True)


@pytest.mark.root
@pytest.mark.parametrize("mode", ["ok", "short", "wrong_magic", "silent", "close"])
def test_sanitizer_build_is_clean(sanitized_client: Path, sandbox: Sandbox, mode: str) -> None:
    with rogue_server(sandbox.host_socket, mode):
        run = run_in_sandbox(
            sandbox,
            [
                str(sanitized_client),
                "--ignore-switch",
                "--deadline",
                "0.2",
                str(sandbox.client_socket),
            ],
        )
    # A sanitizer report exits with a status other than 0 (answer) or 1 (no answer).
    assert run.returncode == (0 if mode == "ok" else 1), run.stderr
    assert "Sanitizer" not in run.stderr
