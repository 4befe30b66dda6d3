"""The C reference client's own command line: usage, the switch, storm mode, sanitizers.

The security checks and response handling are contract tests (test_contract.py); these
cover what only the C command has.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.harness import (
    C_SOURCES,
    NOBODY,
    Sandbox,
    build_c_client,
    makefile_warnings,
    rogue_server,
    run_in_sandbox,
)
from tests.sandbox import world_readable_dir

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
    with world_readable_dir("ht-cclient-asan-") as dest:
        yield build_c_client(
            dest,
            extra_cflags="-fsanitize=address,undefined -fno-sanitize-recover=all "
            "-fno-omit-frame-pointer",
        )


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


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file has a PT_INTERP (dynamic loader) header."""
    assert elf[:4] == b"\x7fELF"
    assert elf[4] == 2  # ELFCLASS64
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    pt_interp = 3
    return any(
        struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == pt_interp for i in range(phnum)
    )


def test_static_build_needs_no_shared_libraries(c_client: Path, tmp_path: Path) -> None:
    # What operators copy into a workload container (docs/operations.md).
    static = build_c_client(tmp_path, static=True)
    assert not _has_interpreter(static.read_bytes())
    assert _has_interpreter(c_client.read_bytes())
    proc = _run(static, str(tmp_path / "absent" / "broker.sock"), switch="1")
    assert (proc.returncode, proc.stdout) == (1, "missing\n")


def test_warnings_are_errors_in_c99() -> None:
    flags = makefile_warnings()
    assert {"-std=c99", "-Wall", "-Wextra", "-Werror"} <= set(flags)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_makefile_builds_both_targets(tmp_path: Path) -> None:
    subprocess.run(
        ["make", "-s", "-C", str(C_SOURCES), f"BUILD={tmp_path}", "all", "static"],
        check=True,
        capture_output=True,
    )
    assert _has_interpreter((tmp_path / "hostpid-client").read_bytes())
    assert not _has_interpreter((tmp_path / "hostpid-client-static").read_bytes())
    proc = _run(tmp_path / "hostpid-client", "--help")
    assert proc.returncode == 0


@pytest.mark.root
def test_expected_uid_define_is_the_only_way_to_trust_another_owner(
    c_client: Path, sandbox: Sandbox
) -> None:
    # Everything owned and served by 65534: the production build refuses it, a build with
    # the test-only define accepts it (and then refuses root instead).
    with world_readable_dir("ht-cclient-uid-") as dest:
        test_build = build_c_client(dest, extra_cflags=f"-DHOSTPID_EXPECTED_UID={NOBODY}")
        os.chown(sandbox.broker_dir, NOBODY, NOBODY)
        with rogue_server(sandbox.host_socket, "ok", listen_uid=NOBODY):
            os.chown(sandbox.host_socket, NOBODY, NOBODY)
            for binary, expected in ((c_client, "unsafe_owner"), (test_build, None)):
                run = run_in_sandbox(
                    sandbox, [str(binary), "--ignore-switch", str(sandbox.client_socket)]
                )
                if expected is None:
                    assert run.returncode == 0, run.stderr
                    assert int(run.stdout) == run.host_pid
                else:
                    assert run.stdout.strip() == expected
        os.chown(sandbox.broker_dir, 0, 0)
        with rogue_server(sandbox.host_socket, "ok"):
            run = run_in_sandbox(
                sandbox, [str(test_build), "--ignore-switch", str(sandbox.client_socket)]
            )
        assert run.stdout.strip() == "unsafe_owner"
