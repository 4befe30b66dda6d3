"""The MIG apply lock: is it there, in a directory only root (or the agent) controls?

How this works: HAMi's device plugin creates ``/tmp/hami/hami-mig-apply.lock`` while it
reconfigures MIG, and the monitor must not touch a region meanwhile.  Anyone who can write
to ``/tmp`` could make that directory first, so :func:`probe_mig_lock` checks it through
descriptors, following nothing, and refuses one that root or the agent does not control
(:class:`MigLockProblem`: a metric label and a message for operators) instead of letting
its owner pause the monitor at will.  :func:`prepare_mig_lock_dir` makes the directory at
start-up.

:class:`LockWatch` watches the checked directory with inotify so that the loop
(:mod:`~hami_trio.monitor.loop`) learns of a new lock between two ticks; the loop still
probes before every tick and every batch of writes, so a lost watch costs latency, never
safety.  Rules and recovery: docs/monitor.md (MIG pause), docs/security.md.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import inotify_simple
import trio

from hami_trio._fs import file_kind

__all__ = [
    "DEFAULT_MIG_LOCK_PATH",
    "MIG_LOCK_DIR_MODE",
    "MIG_LOCK_REASONS",
    "NO_DESCRIPTORS",
    "LockProbe",
    "LockWatch",
    "MigLockProblem",
    "MigLockReason",
    "prepare_mig_lock_dir",
    "probe_mig_lock",
]

logger = logging.getLogger(__name__)

#: Where HAMi's device plugin puts the lock while it applies a MIG configuration.
DEFAULT_MIG_LOCK_PATH = Path("/tmp/hami/hami-mig-apply.lock")
#: Why the MIG lock directory was refused (the ``reason`` label of
#: ``hami_trio_monitor_mig_lock_refusals_total``): its parent cannot be trusted (``parent``),
#: a symlink (``symlink``) or something other than a directory (``not-directory``) is at its
#: name, it belongs to a UID other than root or the agent's (``owner``), group or others can
#: write to it (``mode``), or a system call failed (``error``).
MigLockReason = Literal["parent", "symlink", "not-directory", "owner", "mode", "error"]
MIG_LOCK_REASONS: tuple[MigLockReason, ...] = get_args(MigLockReason)
#: The MIG lock directory's mode, as HAMi's device plugin creates it.
MIG_LOCK_DIR_MODE = 0o755
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class MigLockProblem:
    """Why the MIG lock directory is refused: a metric label and a message for operators."""

    reason: MigLockReason
    message: str


@dataclass(frozen=True, slots=True)
class LockProbe:
    """What one :func:`probe_mig_lock` found: the lock there or not, or why it was not
    looked for (the directory refused, or no descriptor to check with)."""

    present: bool
    problem: MigLockProblem | None = None
    #: Set when the check could not run for want of a descriptor (EMFILE, ENFILE): whether
    #: the lock exists is not known, which the monitor treats as "locked".
    unchecked: OSError | None = None


#: The errors that say "no descriptor to check with", not anything about the lock.
NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


def _trusted_uids() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def probe_mig_lock(lock_path: Path, *, create: bool = False) -> LockProbe:
    """Is the MIG lock there, in a directory that only root (or the agent) controls?

    Every step is relative to a descriptor, and nothing is followed:

    1. the directory's parent (``/tmp``) is opened ``O_PATH|O_DIRECTORY|O_NOFOLLOW``; it must
       belong to root or the agent's UID and, if group or others can write to it, be sticky
       (otherwise anyone could rename the directory away and put theirs in its place);
    2. the directory is opened relative to it with ``O_PATH|O_NOFOLLOW`` - a symlink is
       opened as itself, never followed - and ``fstat``-ed: a directory of root or the
       agent's UID that neither group nor others can write to (HAMi's device plugin and this
       agent create it with mode 0755).  With ``create``, a missing directory is made with
       ``mkdirat`` (mode 0755, restored with ``fchmod`` if the umask took bits away);
    3. the lock is ``fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW)``: whatever entry has that
       name counts, as in HAMi (only root can have made it there).

    An unsafe directory yields ``present=False`` with the problem: a directory someone else
    controls must neither pause the monitor nor be watched.  A missing parent, directory or
    lock is simply no lock.  Out of descriptors (EMFILE, ENFILE) the check has not run:
    ``unchecked`` holds the error and nothing is concluded.  Never raises ``OSError``.
    """
    directory = lock_path.parent
    trusted = _trusted_uids()
    try:
        parent_fd = os.open(directory.parent, _PATH_FLAGS | os.O_DIRECTORY)
    except FileNotFoundError:
        return LockProbe(False)
    except OSError as exc:
        if exc.errno in NO_DESCRIPTORS:
            return LockProbe(False, unchecked=exc)
        return _refused(
            "parent",
            f"cannot open its parent {directory.parent} without following "
            f"symlinks ({exc.strerror or exc})",
            directory,
        )
    try:
        st = os.fstat(parent_fd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in trusted:
            return _refused(
                "parent", f"its parent {directory.parent} is owned by UID {st.st_uid}", directory
            )
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return _refused(
                "parent",
                f"its parent {directory.parent} is writable by others (mode {mode:04o}) but "
                "not sticky",
                directory,
            )
        dir_fd = _open_lock_dir(parent_fd, directory.name, create)
        if dir_fd is None:
            return LockProbe(False)
        try:
            problem = _check_lock_dir(os.fstat(dir_fd), directory, trusted)
            if problem is not None:
                return LockProbe(False, problem)
            try:
                os.stat(lock_path.name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return LockProbe(False)
            return LockProbe(True)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        if exc.errno in NO_DESCRIPTORS:
            return LockProbe(False, unchecked=exc)
        return _refused("error", f"cannot check it ({exc.strerror or exc})", directory)
    finally:
        os.close(parent_fd)


def _refused(reason: MigLockReason, problem: str, directory: Path) -> LockProbe:
    recovery = (
        f"remove it (`rm -rf {directory}` as root after checking what it is); the agent "
        "recreates it root-owned with mode 0755 at its next tick"
    )
    if reason == "parent":
        recovery = f"make {directory.parent} root-owned and sticky (mode 1777, like /tmp)"
    elif reason == "error":
        recovery = "fix the cause above"
    return LockProbe(
        False,
        MigLockProblem(
            reason,
            f"MIG lock directory {directory} refused: {problem}; MIG locks in it are ignored "
            f"and the monitor keeps running; recovery: {recovery}",
        ),
    )


def _open_lock_dir(parent_fd: int, name: str, create: bool) -> int | None:
    try:
        return os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.mkdir(name, MIG_LOCK_DIR_MODE, dir_fd=parent_fd)
    except FileExistsError:
        pass  # raced: whatever is there now is opened without following and checked
    else:
        # Restore what the umask removed, through a descriptor of what we just made.
        made = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
        )
        try:
            if os.fstat(made).st_uid in _trusted_uids():
                os.fchmod(made, MIG_LOCK_DIR_MODE)
        finally:
            os.close(made)
    try:
        return os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None


def _check_lock_dir(
    st: os.stat_result, directory: Path, trusted: frozenset[int]
) -> MigLockProblem | None:
    refused: LockProbe | None = None
    if stat.S_ISLNK(st.st_mode):
        refused = _refused("symlink", "it is a symlink; it is never followed", directory)
    elif not stat.S_ISDIR(st.st_mode):
        refused = _refused(
            "not-directory", f"it is a {file_kind(st.st_mode)}, not a directory", directory
        )
    elif st.st_uid not in trusted:
        refused = _refused(
            "owner",
            f"it is owned by UID {st.st_uid}, not root or the agent's UID, so that user could "
            "pause the monitor at will",
            directory,
        )
    elif stat.S_IMODE(st.st_mode) & 0o022:
        refused = _refused(
            "mode",
            f"group or others can write to it (mode {stat.S_IMODE(st.st_mode):04o}), so they "
            "could pause the monitor at will",
            directory,
        )
    return None if refused is None else refused.problem


def prepare_mig_lock_dir(directory: Path) -> MigLockProblem | None:
    """Create the MIG lock directory with mode 0755 if it is missing (never fatal).

    Creation and checks go through descriptors (see :func:`probe_mig_lock`); its missing
    ancestors are created with ``os.makedirs``.  An existing safe directory is left as it is
    (HAMi's device plugin creates the same one).  Failures and an unsafe directory are
    logged: the monitor starts anyway, re-checks the directory every tick, and ignores locks
    in an unsafe one.

    Returns:
        The problem with the directory, or None when it is (now) safe or cannot be made.
    """
    try:
        os.makedirs(directory.parent, mode=0o755, exist_ok=True)
    except OSError as exc:
        logger.warning("cannot create MIG lock directory %s: %s", directory, exc)
        return None
    probe = probe_mig_lock(directory / DEFAULT_MIG_LOCK_PATH.name, create=True)
    if probe.problem is not None:
        logger.warning("%s", probe.problem.message, extra={"event": "mig_lock_dir_unsafe"})
    return probe.problem


_LOCK_EVENTS = (
    inotify_simple.flags.CREATE
    | inotify_simple.flags.DELETE
    | inotify_simple.flags.MOVED_FROM
    | inotify_simple.flags.MOVED_TO
    | inotify_simple.flags.DELETE_SELF
    | inotify_simple.flags.MOVE_SELF
)
_LOST_EVENTS = (
    inotify_simple.flags.IGNORED | inotify_simple.flags.DELETE_SELF | inotify_simple.flags.MOVE_SELF
)


class LockWatch:
    """inotify on the lock's directory; calls ``on_change`` for events about the lock.

    The watch is added through ``/proc/self/fd/N`` of a descriptor that :func:`probe_mig_lock`
    rules found safe, so it is on the directory that was checked, never on what a symlink at
    its name points to.  While the directory is unsafe there is no watch (the tick re-checks).
    """

    def __init__(self, path: Path, on_change: Callable[[], None]) -> None:
        self._path = path
        self._on_change = on_change
        self._inotify: inotify_simple.INotify | None = None
        self._warned = False

    def ensure(self) -> None:
        """Set up the watch if it is not (still) there; failures are logged once."""
        if self._inotify is not None:
            return
        probe = probe_mig_lock(self._path)
        if probe.problem is not None or probe.unchecked is not None:
            return
        try:
            fd = os.open(self._path.parent, _PATH_FLAGS | os.O_DIRECTORY)
        except FileNotFoundError:
            return  # not there (yet): the next check creates it, then we watch it
        except OSError as exc:
            self._warn(exc)
            return
        try:
            st = os.fstat(fd)
            if st.st_uid not in _trusted_uids() or stat.S_IMODE(st.st_mode) & 0o022:
                return  # changed since the probe: the next tick re-checks
            try:
                notify = inotify_simple.INotify(nonblocking=True)
            except OSError as exc:
                self._warn(exc)
                return
            try:
                notify.add_watch(f"/proc/self/fd/{fd}", _LOCK_EVENTS)
            except OSError as exc:
                notify.close()
                self._warn(exc)
                return
        finally:
            os.close(fd)
        self._inotify = notify

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "cannot watch %s with inotify (%s); checking the MIG lock once per tick",
                self._path.parent,
                exc.strerror or exc,
            )

    async def run(self) -> None:
        """Forward inotify events until cancelled; re-arms when the directory is replaced."""
        while True:
            notify = self._inotify
            if notify is None:
                await trio.sleep(1.0)
                self.ensure()
                continue
            await trio.lowlevel.wait_readable(notify.fileno())
            try:
                events = notify.read(timeout=0)
            except OSError as exc:  # pragma: no cover - reading a ready inotify fd
                logger.warning("inotify read failed: %s", exc)
                events = []
            # Removed, or renamed away (the watch would follow the old directory): re-arm on
            # whatever the name denotes now, after the probe has checked it.
            lost = any(event.mask & _LOST_EVENTS for event in events)
            if lost:
                self.close()
            if lost or any(event.name == self._path.name or not event.name for event in events):
                self._on_change()

    def close(self) -> None:
        notify, self._inotify = self._inotify, None
        if notify is not None:
            notify.close()
