"""Contract tests of the broker clients in a container-like sandbox (real kernel objects).

Every test runs for each client (the C reference client and ``hami-trio hostpid``):
the client sits in a new PID and mount namespace, sees the broker directory through a
read-only bind mount at ``.../vgpulock/hostpid`` and runs as uid 65534, exactly as HAMi-core
inside a CUDA container would.  Servers here are the rogue stand-ins of rogue_server.py,
which answer correctly or wrongly on purpose; each defect is its own test.  The same clients
against the real broker, and the storms: test_with_broker.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.clients import CClient, Client, PyClient
from tests.clients.harness import NOBODY, Sandbox, rogue_server

pytestmark = pytest.mark.root

# How far past its deadline a client may finish on this shared 2-core machine (process exit
# and the test's own scheduling included).  The deadline itself is the contract.
SLACK = 0.25


@pytest.fixture(params=["c", "python"])
def client(request: pytest.FixtureRequest, c_client: Path) -> Client:
    if request.param == "c":
        return CClient(c_client)
    return PyClient()


@pytest.fixture
def ok_server(sandbox: Sandbox) -> Iterator[None]:
    """A correct stand-in broker running as root on the sandbox's socket."""
    with rogue_server(sandbox.host_socket, "ok"):
        yield


def test_answer_is_host_pid_not_namespace_pid(
    client: Client, sandbox: Sandbox, ok_server: None
) -> None:
    outcome = client.run(sandbox)
    assert outcome.pid == outcome.run.host_pid
    # The client is PID 1 of its own namespace; the answer must be the host's view of it.
    assert outcome.run.ns_pids == (outcome.run.host_pid, 1)
    assert outcome.pid != outcome.run.ns_pids[-1]


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("wrong_magic", "malformed"),
        ("wrong_version", "malformed"),
        ("status1", "malformed"),
        ("pid0", "malformed"),
        ("pid_huge", "malformed"),
        ("short", "malformed"),
        ("close", "refused"),
    ],
)
def test_rogue_answer_is_refused(client: Client, sandbox: Sandbox, mode: str, reason: str) -> None:
    with rogue_server(sandbox.host_socket, mode):
        outcome = client.run(sandbox)
    assert (outcome.pid, outcome.reason) == (None, reason), outcome.run.stderr


def test_silent_server_times_out_within_deadline(client: Client, sandbox: Sandbox) -> None:
    deadline = 0.3
    with rogue_server(sandbox.host_socket, "silent"):
        outcome = client.run(sandbox, deadline=deadline)
    assert outcome.reason == "timeout"
    assert deadline <= outcome.elapsed < deadline + SLACK, outcome.elapsed


def test_full_backlog_is_waited_for_within_the_deadline(client: Client, sandbox: Sandbox) -> None:
    # A storm of cuInit() calls can fill the broker's listen backlog.  A non-blocking AF_UNIX
    # connect then fails at once with EAGAIN; the clients must instead wait for room (up to
    # their deadline) and get their answer once the broker accepts again.
    with (
        rogue_server(sandbox.host_socket, "ok", backlog=0, accept_delay=1.0),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as queued,
    ):
        queued.connect(str(sandbox.host_socket))  # backlog 0: this one fills the queue
        queued.sendall(b"HPID\x00\x01\x00\x01")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.setblocking(False)
            with pytest.raises(BlockingIOError):
                probe.connect(str(sandbox.host_socket))
        outcome = client.run(sandbox, deadline=5.0)
    assert outcome.pid == outcome.run.host_pid, outcome.run.stderr


def test_read_write_mount_is_refused(client: Client, sandbox: Sandbox, ok_server: None) -> None:
    assert client.run(sandbox, read_only=False).reason == "not_read_only"


@pytest.mark.parametrize("mode", [0o777, 0o731, 0o713])
def test_directory_writable_by_group_or_other_is_refused(
    client: Client, sandbox: Sandbox, ok_server: None, mode: int
) -> None:
    sandbox.broker_dir.chmod(mode)
    assert client.run(sandbox).reason == "unsafe_mode"


def test_directory_of_non_root_owner_is_refused(
    client: Client, sandbox: Sandbox, ok_server: None
) -> None:
    os.chown(sandbox.broker_dir, NOBODY, NOBODY)
    assert client.run(sandbox).reason == "unsafe_owner"


def test_symlinked_directory_is_refused(client: Client, sandbox: Sandbox, ok_server: None) -> None:
    link = sandbox.mount_point.parent / "hostpid-link"
    link.symlink_to(sandbox.mount_point.name)
    assert client.run(sandbox, socket=link / "broker.sock").reason == "unsafe_mode"


def test_socket_of_non_root_owner_is_refused(
    client: Client, sandbox: Sandbox, ok_server: None
) -> None:
    os.chown(sandbox.host_socket, NOBODY, NOBODY)
    assert client.run(sandbox).reason == "unsafe_owner"


def test_server_not_running_as_root_is_refused(client: Client, sandbox: Sandbox) -> None:
    # Socket file root-owned (bound as root), but the listener dropped to 65534 before
    # listen(): only SO_PEERCRED can tell.
    with rogue_server(sandbox.host_socket, "ok", listen_uid=NOBODY):
        assert os.stat(sandbox.host_socket).st_uid == 0
        assert client.run(sandbox).reason == "peer_not_root"


def test_regular_file_at_socket_path_is_refused(client: Client, sandbox: Sandbox) -> None:
    sandbox.host_socket.write_bytes(b"")
    assert client.run(sandbox).reason == "not_socket"


def test_symlink_at_socket_path_is_refused(client: Client, sandbox: Sandbox) -> None:
    # The link points at a live, correct server: connect() would follow it, lstat must not.
    elsewhere = sandbox.root / "elsewhere.sock"
    with rogue_server(elsewhere, "ok"):
        sandbox.host_socket.symlink_to(elsewhere)
        assert client.run(sandbox).reason == "not_socket"


def test_missing_socket(client: Client, sandbox: Sandbox) -> None:
    assert client.run(sandbox).reason == "missing"


def test_missing_directory(client: Client, sandbox: Sandbox) -> None:
    absent = sandbox.mount_point.parent / "no-such-dir" / "broker.sock"
    assert client.run(sandbox, socket=absent).reason == "missing"


def test_stale_socket(client: Client, sandbox: Sandbox) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(sandbox.host_socket))  # bound, never listening, then closed: stale
    sandbox.host_socket.chmod(0o666)  # as the broker leaves it, so only the listener is missing
    assert sandbox.host_socket.is_socket()
    assert client.run(sandbox).reason == "stale"


def test_socket_the_client_may_not_connect_to_is_refused(
    client: Client, sandbox: Sandbox, ok_server: None
) -> None:
    sandbox.host_socket.chmod(0o755)  # connect() needs write permission on the socket file
    assert client.run(sandbox).reason == "refused"


@pytest.mark.parametrize("value", [None, "", "true", " 1", "01", "1 "])
def test_switch_off_unless_exactly_1(
    client: Client, sandbox: Sandbox, ok_server: None, value: str | None
) -> None:
    assert client.run(sandbox, switch=value).reason == "disabled"


def test_switch_on_for_exactly_1(client: Client, sandbox: Sandbox, ok_server: None) -> None:
    assert client.run(sandbox, switch="1").pid is not None
