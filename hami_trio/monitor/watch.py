"""Which container directories had a name change since the last tick: one inotify instance.

How this works: while the lister holds an open ``.cache`` handle in a container directory it
watches that directory's inode (through ``/proc/self/fd/N`` of its own ``O_PATH``
descriptor, never a second lookup of the name) for name changes (:data:`WATCH_MASK`; no
``IN_MODIFY``, which the monitor's own writes would trigger).  Each tick
:meth:`DirectoryWatch.drain` reads what is queued; :meth:`DirectoryWatch.quiet` says whether
a directory may skip its identity ``lstat``: watched, confirmed once by an ``lstat``
(:meth:`DirectoryWatch.confirm`), and no event about it since.

A tenant can flood its own directory with names, so a drain parses at most
:data:`PARSE_BYTES` and drops the rest; after a flood, an overflow or a read error no
directory is quiet until a tick completes, and the watches are reconciled with the kernel's
list.  Watches are capped (a share of ``fs.inotify.max_user_watches``); a directory without
one keeps the ``lstat``.  docs/monitor.md (How a container's file is checked between ticks).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
import weakref
from collections.abc import Callable
from typing import NamedTuple

import inotify_simple

from hami_trio.logs import RateLimiter

__all__ = [
    "DISCARD_BYTES",
    "PARSE_BYTES",
    "RETRY_TICKS",
    "WATCH_CEILING",
    "WATCH_FALLBACKS",
    "WATCH_MASK",
    "DirectoryWatch",
    "Events",
    "parse_events",
    "watch_cap",
]

logger = logging.getLogger(__name__)

_flags = inotify_simple.flags
#: Name changes of a directory's children and of the directory itself.  ``IN_ATTRIB`` adds
#: the directory's own link count (it reaches 0 when it is renamed over while something
#: holds it); ``IN_EXCL_UNLINK`` leaves out events about children already unlinked.
#: ``IN_UNMOUNT``, ``IN_IGNORED`` and ``IN_Q_OVERFLOW`` come without being asked for.
WATCH_MASK = (
    _flags.CREATE
    | _flags.DELETE
    | _flags.MOVED_FROM
    | _flags.MOVED_TO
    | _flags.DELETE_SELF
    | _flags.MOVE_SELF
    | _flags.ATTRIB
    | _flags.ONLYDIR
    | _flags.EXCL_UNLINK
)
#: Why no directory could rely on its watch one tick: the kernel's queue overflowed, more
#: than PARSE_BYTES were queued, reading failed, or the containers directory was replaced
#: (the lister's own check).
WATCH_FALLBACKS = ("overflow", "flood", "error", "root")
#: The most watches one lister holds, whatever the node allows.
WATCH_CEILING = 16384
#: The lister holds at most this fraction of ``fs.inotify.max_user_watches`` (shared per UID).
WATCH_SHARE = 4
#: ``max_user_watches`` assumed when it cannot be read (the kernel's old default).
DEFAULT_MAX_USER_WATCHES = 8192
#: Event bytes parsed per drain (about 500 events of short names); more is a flood.
PARSE_BYTES = 16 << 10
#: Bytes read and dropped after a flood, at most, per drain (a full default queue of 16384
#: events is at most ~4.3 MiB); what is left is read next tick.
DISCARD_BYTES = 4 << 20
_DISCARD_CHUNK = 64 << 10
#: Drains (ticks) between two attempts at what the kernel refused: an instance (EMFILE) or a
#: watch (ENOSPC, the node's watches used up).
RETRY_TICKS = 60
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
#: A record with the longest name (NAME_MAX + NUL, padded): a shorter read left room for it,
#: so the queue was empty.
_MAX_EVENT = _EVENT.size + 256
_OVERFLOW = int(_flags.Q_OVERFLOW)
_IGNORED = int(_flags.IGNORED)
_FDINFO_WATCH = re.compile(rb"inotify wd:([0-9a-f]+) ino:([0-9a-f]+)")


class Events(NamedTuple):
    """What one read of inotify records says: the watches with an event, the watches the
    kernel removed (``IN_IGNORED``), and whether events were lost (an overflow record, or a
    record cut short)."""

    wds: frozenset[int]
    ignored: frozenset[int]
    lost: bool


def parse_events(data: bytes) -> Events:
    """The watch descriptors named by the records in ``data`` (pure; names are skipped)."""
    wds: set[int] = set()
    ignored: set[int] = set()
    lost = False
    offset, end, size = 0, len(data), _EVENT.size
    unpack = _EVENT.unpack_from
    while offset + size <= end:
        wd, mask, _cookie, length = unpack(data, offset)
        offset += size + length
        if mask & _OVERFLOW:
            lost = True
        elif mask & _IGNORED:
            ignored.add(wd)
        else:
            wds.add(wd)
    if offset != end:
        lost = True
    return Events(frozenset(wds), frozenset(ignored), lost)


def watch_cap(path: str = "/proc/sys/fs/inotify/max_user_watches") -> int:
    """How many watches a lister may hold on this node (see :data:`WATCH_SHARE`)."""
    try:
        with open(path, "rb") as file:
            limit = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        limit = DEFAULT_MAX_USER_WATCHES
    return max(0, min(WATCH_CEILING, limit // WATCH_SHARE))


class _Watch:
    __slots__ = ("epoch", "ino", "trusted", "wd")

    def __init__(self, wd: int, ino: int, epoch: int) -> None:
        self.wd = wd
        self.ino = ino  # of the directory, to check against the kernel's list
        self.epoch = epoch  # the drain after which it was added
        self.trusted = False  # an lstat after a later drain confirmed the name


class DirectoryWatch:
    """The lister's inotify watches, by container directory name (see the module docstring).

    Args:
        max_watches: the cap on watches held (None: :func:`watch_cap`).
        log_interval: seconds between two log lines about the same problem.
    """

    def __init__(self, max_watches: int | None = None, *, log_interval: float = 60.0) -> None:
        self._cap = watch_cap() if max_watches is None else max_watches
        self._inotify: inotify_simple.INotify | None = None
        self._close_fd: Callable[[], object] | None = None
        self._names: dict[str, _Watch] = {}
        self._wds: dict[int, str] = {}
        self._dirty: set[str] = set()
        self._everything = False
        self._epoch = 0
        self._open_at = 0  # the drain from which creating an instance is tried (again)
        self._add_at = 0  # the drain from which adding is tried again after ENOSPC
        self._cap_noted = -1  # the drain in which the cap was last logged
        self._limiter = RateLimiter(log_interval, max_keys=64)

    @property
    def watched(self) -> int:
        """Directories watched now."""
        return len(self._names)

    @property
    def cap(self) -> int:
        """The most directories watched at once."""
        return self._cap

    def watching(self, name: str) -> bool:
        """Whether directory ``name`` is watched."""
        return name in self._names

    # -- the tick --------------------------------------------------------------------------

    def drain(self) -> str | None:
        """Start a tick: read the events since the last drain and note which directories
        they name (pending until :meth:`confirm` or :meth:`remove`).

        Returns:
            None, or why no directory is quiet until a tick completes (:meth:`tick_done`):
            ``overflow`` (the kernel's queue overflowed), ``flood`` (more than
            :data:`PARSE_BYTES` queued), ``error``.
        """
        self._epoch += 1
        notify = self._inotify
        if notify is None:
            if self._epoch >= self._open_at:
                self._open()
            return None  # nothing is watched, so nothing is quiet
        reason = self._read(notify.fileno())
        if reason is not None:
            self._everything = True
            self._reconcile(notify.fileno())
        return reason

    def mark_all_dirty(self) -> None:
        """No directory is quiet until a tick completes (the containers directory changed)."""
        self._everything = True

    def tick_done(self) -> None:
        """A tick checked every directory: lost events are accounted for."""
        self._everything = False

    def quiet(self, name: str) -> bool:
        """Whether directory ``name`` may skip its identity ``lstat`` this tick."""
        if self._everything or name in self._dirty:
            return False
        watch = self._names.get(name)
        return watch is not None and watch.trusted

    def confirm(self, name: str) -> None:
        """An ``lstat`` this tick found the file the handle holds at its name: the events
        read so far are answered.  A watch added before this tick's drain is trusted from
        now on: every name change since it was added is an event, and this ``lstat`` says
        the name still leads to the file."""
        self._dirty.discard(name)
        watch = self._names.get(name)
        if watch is not None and watch.epoch < self._epoch:
            watch.trusted = True

    def _read(self, fd: int) -> str | None:
        try:
            data = os.read(fd, PARSE_BYTES)
        except BlockingIOError:
            return None
        except OSError as exc:
            self._log(
                "read",
                "cannot read inotify events (%s): every container is checked with lstat this tick",
                exc.strerror or exc,
            )
            return "error"
        events = parse_events(data)
        reason = "overflow" if events.lost else None
        if len(data) > PARSE_BYTES - _MAX_EVENT and self._discard(fd):
            reason = reason or "flood"
        wds, dirty = self._wds, self._dirty
        for wd in events.wds:
            name = wds.get(wd)
            if name is not None:  # else a watch already removed: nothing to do
                dirty.add(name)
        for wd in events.ignored:
            name = wds.get(wd)
            if name is not None:
                # The kernel removed it (directory deleted, file system unmounted).  Removing
                # it again is harmless and frees the number should the kernel have reused it.
                # Unwatched, the directory is never quiet: nothing is left pending.
                self.remove(name)
        return reason

    def _discard(self, fd: int) -> bool:
        """Read and drop what is queued, at most :data:`DISCARD_BYTES`; True if anything was."""
        dropped = 0
        while dropped < DISCARD_BYTES:
            try:
                data = os.read(fd, _DISCARD_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                return True  # whatever is queued is lost to us anyway
            dropped += len(data)
            if len(data) <= _DISCARD_CHUNK - _MAX_EVENT:
                break
        return dropped > 0

    def _reconcile(self, fd: int) -> None:
        """Keep only the watches the kernel still has (after events were lost)."""
        try:
            with open(f"/proc/self/fdinfo/{fd}", "rb") as file:
                live = {int(wd, 16): int(ino, 16) for wd, ino in _FDINFO_WATCH.findall(file.read())}
        except OSError:
            live = {}
        if not live and self._names:
            # No list to go by: start over (each directory is watched again from its next
            # lstat on).
            self._log("fdinfo", "cannot list the kernel's inotify watches; watching afresh")
            for name in list(self._names):
                self.remove(name)
            return
        for name, watch in list(self._names.items()):
            if live.get(watch.wd) != watch.ino:
                self._forget(name)

    # -- adding and removing ---------------------------------------------------------------

    def can_add(self) -> bool:
        """Whether :meth:`add` may be tried now (logs why not, rate-limited)."""
        if self._inotify is None or self._epoch < self._add_at:
            return False
        if len(self._names) < self._cap:
            return True
        if self._cap_noted != self._epoch:  # asked once per container: log once per tick
            self._cap_noted = self._epoch
            self._log(
                "cap",
                "%d container directories watched (the cap: a quarter of "
                "fs.inotify.max_user_watches, at most %d); the others are checked with lstat "
                "every tick",
                len(self._names),
                WATCH_CEILING,
            )
        return False

    def add(self, name: str, dir_fd: int) -> bool:
        """Watch the directory open at ``dir_fd`` (an ``O_PATH`` descriptor) as ``name``.

        Returns:
            Whether it is watched now.  Failures are logged (rate-limited), never raised.
        """
        notify = self._inotify
        if notify is None or not self.can_add():
            return False
        self.remove(name)
        try:
            ino = os.fstat(dir_fd).st_ino
            wd = notify.add_watch(f"/proc/self/fd/{dir_fd}", WATCH_MASK)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self._add_at = self._epoch + RETRY_TICKS
                self._log(
                    "enospc",
                    "cannot watch container directory %s: the node's inotify watches are used "
                    "up (fs.inotify.max_user_watches); directories without a watch are checked "
                    "with lstat every tick; trying again in %d ticks",
                    name,
                    RETRY_TICKS,
                )
            else:
                self._log("add", "cannot watch container directory %s: %s", name, exc.strerror)
            return False
        if wd in self._wds:
            # The same directory under another name (a bind mount): it stays that name's.
            return False
        self._wds[wd] = name
        self._names[name] = _Watch(wd, ino, self._epoch)
        return True

    def remove(self, name: str) -> None:
        """Stop watching ``name`` (nothing if it is not watched)."""
        watch = self._forget(name)
        if watch is not None:
            self._rm_watch(watch.wd)

    def _forget(self, name: str) -> _Watch | None:
        """Drop what is known of ``name``'s watch, leaving the kernel's side as it is."""
        watch = self._names.pop(name, None)
        if watch is not None:
            self._dirty.discard(name)
            del self._wds[watch.wd]
        return watch

    def _rm_watch(self, wd: int) -> None:
        notify = self._inotify
        if notify is not None:
            try:
                notify.rm_watch(wd)
            except OSError:
                pass  # already gone (the kernel removed it)

    def _open(self) -> None:
        try:
            # The descriptor is closed by close(), or when this object is collected (a
            # lister nobody closed), never by the file object: that would warn.
            notify = inotify_simple.INotify(nonblocking=True, closefd=False)
        except OSError as exc:
            self._open_at = self._epoch + RETRY_TICKS
            self._log(
                "instance",
                "cannot create an inotify instance (%s; fs.inotify.max_user_instances?): "
                "every container is checked with lstat every tick; trying again in %d ticks",
                exc.strerror or exc,
                RETRY_TICKS,
            )
            return
        self._inotify = notify
        self._close_fd = weakref.finalize(self, os.close, notify.fileno())

    def close(self) -> None:
        """Drop every watch and the instance (the next :meth:`drain` starts a new one)."""
        notify, self._inotify = self._inotify, None
        close_fd, self._close_fd = self._close_fd, None
        self._names.clear()
        self._wds.clear()
        self._dirty.clear()
        self._open_at = 0
        if notify is not None:
            notify.close()
        if close_fd is not None:
            close_fd()

    def _log(self, key: str, msg: str, *args: object) -> None:
        self._limiter.log(logger, logging.WARNING, key, msg, *args)
