"""The broker's filesystem boundary: lock directory and file, socket directory, socket path.

How this works: :func:`open_broker_socket` walks the objects in a fixed order - owner rule,
the lock's place (its own directory beside the socket's directory, never in what workloads
mount), the 0700 lock directory, ``broker.lock`` (``O_NOFOLLOW``, held with ``flock``), the
0711 socket directory, the socket path (a stale socket of ours is removed, a live one
refused), then bind (0666) and record the socket's identity - deciding each name relative to
an open directory descriptor.  Anything it did not create or cannot trust is refused with a
:class:`~hami_trio.errors.BrokerStartupError` naming the path and the reason; root may name
another expected UID and hands it what it creates.  Synchronous and bounded (a 50 ms probe);
modes are set explicitly, whatever the umask.  The table of rules: docs/security.md.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Final

from hami_trio._fs import file_kind
from hami_trio.errors import BrokerStartupError, ForeignBrokerError

__all__ = [
    "DEFAULT_LOCK_PATH",
    "DEFAULT_SOCKET_PATH",
    "DIR_MODE",
    "LEGACY_LOCK_NAME",
    "LOCK_DIR_MODE",
    "LOCK_DIR_SUFFIX",
    "LOCK_MODE",
    "LOCK_NAME",
    "PROBE_TIMEOUT",
    "SOCKET_MODE",
    "BrokerSocket",
    "default_lock_path",
    "expected_owner",
    "open_broker_socket",
]

logger = logging.getLogger(__name__)

#: Where the broker listens unless told otherwise (the chart mounts its directory).
DEFAULT_SOCKET_PATH: Final = Path("/var/run/hami/hostpid/broker.sock")
#: Name of the lock file in its own directory.
LOCK_NAME: Final = "broker.lock"
#: The lock directory's name is the socket directory's name with this suffix, beside it.
LOCK_DIR_SUFFIX: Final = "-lock"
#: Where the default broker keeps its lock: beside the socket's directory, which workloads
#: mount, never in it (the chart mounts this directory into the agent only).
DEFAULT_LOCK_PATH: Final = Path("/var/run/hami/hostpid-lock/broker.lock")
#: The lock file earlier versions kept in the socket's directory (removed when found).
LEGACY_LOCK_NAME: Final = "broker.lock"
#: Mode of the socket's directory: the owner writes, everyone may only traverse.
DIR_MODE: Final = 0o711
#: Mode of the lock's directory: nobody but its owner may even look inside.
LOCK_DIR_MODE: Final = 0o700
#: Mode of the socket: every workload UID may connect.
SOCKET_MODE: Final = 0o666
#: Mode of the lock file.
LOCK_MODE: Final = 0o600
#: How long the live-socket probe waits for a connect (seconds).
PROBE_TIMEOUT: Final = 0.05
#: Mode of directories created above the socket's directory when they are missing.
_ANCESTOR_MODE: Final = 0o755


def _refuse(path: Path | str, reason: str) -> BrokerStartupError:
    return BrokerStartupError(f"{path}: {reason}")


def _is_default(path: Path) -> bool:
    # /var/run is usually a symlink to /run; either spelling is the default location.
    if path == DEFAULT_SOCKET_PATH:
        return True
    return os.path.realpath(path) == os.path.realpath(DEFAULT_SOCKET_PATH)


def default_lock_path(socket_path: Path | str) -> Path:
    """The lock file for a socket: ``<socket dir>-lock/broker.lock``, beside the socket's dir.

    ``/var/run/hami/hostpid/broker.sock`` gives :data:`DEFAULT_LOCK_PATH`.
    """
    directory = Path(os.path.abspath(socket_path)).parent
    return directory.with_name(directory.name + LOCK_DIR_SUFFIX) / LOCK_NAME


def _check_apart(socket_dir: Path, lock_dir: Path) -> None:
    """Refuse a lock directory that is, contains or lies inside the socket's directory."""
    real_socket, real_lock = Path(os.path.realpath(socket_dir)), Path(os.path.realpath(lock_dir))
    for sock_form, lock_form in ((socket_dir, lock_dir), (real_socket, real_lock)):
        if lock_form == sock_form:
            reason = "is the socket's directory"
        elif lock_form.is_relative_to(sock_form):
            reason = f"lies inside the socket's directory {sock_form}"
        elif sock_form.is_relative_to(lock_form):
            reason = f"contains the socket's directory {sock_form}"
        else:
            continue
        raise _refuse(
            lock_dir,
            f"lock directory {reason}, which workloads mount: any of them could hold the "
            "lock; put the lock beside the socket's directory",
        )


def expected_owner(socket_path: Path, *, euid: int, expected_uid: int | None = None) -> int:
    """Decide which UID must own the broker's directory, lock and socket.

    Args:
        socket_path: absolute socket path.
        euid: the effective UID the broker runs as.
        expected_uid: an explicit owner, or ``None`` for the rule (root for the default path,
            ``euid`` otherwise).

    Returns:
        The expected owner UID.

    Raises:
        BrokerStartupError: the default path without euid 0, the default path with an owner
            other than root, or a non-root broker asked to create files for another UID.
    """
    default = _is_default(socket_path)
    if default and euid != 0:
        raise _refuse(socket_path, f"the default socket path requires euid 0, running as {euid}")
    owner = expected_uid if expected_uid is not None else (0 if default else euid)
    if owner < 0:
        raise _refuse(socket_path, f"expected owner uid {owner} is negative")
    if default and owner != 0:
        raise _refuse(socket_path, f"the default socket path must be owned by root, not {owner}")
    if owner != euid and euid != 0:
        raise _refuse(
            socket_path,
            f"expected owner uid {owner} but running as euid {euid}: only root can create "
            "files for another uid",
        )
    return owner


class BrokerSocket:
    """The listening socket with the directory and lock that guard it.

    Made by :func:`open_broker_socket`.  ``listener`` is a non-blocking ``AF_UNIX`` stream
    socket, already listening.  :meth:`close_listener` stops accepting and removes the socket
    path if it is still ours; :meth:`close` also releases the lock.  Both are idempotent.
    """

    def __init__(
        self,
        path: Path,
        listener: socket.socket,
        identity: tuple[int, int],
        owner: int,
        dir_fd: int,
        lock_fd: int,
        lock_path: Path | None = None,
    ) -> None:
        self.path: Final = path
        #: The lock file this broker holds (beside the socket's directory).
        self.lock_path: Final = lock_path if lock_path is not None else default_lock_path(path)
        self.listener: Final = listener
        #: ``(st_dev, st_ino)`` of the socket file right after bind.
        self.identity: Final = identity
        #: The UID that owns the directory, lock and socket.
        self.owner: Final = owner
        self._dir_fd: int | None = dir_fd
        self._lock_fd: int | None = lock_fd
        self._listening = True

    def is_ours(self) -> bool:
        """Whether the socket path still names the socket this broker bound."""
        if self._dir_fd is None:
            return False
        try:
            st = os.lstat(self.path.name, dir_fd=self._dir_fd)
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self.identity

    def close_listener(self) -> None:
        """Stop accepting (queued connections are reset) and unlink the path if still ours.

        Raises:
            OSError: the unlink failed (for example the directory became read-only).
        """
        if not self._listening:
            return
        self._listening = False
        self.listener.close()
        if self._dir_fd is not None:
            # Only the directory's owner can rename something into place between the check
            # and the unlink, and that is the broker's own UID: acceptable.
            _unlink_if_identity(self._dir_fd, self.path.name, self.identity)

    def close(self) -> None:
        """:meth:`close_listener`, then release the lock and the directory descriptor."""
        try:
            self.close_listener()
        finally:
            for name in ("_lock_fd", "_dir_fd"):
                fd = getattr(self, name)
                if fd is not None:
                    setattr(self, name, None)
                    os.close(fd)  # closing the lock's descriptor releases the flock


def _ensure_ancestors(directory: Path) -> None:
    """Create missing directories above the socket's directory (mode 0755)."""
    missing: list[Path] = []
    for ancestor in directory.parents:
        if os.path.lexists(ancestor):
            break
        missing.append(ancestor)
    for ancestor in reversed(missing):
        try:
            os.mkdir(ancestor, _ANCESTOR_MODE)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _refuse(ancestor, f"cannot create directory: {exc.strerror}") from exc
        os.chmod(ancestor, _ANCESTOR_MODE)


def _open_directory(directory: Path, owner: int, euid: int, mode: int = DIR_MODE) -> int:
    """Create or check the socket's (or lock's) directory; return a descriptor.

    The directory gets ``mode`` (0711 for the socket's, 0700 for the lock's).
    """
    _ensure_ancestors(directory)
    created = False
    try:
        os.mkdir(directory, mode)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise _refuse(directory, f"cannot create directory: {exc.strerror}") from exc
    try:
        before = os.lstat(directory)
    except OSError as exc:
        raise _refuse(directory, f"cannot stat directory: {exc.strerror}") from exc
    if stat.S_ISLNK(before.st_mode):
        raise _refuse(directory, "directory is a symlink")
    if not stat.S_ISDIR(before.st_mode):
        raise _refuse(directory, f"not a directory but a {file_kind(before.st_mode)}")
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(directory, "directory was replaced while being checked") from exc
        raise _refuse(directory, f"cannot open directory: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise _refuse(directory, "directory was replaced while being checked")
        if created and owner != euid:
            os.fchown(fd, owner, -1)
            st = os.fstat(fd)
        if st.st_uid != owner:
            raise _refuse(directory, f"directory is owned by uid {st.st_uid}, expected {owner}")
        if stat.S_IMODE(st.st_mode) != mode:
            try:
                os.fchmod(fd, mode)
            except OSError as exc:
                raise _refuse(directory, f"cannot set mode {mode:04o}: {exc.strerror}") from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


def _acquire_lock(dir_fd: int, path: Path, owner: int, euid: int) -> int:
    """Open, check and ``flock`` the lock file ``path`` in ``dir_fd``; return its fd."""
    name = path.name
    # O_NONBLOCK: never hang on a FIFO planted at the lock path; it is refused below anyway.
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    created = False
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, LOCK_MODE, dir_fd=dir_fd)
            created = True
        except FileExistsError:
            fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "lock file is a symlink") from exc
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise _refuse(path, "lock file is not a regular file") from exc
        raise _refuse(path, f"cannot open lock file: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, f"lock file is a {file_kind(st.st_mode)}, not a regular file")
        if created:
            if owner != euid:
                os.fchown(fd, owner, -1)
            os.fchmod(fd, LOCK_MODE)
            st = os.fstat(fd)
        if st.st_uid != owner:
            raise _refuse(path, f"lock file is owned by uid {st.st_uid}, expected {owner}")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise _refuse(
                path,
                f"lock file mode {stat.S_IMODE(st.st_mode):04o} grants group/other access, "
                f"expected {LOCK_MODE:04o}",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ForeignBrokerError(f"{path}: lock is held: another broker is running") from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


def flock_held(path: Path, locks: Path = Path("/proc/locks")) -> bool:
    """Whether some process holds a ``flock`` on ``path``, read from ``/proc/locks`` without
    touching the lock (taking it, even for a moment, could make its owner's start fail).

    False when the file or ``/proc/locks`` cannot be read.
    """
    try:
        st = os.stat(path, follow_symlinks=False)
        text = locks.read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in _flock_identities(text)


def _flock_identities(text: str) -> set[tuple[int, int]]:
    """``(st_dev, st_ino)`` of every FLOCK in a ``/proc/locks`` text (``MAJ:MIN:INODE``, the
    device numbers in hexadecimal); lines of another shape are skipped."""
    found: set[tuple[int, int]] = set()
    for line in text.splitlines():
        fields = line.split()
        if "FLOCK" not in fields[:3] or "->" in fields:
            continue
        for field in fields:
            parts = field.split(":")
            if len(parts) == 3:
                try:
                    major, minor, inode = int(parts[0], 16), int(parts[1], 16), int(parts[2])
                except ValueError:
                    continue
                found.add((os.makedev(major, minor), inode))
                break
    return found


def _is_live(path: Path) -> bool:
    """Connect to an existing socket for at most :data:`PROBE_TIMEOUT` seconds.

    Returns:
        True if a server listens there (connected, or its backlog is full), False if the
        socket is stale (connection refused) or vanished.

    Raises:
        BrokerStartupError: the probe failed in a way that proves neither.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except (BlockingIOError, TimeoutError):
        return True  # somebody listens but does not accept fast enough: not stale
    except OSError as exc:
        raise _refuse(path, f"cannot probe existing socket: {exc.strerror}") from exc
    finally:
        probe.close()
    return True


def _clear_socket_path(dir_fd: int, path: Path, owner: int) -> None:
    """Refuse what must not be replaced at the socket path; remove a stale socket."""
    try:
        st = os.lstat(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise _refuse(
            path, f"path is a {file_kind(st.st_mode)}, not a socket; refusing to replace it"
        )
    if st.st_uid != owner:
        raise _refuse(path, f"socket is owned by uid {st.st_uid}, expected {owner}")
    if _is_live(path):
        hami = path.parent / LEGACY_LOCK_NAME
        owner_note = f" (HAMi's own broker: it holds {hami})" if flock_held(hami) else ""
        raise ForeignBrokerError(
            f"{path}: socket is live: another server is listening on it{owner_note}"
        )
    try:
        os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _refuse(path, f"cannot remove stale socket: {exc.strerror}") from exc


def _remove_legacy_lock(dir_fd: int, directory: Path, owner: int, lock_path: Path) -> None:
    """Remove the ``broker.lock`` an earlier version left in the socket's directory.

    Only a regular file of the expected owner is removed: anything else there is not ours
    and is left alone.  Either way it no longer matters - this version never opens it.  The
    directory is the owner's (0711), so nobody else can swap the name between the check and
    the unlink.  A failure is logged, never fatal.
    """
    legacy = directory / LEGACY_LOCK_NAME
    try:
        st = os.lstat(LEGACY_LOCK_NAME, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        logger.warning("cannot check %s (ignored): %s", legacy, exc.strerror)
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
        logger.warning(
            "%s is a %s of uid %d, not an earlier version's lock: left alone (it is not used)",
            legacy,
            file_kind(st.st_mode),
            st.st_uid,
        )
        return
    try:
        os.unlink(LEGACY_LOCK_NAME, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        logger.warning("cannot remove the earlier version's lock %s: %s", legacy, exc.strerror)
        return
    logger.info(
        "removed %s, an earlier version's lock that workloads could reach; the lock is %s",
        legacy,
        lock_path,
    )


def _bind(
    dir_fd: int, path: Path, owner: int, euid: int, backlog: int
) -> tuple[socket.socket, tuple[int, int]]:
    """Bind, set modes, record the identity and listen; return the socket and identity."""
    listener = socket.socket(
        socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    )
    bound: tuple[int, int] | None = None
    try:
        try:
            listener.bind(str(path))
        except OSError as exc:
            raise _refuse(path, f"cannot bind: {exc.strerror or exc}") from exc
        st = os.lstat(path.name, dir_fd=dir_fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise _refuse(path, "socket path was replaced right after bind")
        bound = (st.st_dev, st.st_ino)
        # The socket file is created with 0777 & ~umask; the directory is ours, so the name
        # cannot be swapped between bind and these calls by anyone but its owner.
        os.chmod(path.name, SOCKET_MODE, dir_fd=dir_fd)
        if owner != euid:
            os.chown(path.name, owner, -1, dir_fd=dir_fd, follow_symlinks=False)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        if bound is not None:
            _unlink_if_identity(dir_fd, path.name, bound)
        raise
    return listener, bound


def _unlink_if_identity(dir_fd: int, name: str, identity: tuple[int, int]) -> bool:
    """Unlink ``name`` if it is a socket with ``identity``; tell whether it did."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or (st.st_dev, st.st_ino) != identity:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def open_broker_socket(
    socket_path: Path | str,
    *,
    lock_path: Path | str | None = None,
    expected_uid: int | None = None,
    backlog: int = socket.SOMAXCONN,
) -> BrokerSocket:
    """Set up the lock, the directory and the listening socket, refusing anything unsafe.

    Args:
        socket_path: where to listen; made absolute.
        lock_path: the lock file, or ``None`` for :func:`default_lock_path` (beside the
            socket's directory); its directory must be neither the socket's directory nor
            inside or above it.
        expected_uid: owner to require, or ``None`` for the default rule (root for the default
            path, the current euid otherwise).
        backlog: ``listen()`` backlog (the kernel caps it at ``net.core.somaxconn``).

    Returns:
        The listening socket and the lock; call :meth:`BrokerSocket.close` when done.

    Raises:
        BrokerStartupError: any refusal of the owner, directory, lock or socket checks
            above, or of the lock's place, naming the
            path and the reason.  Nothing the broker did not create is changed or removed,
            except a stale socket of the expected owner, an earlier version's lock file of
            that owner in the socket's directory and the mode of a directory that owner
            already owns.
    """
    path = Path(os.path.abspath(socket_path))
    lock = Path(os.path.abspath(lock_path if lock_path is not None else default_lock_path(path)))
    euid = os.geteuid()
    owner = expected_owner(path, euid=euid, expected_uid=expected_uid)
    _check_apart(path.parent, lock.parent)
    lock_dir_fd = _open_directory(lock.parent, owner, euid, LOCK_DIR_MODE)
    try:
        lock_fd = _acquire_lock(lock_dir_fd, lock, owner, euid)
        try:
            dir_fd = _open_directory(path.parent, owner, euid)
            try:
                lock_dir_st, dir_st = os.fstat(lock_dir_fd), os.fstat(dir_fd)
                if (lock_dir_st.st_dev, lock_dir_st.st_ino) == (dir_st.st_dev, dir_st.st_ino):
                    raise _refuse(
                        lock.parent,
                        "lock directory is the socket's directory under another name, which "
                        "workloads mount: any of them could hold the lock",
                    )
                _clear_socket_path(dir_fd, path, owner)
                _remove_legacy_lock(dir_fd, path.parent, owner, lock)
                listener, identity = _bind(dir_fd, path, owner, euid, backlog)
            except BaseException:
                os.close(dir_fd)
                raise
        except BaseException:
            os.close(lock_fd)
            raise
    finally:
        os.close(lock_dir_fd)
    return BrokerSocket(path, listener, identity, owner, dir_fd, lock_fd, lock)
