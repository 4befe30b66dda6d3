"""Helpers for the client contract tests: build the C client, run rogue servers, and run a
client inside a container-like sandbox.

The sandbox is what a CUDA container looks like to HAMi-core, built from real kernel objects:

- the broker's directory lives on the "host" side (``<root>/host/hostpid``, root, 0711);
- ``unshare --pid --fork --mount --propagation private --kill-child`` gives the client a new
  PID namespace (it is PID 1 there) and a private mount namespace;
- inside it the broker directory is bind-mounted, read-only unless a test asks otherwise, at
  the sandbox's ``<root>/ctr/vgpulock/hostpid``, below a writable 01777 ``vgpulock`` parent;
- the client then runs as uid/gid 65534 (``setpriv`` for the C client; the Python client drops
  privileges itself after its imports, because uid 65534 cannot read the venv under /root).

Start-up uses a ready/go handshake over the sandbox's stdin/stdout, so the test can read the
client's host-side PID (the child of ``unshare``) and its in-namespace PID (``NSpid``) from
/proc *before* the client runs, and can time the client alone.

Everything lives in a world-readable temporary directory (``tests.sandbox.world_readable_dir``:
pytest's ``tmp_path`` is 0700, so uid 65534 could not reach it) that is removed afterwards;
every process is killed and waited for.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.programs import need
from tests.sandbox import NOBODY, world_readable_dir

__all__ = [
    "C_SOURCES",
    "NOBODY",
    "ClientRun",
    "Sandbox",
    "build_c_client",
    "c_client_build_command",
    "make_sandbox",
    "makefile_warnings",
    "python_broker",
    "rogue_server",
    "run_in_sandbox",
    "sandbox_command",
]

REPO = Path(__file__).resolve().parents[2]
C_SOURCES = REPO / "clients" / "c"
ROGUE_SERVER = Path(__file__).with_name("rogue_server.py")
SOCKET_NAME = "broker.sock"

# The sandbox's init: $1 = broker dir (host side), $2 = mount point, $3 = "ro"/"rw",
# $4 = "setpriv" (handshake here, then drop to 65534) or "self" (exec the client as root at
# once: it drops privileges and does the handshake itself); the client's argv follows.
_SANDBOX_SCRIPT = r"""
set -e
mount --bind "$1" "$2"
if [ "$3" = ro ]; then mount -o remount,bind,ro "$2"; fi
how="$4"
shift 4
if [ "$how" = self ]; then exec "$@"; fi
echo ready
read -r go
exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"
"""


def makefile_warnings() -> list[str]:
    """The compiler flags of ``WARNINGS`` in clients/c/Makefile (one source of truth)."""
    text = (C_SOURCES / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^WARNINGS\s*=\s*(.*)$", text, re.MULTILINE)
    if match is None:
        raise AssertionError("clients/c/Makefile has no WARNINGS variable")
    return match.group(1).split()


def c_client_build_command(
    dest: Path, *, extra_cflags: str = "", static: bool = False
) -> list[str]:
    """The gcc command :func:`build_c_client` runs (benchmarks record it)."""
    return [
        "gcc",
        *makefile_warnings(),
        "-O2",
        "-g",
        *extra_cflags.split(),
        *(["-static"] if static else []),
        "-o",
        str(dest / "hostpid-client"),
        str(C_SOURCES / "hostpid_client.c"),
        str(C_SOURCES / "hostpid_cli.c"),
    ]


def build_c_client(dest: Path, *, extra_cflags: str = "", static: bool = False) -> Path:
    """Compile ``hostpid-client`` into ``dest`` with gcc and the Makefile's flags.

    gcc directly rather than ``make``: a fresh machine for this project has python3, pip and
    gcc, not necessarily make (test_c_client.py builds with the Makefile when make exists).

    Skips the test (fails it in CI) when gcc is not installed.

    Raises:
        subprocess.CalledProcessError: the build failed (warnings are errors).
    """
    need("gcc", "builds the C reference client")
    binary = dest / "hostpid-client"
    subprocess.run(
        c_client_build_command(dest, extra_cflags=extra_cflags, static=static),
        check=True,
        capture_output=True,
        text=True,
    )
    binary.chmod(0o755)
    return binary


@dataclass
class Sandbox:
    """The host-side and sandbox-side paths of one container-like sandbox."""

    root: Path

    @property
    def broker_dir(self) -> Path:
        """The broker's directory on the host side (what the broker serves in)."""
        return self.root / "host" / "hostpid"

    @property
    def host_socket(self) -> Path:
        return self.broker_dir / SOCKET_NAME

    @property
    def mount_point(self) -> Path:
        """Where the sandbox sees the broker directory (``.../vgpulock/hostpid``)."""
        return self.root / "ctr" / "vgpulock" / "hostpid"

    @property
    def client_socket(self) -> Path:
        """The socket path a client inside the sandbox uses."""
        return self.mount_point / SOCKET_NAME


@contextmanager
def make_sandbox() -> Iterator[Sandbox]:
    """Create the directory tree of a sandbox (root-owned, broker dir 0711); remove it after."""
    with world_readable_dir("ht-sandbox-") as root:
        box = Sandbox(root)
        box.broker_dir.parent.mkdir(mode=0o755)
        box.broker_dir.mkdir()
        box.broker_dir.chmod(0o711)
        vgpulock = box.mount_point.parent
        vgpulock.parent.mkdir(mode=0o755)
        vgpulock.mkdir()
        vgpulock.chmod(0o1777)
        box.mount_point.mkdir(mode=0o755)
        yield box


@dataclass
class ClientRun:
    """What one client run in the sandbox produced."""

    returncode: int
    stdout: str
    stderr: str
    host_pid: int  # the client's PID in the host (broker's) namespace, read from /proc
    ns_pids: tuple[int, ...]  # NSpid: the same process in each nested PID namespace
    elapsed: float  # seconds from "go" to the client's exit


def _only_child(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise AssertionError(f"expected one child of unshare {pid}, found {children}")
    return int(children[0])


def _ns_pids(pid: int) -> tuple[int, ...]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(field) for field in line.split()[1:])
    raise AssertionError(f"/proc/{pid}/status has no NSpid line")


def sandbox_command(
    box: Sandbox,
    argv: Sequence[str],
    *,
    read_only: bool = True,
    client_drops_itself: bool = False,
) -> list[str]:
    """The exact command :func:`run_in_sandbox` runs for ``argv`` (benchmarks record it)."""
    return [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _SANDBOX_SCRIPT,
        "sandbox",
        str(box.broker_dir),
        str(box.mount_point),
        "ro" if read_only else "rw",
        "self" if client_drops_itself else "setpriv",
        *argv,
    ]


def run_in_sandbox(
    box: Sandbox,
    argv: Sequence[str],
    *,
    read_only: bool = True,
    client_drops_itself: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> ClientRun:
    """Run ``argv`` as the client inside a fresh sandbox around ``box`` and wait for it.

    Args:
        box: the sandbox tree (its broker directory is what gets bind-mounted).
        argv: the client command; run as uid 65534 via setpriv, or, with
            ``client_drops_itself``, started as root: it must drop to 65534 after its imports,
            print ``ready`` and wait for a ``go`` line on stdin (py_client_child.py does).
        read_only: bind-mount the broker directory read-only (the production setup).
        env: the client's environment (default: a minimal PATH only).
        timeout: seconds before the sandbox is killed and the test fails.

    Returns:
        The client's exit status, output, host-side and namespace PIDs and run time.
    """
    cmd = sandbox_command(box, argv, read_only=read_only, client_drops_itself=client_drops_itself)
    child_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"} if env is None else dict(env)
    with subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            ready = proc.stdout.readline()
            if ready != "ready\n":
                proc.kill()
                _, err = proc.communicate(timeout=timeout)
                raise AssertionError(f"sandbox did not start: {ready!r} {err!r}")
            host_pid = _only_child(proc.pid)
            ns_pids = _ns_pids(host_pid)
            start = time.monotonic()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=timeout)
            elapsed = time.monotonic() - start
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return ClientRun(proc.returncode, out, err, host_pid, ns_pids, elapsed)


@contextmanager
def rogue_server(
    socket_path: Path,
    mode: str,
    *,
    listen_uid: int | None = None,
    backlog: int | None = None,
    accept_delay: float = 0.0,
) -> Iterator[subprocess.Popen[str]]:
    """Run ``rogue_server.py`` on ``socket_path`` until the block ends; see that module."""
    cmd = [sys.executable, str(ROGUE_SERVER), "--socket", str(socket_path), "--mode", mode]
    if listen_uid is not None:
        cmd += ["--listen-uid", str(listen_uid)]
    if backlog is not None:
        cmd += ["--backlog", str(backlog)]
    cmd += ["--accept-delay", str(accept_delay)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line != "ready\n":
                proc.kill()
                _, err = proc.communicate(timeout=10)
                raise AssertionError(f"rogue server did not start: {line!r} {err!r}")
            yield proc
        finally:
            proc.kill()
            proc.communicate()
            if os.path.lexists(socket_path):
                os.unlink(socket_path)


def _answers(socket_path: Path) -> bool:
    """One raw exchange with the broker (from the test process): does it answer now?"""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(socket_path))
            sock.sendall(b"HPID\x00\x01\x00\x01")
            return len(sock.recv(12)) == 12
    except OSError:
        return False


@contextmanager
def python_broker(
    socket_path: Path, *extra_args: str, timeout: float = 15.0
) -> Iterator[subprocess.Popen[str]]:
    """Run the real broker (``python -m hami_trio broker``, as root) until the block ends.

    It is ready once it answers a raw exchange; on exit it gets SIGTERM (graceful stop) and is
    killed if it has not exited after 5 s.

    Raises:
        AssertionError: it exited or did not answer within ``timeout`` (stderr included).
    """
    cmd = [sys.executable, "-m", "hami_trio", "broker", "--socket-path", str(socket_path)]
    with subprocess.Popen(
        [*cmd, *extra_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            deadline = time.monotonic() + timeout
            while not _answers(socket_path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    _, err = proc.communicate()
                    raise AssertionError(f"broker did not start (rc={proc.returncode}): {err}")
                time.sleep(0.02)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
