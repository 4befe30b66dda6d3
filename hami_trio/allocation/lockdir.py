"""Prepare the shared lock parent ``/tmp/vgpulock``: root-owned, mode 01777, no tricks.

Every HAMi-core allocation mounts the host's ``/tmp/vgpulock`` writable into the container, and
HAMi-core's lock files live there.  The device plugin runs as root and prepares it before each
allocation (SPEC A-1, A-2).  Anyone who can write to the host's ``/tmp`` (another local user,
any pod with a ``hostPath`` mount of ``/tmp``) may try to make that root process chmod, or a
workload mount, something they control - by planting a symlink or a foreign directory at the
name, or by swapping it while we work.  So every step is relative to a descriptor, never to a
path that could be re-resolved:

1. open the parent (``/tmp``) with ``O_DIRECTORY|O_NOFOLLOW``; it must be owned by the trusted
   UID, and if group or others can write to it, it must be sticky (otherwise anyone could
   rename our directory away and put theirs in its place);
2. ``mkdirat(parent_fd, name, 01777)``; ``EEXIST`` is fine, whatever exists is checked next;
3. ``openat(parent_fd, name, O_DIRECTORY|O_NOFOLLOW)``: a symlink or non-directory fails here;
4. through that descriptor: the directory must be owned by the trusted UID;
5. ``fchmod(fd, 01777)``: restores what the umask removed and upgrades an old 0777 directory
   - it changes the object we opened and checked, never what the name points to now;
6. verify through the descriptor *and* through ``fstatat(parent_fd, name,
   AT_SYMLINK_NOFOLLOW)``: both are directories owned by the trusted UID with mode exactly
   01777, and both have the same ``(st_dev, st_ino)`` - so the name still denotes the directory
   we prepared, and a swap during steps 2-5 is refused.

Python's :func:`os.mkdir`, :func:`os.open` and :func:`os.stat` take ``dir_fd`` (and
``follow_symlinks=False`` for ``fstatat``), and :func:`os.fchmod` takes a descriptor; no
path-based ``chmod`` or ``mkdir`` is used.  Only the last component of the parent path is opened
without following symlinks; the parent's own ancestors (for ``/tmp``: only ``/``) are trusted.

Every refusal raises :class:`~hami_trio.errors.LockDirError` naming the path and the reason; the
device plugin fails that allocation instead of returning an unsafe mount.  The umask is never
touched (it is process-wide and a device plugin may be threaded).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Literal

from hami_trio._fs import file_kind
from hami_trio.allocation.paths import LOCK_PARENT, go_clean
from hami_trio.errors import LockDirError

__all__ = ["LOCK_PARENT_MODE", "Step", "prepare_lock_parent"]

#: The only acceptable final mode: world-writable (every workload UID creates lock files)
#: and sticky (nobody can delete or rename another user's entry).
LOCK_PARENT_MODE = 0o1777

#: The points between steps at which a test hook runs (see ``prepare_lock_parent``).
Step = Literal["parent-checked", "created", "opened", "chmodded"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    if not path.startswith("/"):
        raise LockDirError(f"{path!r}: the lock parent must be an absolute path")
    if ".." in path.split("/"):
        # The kernel resolves ".." after symlinks, go_clean before them: the two can disagree
        # about which directory is meant, so such a path is ambiguous and refused.
        raise LockDirError(f"{path!r}: the lock parent path must not contain '..'")
    clean = go_clean(path)
    if clean == "/":
        raise LockDirError(f"{path!r}: the lock parent cannot be the root directory")
    parent, _, name = clean.rpartition("/")
    return parent or "/", name


def prepare_lock_parent(
    path: str = LOCK_PARENT,
    owner: int = 0,
    *,
    step_hook: Callable[[Step], None] | None = None,
) -> str:
    """Create or repair the lock parent as a directory owned by ``owner`` with mode 01777.

    Idempotent: an already correct directory is left as it is.  See the module docstring for
    the steps and the attack each one stops.

    Args:
        path: the lock parent, absolute (``/tmp/vgpulock``); it is cleaned like Go's
            ``path.Clean`` and split into parent and name.
        owner: the trusted UID that must own both the parent and the directory (root in
            production; tests use their own UID for trees under a temporary directory).
        step_hook: for tests only - called with the name of each completed step
            (``parent-checked``, ``created``, ``opened``, ``chmodded``) so a test can swap the
            directory in between and check the swap is refused.  Production passes nothing.

    Returns:
        The cleaned path that was prepared (``/tmp//vgpulock/`` gives ``/tmp/vgpulock``): the
        host path to mount.

    Raises:
        LockDirError: the path is relative, ``/`` or contains ``..``; the parent cannot be
            opened, is a symlink, has the wrong owner, or is writable by others without the
            sticky bit; the name is a symlink, not a directory or has the wrong owner; a system
            call failed; or the name no longer denotes the prepared directory at the end.  The
            message names the path and the reason; an ``OSError`` cause is chained.
    """
    parent, name = _split(path)
    full = f"{parent.rstrip('/')}/{name}"
    try:
        parent_fd = os.open(parent, _DIR_FLAGS)
    except OSError as exc:
        # lstat only to word the message; nothing is decided on a path-based lookup.
        found = _what_is(lambda: os.lstat(parent))
        raise LockDirError(
            f"{full}: cannot open parent {parent} without following symlinks: it is {found} "
            f"({_oserror(exc)})"
        ) from exc
    try:
        _check_parent(parent_fd, parent, full, owner)
        if step_hook is not None:
            step_hook("parent-checked")
        try:
            os.mkdir(name, LOCK_PARENT_MODE, dir_fd=parent_fd)
        except FileExistsError:
            pass  # Whatever is there is opened without following links and checked below.
        except OSError as exc:
            raise LockDirError(f"{full}: cannot create directory: {_oserror(exc)}") from exc
        if step_hook is not None:
            step_hook("created")
        fd = _open_dir(parent_fd, name, full)
        try:
            _prepare_opened(parent_fd, fd, name, full, owner, step_hook)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)
    return full


def _oserror(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _check_parent(parent_fd: int, parent: str, full: str, owner: int) -> None:
    st = os.fstat(parent_fd)
    if st.st_uid != owner:
        raise LockDirError(
            f"{full}: parent {parent} is owned by UID {st.st_uid}, not the trusted UID {owner}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise LockDirError(
            f"{full}: parent {parent} is writable by group or others (mode {mode:04o}) "
            "but not sticky, so anyone could replace the lock directory"
        )


def _open_dir(parent_fd: int, name: str, full: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        # Say what is in the way (symlink, file, ...) rather than just ELOOP/ENOTDIR.
        found = _what_is(lambda: os.stat(name, dir_fd=parent_fd, follow_symlinks=False))
        if found == "a directory":
            raise LockDirError(f"{full}: cannot open directory: {_oserror(exc)}") from exc
        raise LockDirError(
            f"{full}: is {found}, not a directory; refusing to follow or use it ({_oserror(exc)})"
        ) from exc


def _prepare_opened(
    parent_fd: int,
    fd: int,
    name: str,
    full: str,
    owner: int,
    step_hook: Callable[[Step], None] | None,
) -> None:
    if step_hook is not None:
        step_hook("opened")
    opened = os.fstat(fd)
    if not stat.S_ISDIR(opened.st_mode):  # O_DIRECTORY makes this impossible; belt and braces
        raise LockDirError(f"{full}: is {_describe(opened)}, not a directory")
    if opened.st_uid != owner:
        raise LockDirError(
            f"{full}: is owned by UID {opened.st_uid}, not the trusted UID {owner}; "
            "refusing to chmod or mount a directory someone else controls"
        )
    try:
        os.fchmod(fd, LOCK_PARENT_MODE)
    except OSError as exc:
        raise LockDirError(f"{full}: cannot set mode 1777: {_oserror(exc)}") from exc
    if step_hook is not None:
        step_hook("chmodded")

    through_fd = os.fstat(fd)
    try:
        through_name = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError as exc:
        raise LockDirError(f"{full}: disappeared while it was prepared: {_oserror(exc)}") from exc
    if (through_name.st_dev, through_name.st_ino) != (through_fd.st_dev, through_fd.st_ino):
        raise LockDirError(
            f"{full}: was replaced while it was prepared (the name is now "
            f"{_describe(through_name)} with another device/inode)"
        )
    for where, st in (("descriptor", through_fd), ("path", through_name)):
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner or mode != LOCK_PARENT_MODE:
            raise LockDirError(
                f"{full}: final check through the {where} failed: {_describe(st)} owned by "
                f"UID {st.st_uid} with mode {mode:04o} (want a directory of UID {owner}, "
                f"mode {LOCK_PARENT_MODE:04o})"
            )
