"""Open, read and write one tenant-owned ``.cache`` file without giving the tenant a lever.

The tenant owns its shared region: the file sits in a directory mounted read-write into its
container, so at any moment it can truncate, grow, replace or rewrite it, or put a symlink,
FIFO, device node, directory or hard link in its place.  This module is the only place that
touches such a file, and it is built so that none of that can hurt the agent or anyone else
(``docs/monitor.md`` has the full threat model):

- **No mapping.**  Upstream maps the file ``MAP_SHARED``; once the tenant truncates it, the
  next read of a page past the new end raises SIGBUS and kills the monitor.  We copy the few
  ranges we need with ``os.pread`` (a short read on a shrinking file is just a short read)
  and write the two control words with one 4-byte ``os.pwrite`` each.
- **Open without following anything and without opening the object itself first.**  The
  file is first opened ``O_PATH | O_NOFOLLOW`` relative to its directory, which pins the
  inode without calling any driver's ``open`` (so a device node such as a watchdog swapped in
  by the tenant is never opened); only a regular file with one link is then re-opened for
  reading and writing through ``/proc/self/fd`` - the same inode, no second path lookup -
  with ``O_NONBLOCK | O_NOCTTY``.
- **Identity is checked every tick** by the lister (``(st_dev, st_ino)`` of the path against
  the open descriptor); writes go only to the descriptor, never to a path, and only when the
  file still has the size the snapshot was read at.
- **Bounded reads.**  The tail (16/24 bytes) and the head up to the live slots are read; a
  huge ``proc_num`` is clamped to 1024 slots, a huge file is never read beyond the layout.

Every failure is a :class:`~hami_trio.errors.CacheFileRejected` with a reason token; nothing
here raises anything else for tenant-controlled input.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Sequence

from hami_trio._fs import file_kind
from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import (
    HEADER_SIZE,
    ControlField,
    Layout,
    RejectReason,
    clamp_proc_num,
    classify,
    layout_for_size,
)
from hami_trio.monitor.snapshot import (
    SlotTotals,
    StaticInfo,
    UsageSnapshot,
    parse_static,
    parse_usage,
    slot_rows,
    slot_struct,
    sum_rows,
)

__all__ = ["RegionHandle", "read_region_file"]

_I32 = struct.Struct("<i")
#: The parsed slot fields are kept for change detection only for regions with at most this
#: many live slots.  A region with hundreds (a tenant's ``proc_num`` 1024 on 16 devices:
#: ~100,000 Python ints, ~1.6 MB) is re-summed every tick instead: its owner can force that
#: anyway by changing a slot, and keeping the rows would cost the agent memory (64 such
#: regions: +105 MB RSS) and make every full garbage collection walk them (+5-10 ms per
#: collection, a stall of the whole event loop).
KEEP_ROWS_SLOTS = 64
_PROC_NUM = struct.Struct("<i")


def _pack(codec: struct.Struct, value: int, what: str) -> bytes:
    try:
        return codec.pack(value)
    except struct.error as exc:
        raise ValueError(f"{what}={value} does not fit its C type") from exc


def _check_object(st: os.stat_result, display: str, *, writable: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise CacheFileRejected(
            RejectReason.NOT_REGULAR_FILE,
            f"{display} is a {file_kind(st.st_mode)}, not a regular file; refusing it",
        )
    if writable and st.st_nlink != 1:
        # A second name for the inode could live anywhere on the same filesystem (another
        # tenant's file, a host file); we will not write through such a link.
        raise CacheFileRejected(
            RejectReason.HARD_LINK,
            f"{display} has {st.st_nlink} hard links (expected 1); refusing to write through it",
        )


def _io_rejection(display: str, action: str, exc: OSError) -> CacheFileRejected:
    return CacheFileRejected(
        RejectReason.IO_ERROR, f"{display}: cannot {action}: {exc.strerror or exc}"
    )


class _ReadCache:
    """What the last snapshot was derived from, to tell whether anything changed."""

    __slots__ = (
        "codec",
        "layout",
        "prefix",
        "rows",
        "size",
        "snapshot",
        "static",
        "tail",
        "totals",
    )

    def __init__(
        self,
        size: int,
        prefix: bytes,
        tail: bytes,
        layout: Layout,
        static: StaticInfo,
        rows: list[tuple[int, ...]] | None,
        totals: SlotTotals,
        snapshot: UsageSnapshot,
    ) -> None:
        self.size = size
        self.prefix = prefix
        self.tail = tail
        self.layout = layout
        self.static = static
        self.rows = rows
        self.totals = totals
        self.snapshot = snapshot
        self.codec = slot_struct(layout, static.device_count)


class RegionHandle:
    """One open ``.cache`` file: a descriptor pinned to one inode, and what was last read.

    Create with :meth:`open_at` (the monitor: relative to the container directory, read and
    write) or :meth:`open_path` (``inspect``: read-only).  :meth:`read` copies the live
    ranges and returns a snapshot; :meth:`write_control` and the limit setters store one
    aligned word.  Not thread-safe; one owner (the lister) uses it.
    """

    def __init__(self, fd: int, st: os.stat_result, display: str, *, writable: bool) -> None:
        self._fd = fd
        self.dev: int = st.st_dev
        self.ino: int = st.st_ino
        self.display = display
        self.writable = writable
        self._layout: Layout | None = None
        self._cache: _ReadCache | None = None
        #: Bytes the latest :meth:`read` asked ``pread`` for (what the lister's work
        #: accounting charges for it: parsing is proportional to the bytes read).
        self.read_bytes = 0

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open_at(
        cls, dir_fd: int | None, name: str, *, display: str, writable: bool = True
    ) -> RegionHandle:
        """Open ``name`` (relative to ``dir_fd``, or a path if ``dir_fd`` is None) safely.

        The final component is never followed; only a regular file is ever opened for I/O
        (and, when ``writable``, only one with a single link).

        Args:
            dir_fd: the directory to resolve ``name`` in, or None.
            name: the file name (one component when ``dir_fd`` is given).
            display: how to name the file in messages.
            writable: open read-write (the monitor) or read-only (``inspect``).

        Raises:
            FileNotFoundError: nothing is at that name (not a rejection: the lister re-lists).
            CacheFileRejected: ``not_regular_file``, ``hard_link`` or ``io_error``.
        """
        try:
            pinned = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _io_rejection(display, "open", exc) from exc
        try:
            try:
                st = os.fstat(pinned)
            except OSError as exc:
                raise _io_rejection(display, "stat", exc) from exc
            _check_object(st, display, writable=writable)
            flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | os.O_NOCTTY
            try:
                # Re-open the pinned inode itself: no second lookup of the tenant's path.
                fd = os.open(f"/proc/self/fd/{pinned}", flags | os.O_CLOEXEC)
            except OSError as exc:
                raise _io_rejection(display, "open", exc) from exc
        finally:
            os.close(pinned)
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise CacheFileRejected(  # pragma: no cover - /proc re-open is the same inode
                    RejectReason.REPLACED, f"{display} changed while it was being opened"
                )
            _check_object(opened, display, writable=writable)
        except Exception:
            os.close(fd)
            raise
        return cls(fd, opened, display, writable=writable)

    @classmethod
    def open_path(cls, path: str | os.PathLike[str], *, writable: bool = False) -> RegionHandle:
        """:meth:`open_at` for a path (the final component is still not followed)."""
        return cls.open_at(None, os.fspath(path), display=os.fspath(path), writable=writable)

    # -- state -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._fd < 0

    @property
    def identity(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the open file."""
        return (self.dev, self.ino)

    def matches(self, st: os.stat_result) -> bool:
        """Whether an ``lstat`` of the path still names this very file, safely usable."""
        return (
            st.st_ino == self.ino
            and st.st_dev == self.dev
            and stat.S_ISREG(st.st_mode)
            and (st.st_nlink == 1 or not self.writable)
        )

    def size(self) -> int:
        """The open file's current size.

        Raises:
            CacheFileRejected: ``io_error``.
        """
        try:
            return os.fstat(self._fd).st_size
        except OSError as exc:
            raise _io_rejection(self.display, "stat", exc) from exc

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    # -- reading ---------------------------------------------------------------------------

    def _pread(self, length: int, offset: int) -> bytes:
        self.read_bytes += length
        try:
            data = os.pread(self._fd, length, offset)
        except OSError as exc:
            raise _io_rejection(self.display, "read", exc) from exc
        if len(data) != length:
            raise CacheFileRejected(
                RejectReason.TRUNCATED,
                f"{self.display} shrank while being read ({len(data)} of {length} bytes at "
                f"offset {offset})",
            )
        return data

    def read(self, size: int | None = None) -> UsageSnapshot:
        """Read the live ranges and return the snapshot (the loader rule is applied anew).

        Args:
            size: the file size an ``lstat`` just reported (saves an ``fstat``); None to ask.

        Returns:
            The snapshot; the same object as last time if no byte it depends on changed.

        Raises:
            CacheFileRejected: any loader-rule rejection, ``truncated`` (the file shrank
                during the read) or ``io_error``.
        """
        if size is None:
            size = self.size()
        self._layout = None
        self.read_bytes = 0
        try:
            return self._read(size)
        except CacheFileRejected as exc:
            if str(exc).startswith(self.display):
                raise
            raise CacheFileRejected(exc.reason, f"{self.display}: {exc}") from None

    def _read(self, size: int) -> UsageSnapshot:
        candidate = layout_for_size(size)
        if candidate is None:
            header = self._pread(HEADER_SIZE, 0) if size >= HEADER_SIZE else b""
            classify(size, header)  # raises: no layout fits this size
            raise AssertionError("classify accepted a size layout_for_size refused")
        tail = self._pread(candidate.tail_size, candidate.tail_offset)
        (proc_num,) = _PROC_NUM.unpack_from(tail)
        slots = clamp_proc_num(proc_num)
        head = self._pread(candidate.body_size(slots), 0)
        # Change detection keeps the header/static prefix (~1.8 KB) and the used fields of
        # the live slots as ints (up to KEEP_ROWS_SLOTS slots), not the whole ~17 KB head: a
        # small per-container working set is what keeps a tick over thousands of
        # containers fast.
        cache = self._cache
        if cache is not None and cache.size == size and head.startswith(cache.prefix):
            # head is exactly the live slots long, so the view below is exactly those slots
            rows = list(cache.codec.iter_unpack(memoryview(head)[cache.layout.procs :]))
            if cache.rows is None:
                # Rows not kept (see KEEP_ROWS_SLOTS): compare the sums instead.
                totals = sum_rows(rows, cache.static)
                if len(rows) <= KEEP_ROWS_SLOTS:
                    cache.rows = rows
                if totals != cache.totals or cache.tail != tail:
                    cache.tail = tail
                    cache.totals = totals
                    cache.snapshot = parse_usage(
                        cache.layout, size, head, tail, cache.static, totals
                    )
            elif rows == cache.rows:
                if cache.tail != tail:
                    # Only the tail moved (recent_kernel decays every tick): same sums.
                    cache.tail = tail
                    cache.snapshot = parse_usage(
                        cache.layout, size, head, tail, cache.static, cache.totals
                    )
            else:
                cache.rows = rows if len(rows) <= KEEP_ROWS_SLOTS else None
                cache.tail = tail
                cache.totals = sum_rows(rows, cache.static)
                cache.snapshot = parse_usage(
                    cache.layout, size, head, tail, cache.static, cache.totals
                )
            self._layout = cache.layout
            return cache.snapshot
        layout = classify(size, head)
        prefix = head[: layout.procs]
        static = parse_static(layout, head)
        if cache is not None and cache.static == static:
            static = cache.static  # keep the objects (and identities) the view already has
        rows = slot_rows(layout, head, slots, static.device_count)
        totals = sum_rows(rows, static)
        snapshot = parse_usage(layout, size, head, tail, static, totals)
        kept = rows if slots <= KEEP_ROWS_SLOTS else None
        self._cache = _ReadCache(size, prefix, tail, layout, static, kept, totals, snapshot)
        self._layout = layout
        return snapshot

    # -- writing ---------------------------------------------------------------------------

    def _store(self, stores: list[tuple[int, bytes]]) -> None:
        if not self.writable:
            raise CacheFileRejected(RejectReason.IO_ERROR, f"{self.display} is open read-only")
        cache = self._cache
        if self._layout is None or cache is None:
            raise CacheFileRejected(
                RejectReason.IO_ERROR, f"{self.display}: no successful read to write against"
            )
        # pwrite past the end would grow the tenant's file; only write while the file still
        # has the size the decision was made on.
        if self.size() != cache.size:
            raise CacheFileRejected(
                RejectReason.TRUNCATED, f"{self.display} changed size since it was read"
            )
        for offset, data in stores:
            try:
                written = os.pwrite(self._fd, data, offset)
            except OSError as exc:
                raise _io_rejection(self.display, "write", exc) from exc
            if written != len(data):  # pragma: no cover - regular files do not short-write
                raise CacheFileRejected(RejectReason.IO_ERROR, f"{self.display}: short write")

    def write_controls(self, values: Sequence[tuple[ControlField, int]]) -> None:
        """Store control words (``recent_kernel``, ``utilization_switch``), one aligned
        4-byte ``pwrite`` each, at their offsets in the layout of the last read.

        Raises:
            ValueError: a value does not fit an int32.
            CacheFileRejected: no successful read yet, the size changed since, or
                ``io_error``.
        """
        layout = self._layout
        if layout is None:
            raise CacheFileRejected(
                RejectReason.IO_ERROR, f"{self.display}: no successful read to write against"
            )
        self._store([(field.offset(layout), _pack(_I32, v, field.value)) for field, v in values])


def read_region_file(path: str | os.PathLike[str]) -> UsageSnapshot:
    """Read one ``.cache`` file read-only (the ``inspect`` command).

    Raises:
        CacheFileRejected: the file is missing, not a regular file, or does not load.
    """
    display = os.fspath(path)
    try:
        handle = RegionHandle.open_path(path, writable=False)
    except FileNotFoundError as exc:
        raise CacheFileRejected(RejectReason.IO_ERROR, f"{display}: no such file") from exc
    try:
        return handle.read()
    finally:
        handle.close()
