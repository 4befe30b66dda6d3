"""Prepare the shared lock parent ``/tmp/vgpulock``: root-owned, mode 01777, no tricks.

How this works: every HAMi-core workload mounts the host's ``/tmp/vgpulock`` writable, and
anyone who can write to the host's ``/tmp`` may plant a symlink or a foreign directory there
or swap it while the device plugin (root) works.  So :func:`prepare_lock_parent` does every
step relative to a descriptor (``O_NOFOLLOW`` opens, owner and sticky-bit checks,
``mkdirat``, ``fchmod`` 01777, a check that the descriptor and the name denote the same
directory) and, with the broker on, prepares the nested ``hostpid`` mount point the same way
and makes it immutable; :func:`prepare_lock_dir` says why where that flag cannot be set.
Every refusal is a :class:`LockParentRefused` naming the path, the reason and the recovery,
counted in :data:`LOCK_PARENT_REFUSALS`; ``repair=True`` is the operator's explicit fix,
:func:`inspect_lock_parent` the agent's read-only check.  The steps, the attacks they stop
and the repair: docs/allocation.md.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, get_args

from prometheus_client import Counter

from hami_trio._fs import file_kind
from hami_trio.allocation.constants import LOCK_PARENT, go_clean
from hami_trio.errors import LockDirError

__all__ = [
    "FS_IMMUTABLE_FL",
    "IMMUTABLE_PROBLEMS",
    "LOCK_PARENT_MODE",
    "LOCK_PARENT_REFUSALS",
    "MOUNT_POINT_MODE",
    "MOUNT_POINT_NAME",
    "MOUNT_POINT_NOT_IMMUTABLE",
    "REFUSAL_REASONS",
    "ImmutableProblem",
    "LockParentRefused",
    "LockParentState",
    "MountPointState",
    "Prepared",
    "RefusalReason",
    "Step",
    "flag_problem",
    "inspect_lock_parent",
    "prepare_lock_dir",
    "prepare_lock_parent",
    "repair_command",
]

logger = logging.getLogger(__name__)

#: The only acceptable final mode: world-writable (every workload UID creates lock files)
#: and sticky (nobody can delete or rename another user's entry).
LOCK_PARENT_MODE = 0o1777

#: The nested mount point of the broker's read-only mount (``/tmp/vgpulock/hostpid``).
MOUNT_POINT_NAME: Final = "hostpid"
#: Its mode: root's directory, nobody else may create entries in it.
MOUNT_POINT_MODE: Final = 0o755

#: The inode flag ``chattr +i`` sets (``FS_IMMUTABLE_FL``, linux/fs.h).  On the mount point it
#: makes rename, rmdir, a rename over it, creating inside it, chmod and chown fail with EPERM
#: for everyone without CAP_LINUX_IMMUTABLE (which the container runtime does not grant), so a
#: root workload holding only the parent mount can no longer swap ``hostpid`` for a symlink.
#: Mounting over it still works.
FS_IMMUTABLE_FL: Final = 0x00000010


def _ioc(direction: int, number: int) -> int:
    # _IOR/_IOW('f', number, long) with the asm-generic layout (x86, arm, riscv): the size
    # in the number is sizeof(long), although the kernel reads and writes an int.
    return (direction << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | number


_FS_IOC_GETFLAGS: Final = _ioc(2, 1)
_FS_IOC_SETFLAGS: Final = _ioc(1, 2)
_FLAGS = struct.Struct("i")
#: The ioctl call; tests replace it to inject an error.
_ioctl: Callable[[int, int, bytes], bytes] = fcntl.ioctl

#: Why the mount point is not immutable after a preparation (the ``reason`` label):
#:
#: - ``unsupported``: the filesystem has no inode flags (ENOTTY, EOPNOTSUPP: ramfs, some
#:   overlay or network filesystems);
#: - ``denied``: not allowed (EPERM, EACCES: the process lacks CAP_LINUX_IMMUTABLE);
#: - ``read-only``: the lock parent is mounted read-only here (EROFS);
#: - ``error``: another error of the flag ioctls.
ImmutableProblem = Literal["unsupported", "denied", "read-only", "error"]
IMMUTABLE_PROBLEMS: Final[tuple[ImmutableProblem, ...]] = get_args(ImmutableProblem)

#: The nested mount point's state after a preparation or a check: ``off`` (the broker is
#: off, ``hostpid`` not looked at), ``immutable``, or why not; the read-only check also
#: reports ``missing`` and ``not-set`` (a directory without the flag).
MountPointState = Literal["off", "missing", "immutable", "not-set", ImmutableProblem]

_EXPLAIN: Final[dict[ImmutableProblem, str]] = {
    "unsupported": "the filesystem does not support inode flags",
    "denied": "this process lacks CAP_LINUX_IMMUTABLE",
    "read-only": "the lock parent is mounted read-only here",
    "error": "the flag ioctl failed",
}


def flag_problem(exc: OSError) -> ImmutableProblem:
    """Why an ``FS_IOC_GETFLAGS``/``FS_IOC_SETFLAGS`` error leaves the flag unset."""
    if exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return "unsupported"
    if exc.errno in (errno.EPERM, errno.EACCES):
        return "denied"
    if exc.errno == errno.EROFS:
        return "read-only"
    return "error"


#: Preparations that left the mount point without the immutable flag, by reason (default
#: registry, like :data:`LOCK_PARENT_REFUSALS`).  The allocation goes on with the checks alone.
MOUNT_POINT_NOT_IMMUTABLE: Final = Counter(
    "hami_trio_lock_mount_point_not_immutable_total",
    "Preparations with the broker on that could not make the nested mount point "
    "/tmp/vgpulock/hostpid immutable, by reason; a root workload can then still swap it.",
    ["reason"],
)
for _problem in IMMUTABLE_PROBLEMS:
    MOUNT_POINT_NOT_IMMUTABLE.labels(reason=_problem)

#: The points between steps at which a test hook runs (see ``prepare_lock_parent``).
Step = Literal[
    "parent-checked",
    "created",
    "opened",
    "chmodded",
    "mount-point-opened",
    "mount-point-checked",
]

#: Why a lock parent was refused (the ``reason`` label of the refusal metrics):
#:
#: - ``path``: the configured path is unusable (relative, ``/``, contains ``..``);
#: - ``parent``: its parent (``/tmp``) cannot be opened safely, has the wrong owner, or is
#:   writable by others without the sticky bit;
#: - ``symlink`` / ``not-directory``: a symlink or a non-directory sits at the name;
#: - ``owner``: the directory belongs to another UID (e.g. a root workload chowned it);
#: - ``mode``: its mode is not 01777 (the read-only check) or could not be made so;
#: - ``replaced``: the name was swapped or removed while it was prepared;
#: - ``mount-point``: with the broker on, ``hostpid`` inside it is not a directory of the
#:   trusted UID (a planted symlink, file or foreign directory);
#: - ``error``: another system call failed (the message has the errno text).
RefusalReason = Literal[
    "path",
    "parent",
    "symlink",
    "not-directory",
    "owner",
    "mode",
    "replaced",
    "mount-point",
    "error",
]
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = get_args(RefusalReason)

#: Refusals of :func:`prepare_lock_parent` in this process, by reason.  Registered in
#: prometheus-client's default registry, so a Python device plugin that serves it (for example
#: with ``prometheus_client.start_http_server``) exposes it without further code.  Alert on
#: ``increase(hami_trio_lock_parent_refusals_total[10m]) > 0``: allocations are failing.
LOCK_PARENT_REFUSALS: Final = Counter(
    "hami_trio_lock_parent_refusals_total",
    "Times preparing the shared lock parent (/tmp/vgpulock) was refused, by reason; each "
    "refusal failed one allocation or one prepare-lock-dir run.",
    ["reason"],
)
for _reason in REFUSAL_REASONS:
    LOCK_PARENT_REFUSALS.labels(reason=_reason)


class LockParentRefused(LockDirError):
    """The lock parent is unsafe; the message names the path, the reason and the recovery.

    Attributes:
        path: the cleaned path of the lock parent.
        reason: one of :data:`REFUSAL_REASONS` (the metric label).
        recovery: what the operator should do, with the exact command where there is one.
    """

    def __init__(self, path: str, reason: RefusalReason, problem: str, recovery: str) -> None:
        super().__init__(f"{path}: {problem}; {recovery}")
        self.path = path
        self.reason = reason
        self.recovery = recovery


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def repair_command(path: str, *, owner: int = 0, broker: bool = False) -> str:
    """The exact ``hami-trio prepare-lock-dir --repair`` command line for ``path``."""
    parts = ["hami-trio prepare-lock-dir --repair"]
    if broker:
        parts.append("--broker")
    if owner != 0:
        parts.append(f"--owner {owner}")
    parts.append(path)
    return " ".join(parts)


class _Context:
    """What every refusal message needs: the path, the trusted UID and the broker switch."""

    def __init__(self, full: str, parent: str, owner: int, broker: bool) -> None:
        self.full = full
        self.parent = parent
        self.owner = owner
        self.broker = broker

    @property
    def repair(self) -> str:
        return f"run `{repair_command(self.full, owner=self.owner, broker=self.broker)}` as root"

    def refuse(self, reason: RefusalReason, problem: str, recovery: str) -> LockParentRefused:
        return LockParentRefused(self.full, reason, problem, recovery)

    def refuse_owner(self, uid: int) -> LockParentRefused:
        return self.refuse(
            "owner",
            f"is owned by UID {uid}, not the trusted UID {self.owner}; refusing to chmod or "
            "mount a directory someone else controls",
            f"recovery: {self.repair} on the node (it restores owner and mode in place, "
            "through the opened directory; running workloads keep their mount)",
        )

    def refuse_entry(self, found: str, exc: OSError | None) -> LockParentRefused:
        why = f" ({_oserror(exc)})" if exc is not None else ""
        reason: RefusalReason = "symlink" if found == "a symlink" else "not-directory"
        return self.refuse(
            reason,
            f"is {found}, not a directory; refusing to follow or use it{why}",
            "recovery: a workload cannot put this there through its mount, someone with write "
            f"access to {self.parent} on the host did; inspect it, remove the entry itself "
            f"with `unlink {self.full}` (for a symlink this leaves its target alone), then run "
            f"`hami-trio prepare-lock-dir {self.full}`; --repair never follows or removes it",
        )

    def refuse_parent(self, problem: str) -> LockParentRefused:
        return self.refuse(
            "parent",
            problem,
            f"recovery: make {self.parent} a real directory owned by UID {self.owner} with "
            "mode 1777 (like /tmp); hami-trio never changes the parent, --repair included",
        )

    def refuse_error(self, problem: str) -> LockParentRefused:
        return self.refuse(
            "error", problem, f"recovery: fix the cause above, then {self.repair} or retry"
        )

    def refuse_race(self, reason: RefusalReason, problem: str) -> LockParentRefused:
        return self.refuse(
            reason,
            problem,
            "someone changed it while it was prepared; retry, and if it recurs find the "
            f"process that changes {self.full} (`fuser -v {self.full}`, workloads running as "
            f"root with CAP_CHOWN/CAP_FOWNER), then {self.repair}",
        )


def _describe(st: os.stat_result) -> str:
    """A short human name for what a stat describes (for refusal messages)."""
    return f"a {file_kind(st.st_mode)}"


def _what_is(lstat: Callable[[], os.stat_result]) -> str:
    try:
        return _describe(lstat())
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({_oserror(exc)})"


def _split(path: str) -> tuple[str, str]:
    def refuse(problem: str) -> LockParentRefused:
        return LockParentRefused(
            path, "path", problem, "recovery: configure an absolute path such as /tmp/vgpulock"
        )

    if not path.startswith("/"):
        raise refuse(f"{path!r}: the lock parent must be an absolute path")
    if ".." in path.split("/"):
        # The kernel resolves ".." after symlinks, go_clean before them: the two can disagree
        # about which directory is meant, so such a path is ambiguous and refused.
        raise refuse(f"{path!r}: the lock parent path must not contain '..'")
    clean = go_clean(path)
    if clean == "/":
        raise refuse(f"{path!r}: the lock parent cannot be the root directory")
    parent, _, name = clean.rpartition("/")
    return parent or "/", name


def _oserror(exc: OSError) -> str:
    return exc.strerror or str(exc)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :func:`prepare_lock_dir` made.

    Attributes:
        path: the cleaned path that was prepared: the host path to mount.
        mount_point: ``off`` (broker off), ``immutable``, or why ``hostpid`` could not be made
            immutable (one of :data:`IMMUTABLE_PROBLEMS`; the preparation still succeeded).
        problem: for a problem, the path, the errno text and what it leaves open; else "".
    """

    path: str
    mount_point: MountPointState = "off"
    problem: str = ""


def prepare_lock_parent(
    path: str = LOCK_PARENT,
    owner: int = 0,
    *,
    broker: bool = False,
    repair: bool = False,
    step_hook: Callable[[Step], None] | None = None,
) -> str:
    """Create or fix the lock parent as a directory owned by ``owner`` with mode 01777.

    :func:`prepare_lock_dir` returning only the path; see there.
    """
    return prepare_lock_dir(path, owner, broker=broker, repair=repair, step_hook=step_hook).path


#: The last mount point state logged per path, so a lasting problem is one log line.
_logged: dict[str, MountPointState] = {}


def prepare_lock_dir(
    path: str = LOCK_PARENT,
    owner: int = 0,
    *,
    broker: bool = False,
    repair: bool = False,
    step_hook: Callable[[Step], None] | None = None,
) -> Prepared:
    """Create or fix the lock parent as a directory owned by ``owner`` with mode 01777.

    Idempotent: an already correct directory is left as it is.  See the module docstring for
    the steps and the attack each one stops.  Every refusal is counted in
    :data:`LOCK_PARENT_REFUSALS` by reason.

    Args:
        path: the lock parent, absolute (``/tmp/vgpulock``); it is cleaned like Go's
            ``path.Clean`` and split into parent and name.
        owner: the trusted UID that must own both the parent and the directory (root in
            production; tests use their own UID for trees under a temporary directory).
        broker: the host PID broker is on: also make sure the nested mount point
            ``hostpid`` inside it is a directory of ``owner`` with mode 0755 and the
            immutable flag (set through its descriptor when missing).  Where the flag cannot
            be set the preparation still succeeds: the result says why, it is counted in
            :data:`MOUNT_POINT_NOT_IMMUTABLE` and logged once per path and reason.
        repair: the operator's explicit repair (``prepare-lock-dir --repair``): a directory
            of another owner is given back to ``owner`` through the opened descriptor
            (``fchown``) instead of being refused, and with ``broker`` a symlink or file
            planted at ``hostpid`` is removed (``unlinkat`` relative to the directory, never
            followed) and replaced by the directory, and an immutable ``hostpid`` with the
            wrong owner or mode has the flag cleared, is fixed and flagged again.  A symlink
            or non-directory at the lock parent's own name and an unsafe parent are still
            refused.
        step_hook: for tests only - called with the name of each completed step
            (``parent-checked``, ``created``, ``opened``, ``chmodded``, and with ``broker``
            ``mount-point-opened`` and ``mount-point-checked``) so a test can swap things in
            between.

    Returns:
        The cleaned path that was prepared (``/tmp//vgpulock/`` gives ``/tmp/vgpulock``) and
        the mount point's state.

    Raises:
        LockParentRefused: (a :class:`~hami_trio.errors.LockDirError`) the path is relative,
            ``/`` or contains ``..``; the parent cannot be opened, is a symlink, has the wrong
            owner, or is writable by others without the sticky bit; the name is a symlink,
            not a directory or has the wrong owner (without ``repair``); the nested mount
            point is unsafe (without ``repair``); a system call failed; or the name no longer
            denotes the prepared directory at the end.  The message names the path, the
            reason and the recovery (the exact command); ``reason`` is the metric label and an
            ``OSError`` cause is chained.
    """
    try:
        prepared = _prepare(path, owner, broker, repair, step_hook)
    except LockParentRefused as exc:
        LOCK_PARENT_REFUSALS.labels(reason=exc.reason).inc()
        raise
    state = prepared.mount_point
    if state in IMMUTABLE_PROBLEMS:
        MOUNT_POINT_NOT_IMMUTABLE.labels(reason=state).inc()
    if _logged.get(prepared.path, "immutable") != state and state != "off":
        if prepared.problem:
            logger.warning(
                "%s",
                prepared.problem,
                extra={"event": "lock_mount_point_not_immutable", "reason": state},
            )
        else:
            logger.info(
                "nested mount point %s/%s is immutable again", prepared.path, MOUNT_POINT_NAME
            )
    if state != "off":
        _logged[prepared.path] = state
    return prepared


def _prepare(
    path: str,
    owner: int,
    broker: bool,
    repair: bool,
    step_hook: Callable[[Step], None] | None,
) -> Prepared:
    parent, name = _split(path)
    full = f"{parent.rstrip('/')}/{name}"
    ctx = _Context(full, parent, owner, broker)
    try:
        parent_fd = os.open(parent, _DIR_FLAGS)
    except OSError as exc:
        # lstat only to word the message; nothing is decided on a path-based lookup.
        found = _what_is(lambda: os.lstat(parent))
        raise ctx.refuse_parent(
            f"cannot open parent {parent} without following symlinks: it is {found} "
            f"({_oserror(exc)})"
        ) from exc
    try:
        _check_parent(os.fstat(parent_fd), ctx)
        if step_hook is not None:
            step_hook("parent-checked")
        try:
            os.mkdir(name, LOCK_PARENT_MODE, dir_fd=parent_fd)
        except FileExistsError:
            pass  # Whatever is there is opened without following links and checked below.
        except OSError as exc:
            raise ctx.refuse_error(f"cannot create directory: {_oserror(exc)}") from exc
        if step_hook is not None:
            step_hook("created")
        fd = _open_dir(parent_fd, name, ctx)
        try:
            state, problem = _prepare_opened(parent_fd, fd, name, ctx, repair, step_hook)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)
    return Prepared(full, state, problem)


def _check_parent(st: os.stat_result, ctx: _Context) -> None:
    if st.st_uid != ctx.owner:
        raise ctx.refuse_parent(
            f"parent {ctx.parent} is owned by UID {st.st_uid}, not the trusted UID {ctx.owner}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise ctx.refuse_parent(
            f"parent {ctx.parent} is writable by group or others (mode {mode:04o}) "
            "but not sticky, so anyone could replace the lock directory"
        )


def _open_dir(parent_fd: int, name: str, ctx: _Context) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        # Say what is in the way (symlink, file, ...) rather than just ELOOP/ENOTDIR.
        found = _what_is(lambda: os.stat(name, dir_fd=parent_fd, follow_symlinks=False))
        if found == "a directory":
            raise ctx.refuse_error(f"cannot open directory: {_oserror(exc)}") from exc
        raise ctx.refuse_entry(found, exc) from exc


def _prepare_opened(
    parent_fd: int,
    fd: int,
    name: str,
    ctx: _Context,
    repair: bool,
    step_hook: Callable[[Step], None] | None,
) -> tuple[MountPointState, str]:
    if step_hook is not None:
        step_hook("opened")
    opened = os.fstat(fd)
    if not stat.S_ISDIR(opened.st_mode):  # O_DIRECTORY makes this impossible; belt and braces
        raise ctx.refuse_entry(_describe(opened), None)
    if opened.st_uid != ctx.owner:
        if not repair:
            raise ctx.refuse_owner(opened.st_uid)
        # The object we opened and checked (a real directory, reached without following a
        # link), never whatever the name points to now.
        try:
            os.fchown(fd, ctx.owner, os.getegid())
        except OSError as exc:
            raise ctx.refuse_error(
                f"cannot give the directory back to UID {ctx.owner}: {_oserror(exc)}"
            ) from exc
    try:
        os.fchmod(fd, LOCK_PARENT_MODE)
    except OSError as exc:
        raise ctx.refuse_error(f"cannot set mode 1777: {_oserror(exc)}") from exc
    if step_hook is not None:
        step_hook("chmodded")
    state: MountPointState = "off"
    problem = ""
    if ctx.broker:
        state, problem = _prepare_mount_point(fd, ctx, repair, step_hook)
        if step_hook is not None:
            step_hook("mount-point-checked")

    through_fd = os.fstat(fd)
    try:
        through_name = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError as exc:
        raise ctx.refuse_race(
            "replaced", f"disappeared while it was prepared: {_oserror(exc)}"
        ) from exc
    if (through_name.st_dev, through_name.st_ino) != (through_fd.st_dev, through_fd.st_ino):
        raise ctx.refuse_race(
            "replaced",
            f"was replaced while it was prepared (the name is now "
            f"{_describe(through_name)} with another device/inode)",
        )
    for where, st in (("descriptor", through_fd), ("path", through_name)):
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != ctx.owner or mode != LOCK_PARENT_MODE:
            raise ctx.refuse_race(
                "mode",
                f"final check through the {where} failed: {_describe(st)} owned by "
                f"UID {st.st_uid} with mode {mode:04o} (want a directory of UID {ctx.owner}, "
                f"mode {LOCK_PARENT_MODE:04o})",
            )
    return state, problem


def _get_flags(fd: int) -> int:
    return int(_FLAGS.unpack(_ioctl(fd, _FS_IOC_GETFLAGS, bytes(_FLAGS.size)))[0])


def _set_flags(fd: int, flags: int) -> None:
    _ioctl(fd, _FS_IOC_SETFLAGS, _FLAGS.pack(flags))


def _prepare_mount_point(
    fd: int, ctx: _Context, repair: bool, step_hook: Callable[[Step], None] | None
) -> tuple[MountPointState, str]:
    """Make ``hostpid`` inside the opened lock parent a directory of ``owner``, mode 0755,
    immutable.

    Everything is relative to ``fd``.  A workload (broker off, or an older pod without the
    broker mount) can put anything at this name through its writable mount, and a root one
    can rename or remove a directory there; the container runtime later mounts the broker's
    directory at that name for the next workload, resolving it on every start.  The
    immutable flag, set through the opened descriptor, ends that: nobody without
    CAP_LINUX_IMMUTABLE can rename, remove, replace or change it any more.
    """
    where = f"{ctx.full}/{MOUNT_POINT_NAME}"
    repair_hint = (
        f"recovery: {ctx.repair} on the node (it removes a planted symlink or file at "
        f"{where} without following it and creates the directory)"
    )

    def refuse(problem: str) -> LockParentRefused:
        return ctx.refuse("mount-point", f"nested mount point {where} {problem}", repair_hint)

    try:
        st: os.stat_result | None = os.stat(MOUNT_POINT_NAME, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ctx.refuse_error(f"cannot stat {where}: {_oserror(exc)}") from exc
    if st is not None and not stat.S_ISDIR(st.st_mode):
        if not repair:
            raise refuse(f"is {_describe(st)}, not a directory; refusing to use it")
        try:
            os.unlink(MOUNT_POINT_NAME, dir_fd=fd)  # unlinkat: removes the entry, follows nothing
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ctx.refuse_error(
                f"cannot remove {_describe(st)} at {where}: {_oserror(exc)}"
            ) from exc
        st = None
    if st is None:
        try:
            os.mkdir(MOUNT_POINT_NAME, MOUNT_POINT_MODE, dir_fd=fd)
        except FileExistsError:
            pass  # something raced in: opened without following and checked below
        except OSError as exc:
            raise ctx.refuse_error(f"cannot create {where}: {_oserror(exc)}") from exc
    try:
        sub = os.open(MOUNT_POINT_NAME, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        found = _what_is(lambda: os.stat(MOUNT_POINT_NAME, dir_fd=fd, follow_symlinks=False))
        raise refuse(f"is {found}, not a directory ({_oserror(exc)})") from exc
    try:
        if step_hook is not None:
            step_hook("mount-point-opened")
        return _prepare_opened_mount_point(fd, sub, where, ctx, repair, refuse)
    finally:
        os.close(sub)


def _prepare_opened_mount_point(
    fd: int,
    sub: int,
    where: str,
    ctx: _Context,
    repair: bool,
    refuse: Callable[[str], LockParentRefused],
) -> tuple[MountPointState, str]:
    opened = os.fstat(sub)
    problem: ImmutableProblem | None = None
    flag_error: OSError | None = None
    try:
        flags: int | None = _get_flags(sub)
    except OSError as exc:
        flags, problem, flag_error = None, flag_problem(exc), exc
    immutable = flags is not None and bool(flags & FS_IMMUTABLE_FL)
    wrong = opened.st_uid != ctx.owner or stat.S_IMODE(opened.st_mode) != MOUNT_POINT_MODE
    if flags is not None and immutable and wrong:
        # Only a holder of CAP_LINUX_IMMUTABLE (the node's root) can have done this.
        if not repair:
            raise refuse(
                f"is immutable but owned by UID {opened.st_uid} with mode "
                f"{stat.S_IMODE(opened.st_mode):04o} (want UID {ctx.owner}, mode "
                f"{MOUNT_POINT_MODE:04o}); someone with CAP_LINUX_IMMUTABLE changed it"
            )
        try:
            _set_flags(sub, flags & ~FS_IMMUTABLE_FL)
        except OSError as exc:
            raise ctx.refuse_error(
                f"cannot clear the immutable flag of {where} to repair it: {_oserror(exc)}"
            ) from exc
        flags &= ~FS_IMMUTABLE_FL
        immutable = False
    if opened.st_uid != ctx.owner:
        if not repair:
            raise refuse(f"is owned by UID {opened.st_uid}, not the trusted UID {ctx.owner}")
        try:
            os.fchown(sub, ctx.owner, os.getegid())
        except OSError as exc:
            raise ctx.refuse_error(f"cannot chown {where}: {_oserror(exc)}") from exc
    if stat.S_IMODE(opened.st_mode) != MOUNT_POINT_MODE or opened.st_uid != ctx.owner:
        try:
            os.fchmod(sub, MOUNT_POINT_MODE)
        except OSError as exc:
            raise ctx.refuse_error(f"cannot set mode 0755 on {where}: {_oserror(exc)}") from exc
    if flags is not None and not immutable:
        try:
            _set_flags(sub, flags | FS_IMMUTABLE_FL)
        except OSError as exc:
            problem, flag_error = flag_problem(exc), exc
    final = os.fstat(sub)
    try:
        named = os.stat(MOUNT_POINT_NAME, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        raise ctx.refuse_race("mount-point", f"{where} disappeared: {_oserror(exc)}") from exc
    if (named.st_dev, named.st_ino) != (final.st_dev, final.st_ino) or (
        final.st_uid != ctx.owner or stat.S_IMODE(final.st_mode) != MOUNT_POINT_MODE
    ):
        raise ctx.refuse_race(
            "mount-point", f"{where} was replaced or changed while it was prepared"
        )
    if problem is None:
        return "immutable", ""
    why = f"{_oserror(flag_error)}: " if flag_error is not None else ""
    return problem, (
        f"nested mount point {where} could not be made immutable ({why}{_EXPLAIN[problem]}); "
        "a root workload holding only the parent mount can still rename or replace it and "
        "break the broker mount of the next containers started on this node (every "
        "preparation still refuses what it finds planted there)"
    )


@dataclass(frozen=True, slots=True)
class LockParentState:
    """What :func:`inspect_lock_parent` found.

    Attributes:
        state: ``ok`` (safe), ``missing`` (not created yet: not an error) or ``unsafe``.
        reason: for ``unsafe``, one of :data:`REFUSAL_REASONS`; else None.
        message: for ``unsafe``, the path, the problem and the recovery command; else "".
        mount_point: with the broker on and the rest safe, ``hostpid``'s state: ``missing``,
            ``immutable``, ``not-set`` (a directory without the flag), or why its flag cannot
            be read (``unsupported``, ``error``); ``off`` otherwise.
    """

    state: Literal["ok", "missing", "unsafe"]
    reason: RefusalReason | None = None
    message: str = ""
    mount_point: MountPointState = "off"


def inspect_lock_parent(
    path: str = LOCK_PARENT, owner: int = 0, *, broker: bool = False
) -> LockParentState:
    """Check the lock parent without changing anything (the agent's periodic check).

    Only ``O_PATH`` descriptors and ``fstat``/``fstatat``: nothing is created, chmodded,
    followed or opened for I/O, so a FIFO or a device at the name cannot block it.  The rules
    are those of :func:`prepare_lock_parent` after a successful run: the parent as there, a
    directory of ``owner`` with mode exactly 01777 at the name and, with ``broker``, a
    directory of ``owner`` that nobody else can write to at ``hostpid`` (a missing one is
    fine: the next preparation creates it).

    Returns:
        The state; a missing parent or directory is ``missing``.
    """
    try:
        parent, name = _split(path)
    except LockParentRefused as exc:
        return LockParentState("unsafe", exc.reason, str(exc))
    full = f"{parent.rstrip('/')}/{name}"
    ctx = _Context(full, parent, owner, broker)
    try:
        mount_point = _inspect(parent, name, ctx)
    except FileNotFoundError:
        return LockParentState("missing", mount_point="missing" if broker else "off")
    except LockParentRefused as exc:
        return LockParentState("unsafe", exc.reason, str(exc))
    except OSError as exc:
        return LockParentState("unsafe", "error", f"{full}: cannot check it: {_oserror(exc)}")
    return LockParentState("ok", mount_point=mount_point)


def _inspect(parent: str, name: str, ctx: _Context) -> MountPointState:
    try:
        parent_fd = os.open(parent, _PATH_FLAGS | os.O_DIRECTORY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        found = _what_is(lambda: os.lstat(parent))
        raise ctx.refuse_parent(
            f"cannot open parent {parent}: it is {found} ({_oserror(exc)})"
        ) from exc
    try:
        _check_parent(os.fstat(parent_fd), ctx)
        fd = os.open(name, _PATH_FLAGS, dir_fd=parent_fd)  # a symlink is opened as itself
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                raise ctx.refuse_entry(_describe(st), None)
            if st.st_uid != ctx.owner:
                raise ctx.refuse_owner(st.st_uid)
            mode = stat.S_IMODE(st.st_mode)
            if mode != LOCK_PARENT_MODE:
                raise ctx.refuse(
                    "mode",
                    f"has mode {mode:04o}, not {LOCK_PARENT_MODE:04o} (a workload running as "
                    "root can chmod its mount root)",
                    "the next allocation's preparation restores it; to restore it now, "
                    f"{ctx.repair}",
                )
            return _inspect_mount_point(fd, ctx) if ctx.broker else "off"
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def _inspect_mount_point(fd: int, ctx: _Context) -> MountPointState:
    where = f"{ctx.full}/{MOUNT_POINT_NAME}"
    try:
        st = os.stat(MOUNT_POINT_NAME, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    problem = ""
    if not stat.S_ISDIR(st.st_mode):
        problem = f"is {_describe(st)}, not a directory"
    elif st.st_uid != ctx.owner:
        problem = f"is owned by UID {st.st_uid}, not the trusted UID {ctx.owner}"
    elif stat.S_IMODE(st.st_mode) & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem:
        raise ctx.refuse(
            "mount-point",
            f"nested mount point {where} {problem}; the next allocation with the broker on "
            "will be refused",
            f"recovery: {ctx.repair} on the node",
        )
    return _mount_point_flag(fd, st)


def _mount_point_flag(fd: int, st: os.stat_result) -> MountPointState:
    """Whether the checked ``hostpid`` directory carries the immutable flag (read-only).

    ``fd`` is an ``O_PATH`` descriptor, on which ioctls fail, so the directory is opened for
    reading: ``O_DIRECTORY|O_NOFOLLOW`` never follows a link or opens a FIFO or device.
    """
    try:
        sub = os.open(MOUNT_POINT_NAME, _DIR_FLAGS, dir_fd=fd)
    except OSError:
        return "error"  # it changed since the check above; the next check looks again
    try:
        if (os.fstat(sub).st_dev, os.fstat(sub).st_ino) != (st.st_dev, st.st_ino):
            return "error"
        flags = _get_flags(sub)
    except OSError as exc:
        return flag_problem(exc)
    finally:
        os.close(sub)
    return "immutable" if flags & FS_IMMUTABLE_FL else "not-set"
