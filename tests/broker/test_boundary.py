"""The filesystem boundary: every refusal on its own, and what is created."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hami_trio.broker.boundary import (
    DEFAULT_LOCK_PATH,
    DEFAULT_SOCKET_PATH,
    LEGACY_LOCK_NAME,
    LOCK_NAME,
    BrokerSocket,
    default_lock_path,
    expected_owner,
    open_broker_socket,
)
from hami_trio.errors import BrokerStartupError
from tests.sandbox import NOBODY, run_in_child


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def listing(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Name -> (inode, mode, uid) of everything in ``directory``: to prove nothing changed."""
    return {
        entry.name: (
            entry.inode(),
            entry.stat(follow_symlinks=False).st_mode,
            entry.stat(follow_symlinks=False).st_uid,
        )
        for entry in os.scandir(directory)
    }


def lock_of(socket_path: Path) -> Path:
    """The lock file of ``socket_path``, its directory created (mode 0700) as a broker would."""
    lock = default_lock_path(socket_path)
    lock.parent.mkdir(mode=0o700, exist_ok=True)
    return lock


@contextmanager
def opened(path: Path, **kwargs: Any) -> Iterator[BrokerSocket]:
    bound = open_broker_socket(path, **kwargs)
    try:
        yield bound
    finally:
        bound.close()


def stale_socket(path: Path) -> None:
    """Leave a socket file nobody listens on (a broker that died without cleaning up)."""
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def refused(path: Path, reason: str, **kwargs: Any) -> str:
    with pytest.raises(BrokerStartupError) as info:
        open_broker_socket(path, **kwargs)
    message = str(info.value)
    assert reason in message
    return message


# -- what a successful start creates ----------------------------------------------------------


def test_creates_trusted_modes_despite_umask(socket_path: Path) -> None:
    old = os.umask(0o077)
    try:
        bound = open_broker_socket(socket_path)
    finally:
        os.umask(old)
    try:
        directory = socket_path.parent
        lock = directory.with_name("hostpid-lock") / LOCK_NAME
        assert bound.lock_path == lock
        assert mode(directory) == 0o711
        assert mode(socket_path) == 0o666
        assert mode(lock.parent) == 0o700
        assert mode(lock) == 0o600
        # The socket's directory (what workloads mount) holds the socket and nothing else.
        assert os.listdir(directory) == [socket_path.name]
        st = os.lstat(socket_path)
        assert stat.S_ISSOCK(st.st_mode)
        assert bound.identity == (st.st_dev, st.st_ino)
        for path in (directory, socket_path, lock.parent, lock):
            assert os.lstat(path).st_uid == os.geteuid()
        assert bound.listener.getblocking() is False
        assert bound.is_ours()
    finally:
        bound.close()
    assert not socket_path.exists()
    bound.close()  # idempotent


def test_accepts_connections_from_any_client(socket_path: Path) -> None:
    with opened(socket_path) as bound:
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(socket_path))
        conn, _ = bound.listener.accept()
        conn.close()
        client.close()


def test_existing_directory_is_tightened_to_0711(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o755)
    socket_path.parent.chmod(0o755)
    with opened(socket_path):
        assert mode(socket_path.parent) == 0o711


def test_missing_ancestors_are_created(base_dir: Path) -> None:
    path = base_dir / "a" / "b" / "hostpid" / "broker.sock"
    old = os.umask(0o077)
    try:
        with opened(path):
            assert mode(base_dir / "a") == 0o755
            assert mode(base_dir / "a" / "b") == 0o755
            assert mode(path.parent) == 0o711
    finally:
        os.umask(old)


def test_stale_socket_of_expected_owner_is_removed(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    stale_socket(socket_path)
    with opened(socket_path) as bound:
        st = os.lstat(socket_path)
        assert bound.identity == (st.st_dev, st.st_ino)
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(socket_path))  # the new socket listens
        client.close()


def test_replacement_socket_survives_shutdown(socket_path: Path) -> None:
    bound = open_broker_socket(socket_path)
    replacement = socket.socket(socket.AF_UNIX)
    try:
        temporary = socket_path.with_name("replacement.sock")
        replacement.bind(str(temporary))
        os.rename(temporary, socket_path)  # an operator swaps the socket during the run
        assert not bound.is_ours()
        bound.close()
        st = os.lstat(socket_path)
        assert stat.S_ISSOCK(st.st_mode)
        assert (st.st_dev, st.st_ino) != bound.identity
    finally:
        replacement.close()


def test_lock_is_released_on_close(socket_path: Path) -> None:
    with opened(socket_path):
        pass
    with opened(socket_path):  # a successor starts cleanly
        pass


# -- refusals: each on its own; nothing that is not ours is touched ----------------------------


def test_refuses_symlinked_directory(base_dir: Path, socket_path: Path) -> None:
    real = base_dir / "real"
    real.mkdir(mode=0o711)
    socket_path.parent.symlink_to(real)
    message = refused(socket_path, "directory is a symlink")
    assert str(socket_path.parent) in message
    assert list(real.iterdir()) == []


def test_refuses_non_directory(socket_path: Path) -> None:
    socket_path.parent.write_text("not a directory")
    refused(socket_path, "not a directory but a regular file")
    assert socket_path.parent.read_text() == "not a directory"


@pytest.mark.root
def test_refuses_directory_of_another_owner(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    os.chown(socket_path.parent, NOBODY, NOBODY)
    refused(socket_path, f"owned by uid {NOBODY}, expected {os.geteuid()}")
    assert list(socket_path.parent.iterdir()) == []


def test_refuses_symlinked_lock(base_dir: Path, socket_path: Path) -> None:
    target = base_dir / "elsewhere"
    target.write_text("precious")
    before = mode(target)
    lock_of(socket_path).symlink_to(target)
    refused(socket_path, "lock file is a symlink")
    assert target.read_text() == "precious"
    assert mode(target) == before


def test_refuses_dangling_symlinked_lock(base_dir: Path, socket_path: Path) -> None:
    lock_of(socket_path).symlink_to(base_dir / "missing")
    refused(socket_path, "lock file is a symlink")
    assert not (base_dir / "missing").exists()


def test_refuses_lock_with_wrong_mode(socket_path: Path) -> None:
    lock = lock_of(socket_path)
    lock.touch()
    lock.chmod(0o644)
    refused(socket_path, "lock file mode 0644 grants group/other access")
    assert mode(lock) == 0o644
    assert not socket_path.exists()


@pytest.mark.root
def test_refuses_lock_of_another_owner(socket_path: Path) -> None:
    lock = lock_of(socket_path)
    lock.touch(mode=0o600)
    os.chown(lock, NOBODY, NOBODY)
    refused(socket_path, f"lock file is owned by uid {NOBODY}")


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_refuses_lock_that_is_not_a_regular_file(socket_path: Path, kind: str) -> None:
    lock = lock_of(socket_path)
    if kind == "directory":
        lock.mkdir()
    else:
        os.mkfifo(lock, 0o600)
    refused(socket_path, "not a regular file")


def test_refuses_regular_file_at_socket_path(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    socket_path.write_text("someone's data")
    refused(socket_path, "path is a regular file, not a socket")
    assert socket_path.read_text() == "someone's data"


def test_refuses_directory_at_socket_path(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    socket_path.mkdir()
    refused(socket_path, "path is a directory, not a socket")
    assert socket_path.is_dir()


@pytest.mark.root
def test_refuses_socket_of_another_owner(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    stale_socket(socket_path)
    os.chown(socket_path, NOBODY, NOBODY)
    before = listing(socket_path.parent)
    refused(socket_path, f"socket is owned by uid {NOBODY}")
    after = listing(socket_path.parent)
    assert after[socket_path.name] == before[socket_path.name]


def test_refuses_live_socket(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    other = socket.socket(socket.AF_UNIX)
    try:
        other.bind(str(socket_path))
        other.listen(8)
        before = listing(socket_path.parent)[socket_path.name]
        refused(socket_path, "socket is live: another server is listening on it")
        assert listing(socket_path.parent)[socket_path.name] == before
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(socket_path))  # the other server is unharmed
        client.close()
    finally:
        other.close()


def test_refuses_live_socket_with_full_backlog(socket_path: Path) -> None:
    # A server too busy to accept is still live: the probe must not call it stale.
    socket_path.parent.mkdir(mode=0o711)
    other = socket.socket(socket.AF_UNIX)
    queued = []
    try:
        other.bind(str(socket_path))
        other.listen(0)
        while True:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            try:
                client.connect(str(socket_path))
            except BlockingIOError:
                client.close()
                break
            queued.append(client)
        refused(socket_path, "socket is live")
    finally:
        for client in queued:
            client.close()
        other.close()


def test_refuses_second_broker(socket_path: Path) -> None:
    with opened(socket_path) as first:
        refused(socket_path, "lock is held: another broker is running")
        assert first.is_ours()
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(socket_path))
        client.close()


# -- where the lock lives: beside the socket's directory, never where workloads reach it -------


def test_default_lock_path_is_beside_the_socket_directory() -> None:
    assert default_lock_path(DEFAULT_SOCKET_PATH) == DEFAULT_LOCK_PATH
    assert Path("/var/run/hami/hostpid-lock/broker.lock") == DEFAULT_LOCK_PATH
    assert default_lock_path("/a/b/c.sock") == Path("/a/b-lock/broker.lock")


def test_explicit_lock_path_is_used(base_dir: Path, socket_path: Path) -> None:
    lock = base_dir / "locks" / "hostpid.lock"
    with opened(socket_path, lock_path=lock) as bound:
        assert bound.lock_path == lock
        assert mode(lock.parent) == 0o700
        assert mode(lock) == 0o600
        refused(base_dir / "other" / "broker.sock", "lock is held", lock_path=lock)
        assert os.listdir(socket_path.parent) == [socket_path.name]
    assert not default_lock_path(socket_path).parent.exists()


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("hostpid/broker.lock", "lock directory is the socket's directory"),
        ("hostpid/sub/broker.lock", "lock directory lies inside the socket's directory"),
        ("broker.lock", "lock directory contains the socket's directory"),
    ],
    ids=["in", "below", "above"],
)
def test_refuses_a_lock_where_workloads_reach_it(
    base_dir: Path, socket_path: Path, where: str, reason: str
) -> None:
    message = refused(socket_path, reason, lock_path=base_dir / where)
    assert "which workloads mount" in message
    assert not socket_path.parent.exists()  # refused before anything was created
    assert list(base_dir.iterdir()) == []


def test_refuses_the_socket_directory_under_another_name(base_dir: Path, socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    (base_dir / "alias").symlink_to(socket_path.parent)
    refused(
        socket_path,
        "lock directory is the socket's directory",
        lock_path=base_dir / "alias" / "x" / ".." / "broker.lock",
    )
    refused(socket_path, "lock directory lies inside", lock_path=base_dir / "alias" / "d" / "l")
    assert os.listdir(socket_path.parent) == []


def test_existing_lock_directory_is_tightened_to_0700(socket_path: Path) -> None:
    lock = default_lock_path(socket_path)
    lock.parent.mkdir(mode=0o755)
    lock.parent.chmod(0o755)
    with opened(socket_path):
        assert mode(lock.parent) == 0o700


def test_refuses_symlinked_lock_directory(base_dir: Path, socket_path: Path) -> None:
    real = base_dir / "real"
    real.mkdir(mode=0o700)
    default_lock_path(socket_path).parent.symlink_to(real)
    message = refused(socket_path, "directory is a symlink")
    assert str(default_lock_path(socket_path).parent) in message
    assert list(real.iterdir()) == []
    assert not socket_path.parent.exists()


def test_refuses_lock_directory_that_is_a_file(socket_path: Path) -> None:
    default_lock_path(socket_path).parent.write_text("x")
    refused(socket_path, "not a directory but a regular file")


@pytest.mark.root
def test_refuses_lock_directory_of_another_owner(socket_path: Path) -> None:
    lock = lock_of(socket_path)
    os.chown(lock.parent, NOBODY, NOBODY)
    refused(socket_path, f"directory is owned by uid {NOBODY}, expected {os.geteuid()}")
    assert list(lock.parent.iterdir()) == []


def test_earlier_versions_lock_in_the_socket_directory_is_removed(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    legacy = socket_path.parent / LEGACY_LOCK_NAME
    legacy.touch(mode=0o600)
    holder = os.open(legacy, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by someone: no matter
        with opened(socket_path):
            assert not legacy.exists()
            assert os.listdir(socket_path.parent) == [socket_path.name]
    finally:
        os.close(holder)


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo", "foreign"])
def test_anything_else_named_like_the_old_lock_is_left_alone(
    base_dir: Path, socket_path: Path, kind: str
) -> None:
    if kind == "foreign" and os.geteuid() != 0:
        pytest.skip("needs root to chown")
    socket_path.parent.mkdir(mode=0o711)
    legacy = socket_path.parent / LEGACY_LOCK_NAME
    if kind == "directory":
        legacy.mkdir()
    elif kind == "symlink":
        (base_dir / "target").write_text("precious")
        legacy.symlink_to(base_dir / "target")
    elif kind == "fifo":
        os.mkfifo(legacy, 0o600)
    else:
        legacy.touch(mode=0o600)
        os.chown(legacy, NOBODY, NOBODY)
    before = listing(socket_path.parent)[LEGACY_LOCK_NAME]
    with opened(socket_path):  # starts all the same: the old name is not used
        assert listing(socket_path.parent)[LEGACY_LOCK_NAME] == before
    if kind == "symlink":
        assert (base_dir / "target").read_text() == "precious"


def test_old_lock_is_kept_while_another_server_is_live(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    legacy = socket_path.parent / LEGACY_LOCK_NAME
    legacy.touch(mode=0o600)
    other = socket.socket(socket.AF_UNIX)
    try:
        other.bind(str(socket_path))
        other.listen(8)
        refused(socket_path, "socket is live")
        assert legacy.exists()  # an earlier version's broker still runs: its lock stays
    finally:
        other.close()


def test_refuses_too_long_path(base_dir: Path) -> None:
    path = base_dir / "hostpid" / ("x" * 120)
    refused(path, "cannot bind")


# -- who must own it ------------------------------------------------------------------


def test_expected_owner_rule() -> None:
    custom = Path("/tmp/somewhere/broker.sock")
    assert expected_owner(DEFAULT_SOCKET_PATH, euid=0) == 0
    assert expected_owner(custom, euid=1000) == 1000
    assert expected_owner(custom, euid=0) == 0
    assert expected_owner(custom, euid=0, expected_uid=NOBODY) == NOBODY
    with pytest.raises(BrokerStartupError, match="requires euid 0, running as 1000"):
        expected_owner(DEFAULT_SOCKET_PATH, euid=1000)
    with pytest.raises(BrokerStartupError, match="must be owned by root"):
        expected_owner(DEFAULT_SOCKET_PATH, euid=0, expected_uid=5)
    with pytest.raises(BrokerStartupError, match="only root can create files for another uid"):
        expected_owner(custom, euid=1000, expected_uid=1001)


@pytest.mark.skipif(
    os.path.realpath("/var/run") != "/run", reason="/var/run is not a symlink to /run here"
)
def test_default_path_spelled_through_run_is_the_default() -> None:
    with pytest.raises(BrokerStartupError, match="requires euid 0"):
        expected_owner(Path("/run/hami/hostpid/broker.sock"), euid=1000)


def _open_default_path() -> str:
    """In a child running as uid 65534: try the default path, return the refusal."""
    try:
        open_broker_socket(DEFAULT_SOCKET_PATH).close()
    except BrokerStartupError as exc:
        return str(exc)
    return "no refusal"


@pytest.mark.root
def test_default_path_refused_for_non_root_euid() -> None:
    existed = os.path.lexists(DEFAULT_SOCKET_PATH.parent)
    result = run_in_child(_open_default_path, uid=NOBODY)
    assert result.value == (
        f"{DEFAULT_SOCKET_PATH}: the default socket path requires euid 0, running as {NOBODY}"
    )
    assert os.path.lexists(DEFAULT_SOCKET_PATH.parent) == existed


@pytest.mark.root
def test_root_can_hand_everything_to_another_expected_owner(socket_path: Path) -> None:
    with opened(socket_path, expected_uid=NOBODY):
        lock = default_lock_path(socket_path)
        for path in (socket_path.parent, socket_path, lock.parent, lock):
            assert os.lstat(path).st_uid == NOBODY
    # A directory of that owner is then accepted, and refused for the default rule.
    with opened(socket_path, expected_uid=NOBODY):
        pass
    refused(socket_path, f"directory is owned by uid {NOBODY}, expected 0")


# -- another broker's lock, seen without touching it -------------------------------------


def test_flock_identities_reads_proc_locks_lines() -> None:
    from hami_trio.broker.boundary import _flock_identities

    text = (
        "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234 0 EOF\n"  # a waiter: same lock
        "2: POSIX  ADVISORY  WRITE 99 08:02:77 0 EOF\n"  # fcntl locks are not flock
        "3: FLOCK  ADVISORY  READ 5 00:1a:9 0 EOF\n"
        "garbage\n"
        "4: FLOCK ADVISORY WRITE 1 zz:01:5 0 EOF\n"
    )
    assert _flock_identities(text) == {(os.makedev(0xFD, 1), 1234), (os.makedev(0, 0x1A), 9)}


def test_flock_held_sees_a_held_lock_and_never_takes_it(tmp_path: Path) -> None:
    from hami_trio.broker.boundary import flock_held

    lock = tmp_path / "broker.lock"
    lock.write_bytes(b"")
    assert not flock_held(lock)
    assert not flock_held(tmp_path / "missing")
    with open(lock, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert flock_held(lock)
        assert flock_held(lock)  # asking twice changed nothing: still held by us alone
    assert not flock_held(lock)
    assert not flock_held(lock, locks=tmp_path / "no-proc-locks")
