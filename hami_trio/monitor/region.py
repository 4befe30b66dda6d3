"""Open, read and write one tenant-owned ``.cache`` file without giving the tenant a lever.

How this works: the file is opened ``O_PATH | O_NOFOLLOW`` relative to its directory (never
following a link, never calling a device's or FIFO's ``open``), and only a regular file with
one link is re-opened through ``/proc/self/fd`` with ``O_NONBLOCK | O_NOCTTY``.  There is no
mapping (a truncated file cannot SIGBUS the agent): the pure
:class:`~hami_trio.monitor.snapshot.RegionDecoder` names the byte ranges, this module
``pread``s them and refuses a short read, and the two control words are written with one
4-byte ``pwrite`` each, only while the file still has the size the snapshot was read at.
The lister checks the file's identity (by ``lstat``, or by inotify on its directory); when it
has no fresh size to give, :meth:`RegionHandle.read_probed` checks the size in the first
``pread`` itself, by reading one byte past the last known end.  Every failure is a
:class:`~hami_trio.errors.CacheFileRejected` with a reason token.  docs/monitor.md (How one
region is read, Tenant threat model).
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Sequence
from typing import Protocol, TypeVar

from hami_trio._fs import file_kind
from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import LAYOUTS, ControlField, RejectReason, clamp_proc_num
from hami_trio.monitor.snapshot import (
    RegionDecoder,
    SlotTotals,
    TickDecoder,
    TickSnapshot,
    UsageSnapshot,
    sum_slots_without,
)

__all__ = ["PROBE_SLACK", "RegionHandle", "read_region_file"]

#: How far the last known end of a file may lie past the end of the first range read for
#: :meth:`RegionHandle.read_probed` to check the size in that same ``pread``.  Real files end
#: 33 (v1) or 1 (v0) bytes past their tail range; a few KiB bounds what one probe reads.
PROBE_SLACK = 4096

T = TypeVar("T", covariant=True)


class _Decoder(Protocol[T]):
    """A pure decoder's conversation: the first range, then each next range or the result."""

    def start(self, size: int) -> tuple[int, int]: ...
    def feed(self, data: bytes) -> tuple[int, int] | T: ...


#: Guards every handle's descriptor against being closed under a pinned usage read.
_LIFETIME = threading.Lock()

_I32 = struct.Struct("<i")
_RECENT = ControlField.RECENT_KERNEL
#: The words the feedback writes (-1 blocked, 0, 1, and the decrements of small counts),
#: packed once: a busy node writes one or two per container per tick.
_SMALL_WORDS = {value: _I32.pack(value) for value in range(-1, 64)}


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


class RegionHandle:
    """One open ``.cache`` file: a descriptor pinned to one inode, and what was last read.

    Create with :meth:`open_at` (the monitor: relative to the container directory, read and
    write) or :meth:`open_path` (``inspect``: read-only).  Two readers share the descriptor,
    each with its own decoder: the tick (:meth:`read`, :meth:`read_probed`: the tail, and the
    static head now and then, see :class:`~hami_trio.monitor.snapshot.TickDecoder`) and the
    usage read (:meth:`read_usage`, :meth:`totals_without`: the tail and the live slots).
    :meth:`write_controls` stores aligned words at the offsets of the tick's last read.

    The tick's methods have one owner (the lister, on the event loop); the usage read's
    another (one usage read at a time, in a worker thread).  They may overlap: a usage read
    :meth:`pin` s the handle first, and a :meth:`close` while it is pinned closes the
    descriptor only when the last pin goes (:meth:`unpin`), so a read never goes through a
    descriptor number the kernel has meanwhile given to another file.
    """

    def __init__(self, fd: int, st: os.stat_result, display: str, *, writable: bool) -> None:
        self._fd = fd
        self.dev: int = st.st_dev
        self.ino: int = st.st_ino
        self.display = display
        self.writable = writable
        self._decoder = TickDecoder(phase=st.st_ino)
        self._usage = RegionDecoder()
        #: Bytes the latest :meth:`read` asked ``pread`` for (what the lister's work
        #: accounting charges for it: parsing is proportional to the bytes read).
        self.read_bytes = 0
        # The size the latest tick read started from, when its first range ends within
        # PROBE_SLACK of it (so the next read_probed can check it in that pread); else None.
        self._probe_size: int | None = None
        # The same for the usage read (its own decoder, its own last size).
        self._usage_probe: int | None = None
        # Usage reads holding the descriptor open, and whether close() waits for them.
        self._pins = 0
        self._closing = False

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
        """Whether :meth:`close` was called (the descriptor may still serve a pinned read)."""
        return self._fd < 0 or self._closing

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
        """Close the descriptor (idempotent); while a usage read holds a pin, when it ends."""
        with _LIFETIME:
            if self._fd < 0 or self._closing:
                return
            if self._pins:
                self._closing = True  # the last unpin closes it
                return
            fd, self._fd = self._fd, -1
        os.close(fd)

    def pin(self) -> bool:
        """Hold the descriptor open for a usage read (see the class docstring).

        Returns:
            False when the handle is closed (or closing): nothing to read through.
        """
        with _LIFETIME:
            if self._fd < 0 or self._closing:
                return False
            self._pins += 1
            return True

    def unpin(self) -> None:
        """Release a :meth:`pin`; the last one closes a handle :meth:`close` d meanwhile."""
        with _LIFETIME:
            if self._pins <= 0:
                raise RuntimeError(f"{self.display}: unpin() without pin()")
            self._pins -= 1
            if self._pins or not self._closing:
                return
            fd, self._fd = self._fd, -1
            self._closing = False
        os.close(fd)

    # -- reading ---------------------------------------------------------------------------

    def _shrank(self, got: int, length: int, offset: int) -> CacheFileRejected:
        return CacheFileRejected(
            RejectReason.TRUNCATED,
            f"{self.display} shrank while being read ({got} of {length} bytes at offset {offset})",
        )

    def read(self, size: int | None = None) -> TickSnapshot:
        """The tick's read: the tail (and the static head when due, see
        :class:`~hami_trio.monitor.snapshot.TickDecoder`), the loader rule applied there.

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
        self.read_bytes = 0
        return self._named(size, probe=False)

    def read_probed(self) -> TickSnapshot:
        """:meth:`read` at the size the file had last time, checked by the first ``pread``.

        That ``pread`` runs from the first range's offset through one byte past the last
        known end: exactly the bytes up to that end mean the size is unchanged; one more,
        that the file grew; fewer, that it shrank.  A changed size is asked with ``fstat``
        and the file decoded afresh, as :meth:`read` would.  Without a last size (no read
        yet, or one whose first range ends far from the end of the file) this is
        ``read(None)``.  Only the size is checked: the caller knows by other means that the
        name still denotes this file.

        Raises:
            CacheFileRejected: as :meth:`read`.
        """
        size = self._probe_size
        if size is None:
            return self.read()
        # The usual case, in one pass (this runs per container per tick): the tail through
        # one byte past the end, decoded; the rest of _read only when the size moved or the
        # decoder asks for the head.
        decoder = self._decoder
        offset, length = decoder.start(size)
        want = size - offset + 1
        self.read_bytes = want
        try:
            data = os.pread(self._fd, want, offset)
        except OSError as exc:
            raise _io_rejection(self.display, "read", exc) from exc
        if len(data) != want - 1:
            self._probe_size = None
            return self._named(self.size(), probe=False)  # grown or shrunk: decode afresh
        try:
            step = decoder.feed(data if want - 1 == length else data[:length])
            while isinstance(step, tuple):  # the static head is due
                offset, length = step
                self.read_bytes += length
                data = self._pread(length, offset)
                if len(data) != length:
                    raise self._shrank(len(data), length, offset)
                step = decoder.feed(data)
            return step
        except CacheFileRejected as exc:
            raise self._renamed(exc) from None

    def _named(self, size: int, *, probe: bool) -> TickSnapshot:
        try:
            return self._read(size, probe)
        except CacheFileRejected as exc:
            raise self._renamed(exc) from None

    def _renamed(self, exc: CacheFileRejected) -> CacheFileRejected:
        if str(exc).startswith(self.display):
            return exc
        return CacheFileRejected(exc.reason, f"{self.display}: {exc}")

    def _pread(self, length: int, offset: int) -> bytes:
        try:
            return os.pread(self._fd, length, offset)
        except OSError as exc:
            raise _io_rejection(self.display, "read", exc) from exc

    def _read(self, size: int, probe: bool) -> TickSnapshot:
        return self._decode(self._decoder, size, probe, tick=True)

    def read_usage(self) -> UsageSnapshot:
        """The usage read: the tail, then the head through the live slots (the loader rule
        applied anew), decoded by this handle's own
        :class:`~hami_trio.monitor.snapshot.RegionDecoder`; the size is checked in the first
        ``pread`` as :meth:`read_probed` does, against the size of the last usage read.

        Call it only with the handle pinned (:meth:`pin`), from one thread at a time.

        Returns:
            The snapshot; the same object as last time if no byte it depends on changed.

        Raises:
            CacheFileRejected: as :meth:`read`.
        """
        try:
            size = self._usage_probe
            known = size is not None
            return self._decode(self._usage, self.size() if size is None else size, known)
        except CacheFileRejected as exc:
            raise self._renamed(exc) from None

    def _decode(self, decoder: _Decoder[T], size: int, probe: bool, *, tick: bool = False) -> T:
        """One conversation with ``decoder`` (the tick's or the usage read's) at ``size``:
        the ranges it names are read, each checked to have come back whole.

        With ``probe`` the first range is read through one byte past ``size``: a file that
        grew or shrank since is decoded afresh at the size it has now.  The size a next
        probed read may check is kept per reader (``tick``: the tick's, which also counts
        :attr:`read_bytes`; else the usage read's)."""
        if tick:
            self._probe_size = None
        else:
            self._usage_probe = None
        offset, length = decoder.start(size)
        if offset + length >= size - PROBE_SLACK:
            if tick:
                self._probe_size = size
            else:
                self._usage_probe = size
            if probe:
                want = size - offset + 1
                if tick:
                    self.read_bytes += want
                data = self._pread(want, offset)
                if len(data) != want - 1:
                    return self._decode(decoder, self.size(), False, tick=tick)
                step = decoder.feed(data[:length])
                if not isinstance(step, tuple):
                    return step
                offset, length = step
        while True:
            if tick:
                self.read_bytes += length
            data = self._pread(length, offset)
            if len(data) != length:
                raise self._shrank(len(data), length, offset)
            step = decoder.feed(data)
            if not isinstance(step, tuple):
                return step
            offset, length = step

    def totals_without(self, snapshot: UsageSnapshot, host_pids: frozenset[int]) -> SlotTotals:
        """Re-read the live slots and sum them without those whose host PID is in
        ``host_pids`` (``--exclude-exited-processes``; the usage read's cold path).

        The file is read afresh at the layout and slot count of ``snapshot`` (this handle's
        latest usage read); its header, limits and UUIDs are decoded again from the same
        bytes.  Call it only with the handle pinned, like :meth:`read_usage`.

        Raises:
            CacheFileRejected: the file changed size since ``snapshot``, shrank during the
                read, or cannot be read.
        """
        layout = LAYOUTS[snapshot.format]
        if self.size() != snapshot.file_size:
            raise CacheFileRejected(
                RejectReason.TRUNCATED, f"{self.display} changed size since it was read"
            )
        slots = clamp_proc_num(snapshot.proc_num)
        length = layout.body_size(slots)
        head = self._pread(length, 0)
        if len(head) != length:
            raise self._shrank(len(head), length, 0)
        return sum_slots_without(layout, head, slots, host_pids)

    # -- writing ---------------------------------------------------------------------------

    def write_controls(self, values: Sequence[tuple[ControlField, int]]) -> None:
        """Store control words (``recent_kernel``, ``utilization_switch``), one aligned
        4-byte ``pwrite`` each, at their offsets in the layout of the tick's last read.

        ``pwrite`` past the end would grow the tenant's file, so the words are written only
        while the file still has the size the decision was made on: two bytes read across
        the old end say it in one cheap system call (exactly one comes back only when the
        file ends there).

        Raises:
            ValueError: a value does not fit an int32.
            CacheFileRejected: read-only, no successful read yet, the size changed since, or
                ``io_error``.
        """
        if not self.writable:
            raise CacheFileRejected(RejectReason.IO_ERROR, f"{self.display} is open read-only")
        decoder = self._decoder
        layout = decoder.layout
        if layout is None:
            raise CacheFileRejected(
                RejectReason.IO_ERROR, f"{self.display}: no successful read to write against"
            )
        stores = []
        for field, value in values:
            data = _SMALL_WORDS.get(value)
            if data is None:
                data = _pack(_I32, value, field.value)
            offset = layout.recent_kernel if field is _RECENT else layout.utilization_switch
            stores.append((offset, data))
        size = decoder.size
        assert size is not None  # a decode succeeded (layout is set)
        fd = self._fd
        try:
            probe = os.pread(fd, 2, size - 1)
            if len(probe) != 1:
                raise CacheFileRejected(
                    RejectReason.TRUNCATED, f"{self.display} changed size since it was read"
                )
            for offset, data in stores:
                if os.pwrite(fd, data, offset) != 4:  # pragma: no cover - no short writes
                    raise CacheFileRejected(RejectReason.IO_ERROR, f"{self.display}: short write")
        except OSError as exc:
            raise _io_rejection(self.display, "write", exc) from exc


def read_region_file(path: str | os.PathLike[str]) -> UsageSnapshot:
    """Read one ``.cache`` file read-only, usage and all (the ``inspect`` command).

    Raises:
        CacheFileRejected: the file is missing, not a regular file, or does not load.
    """
    display = os.fspath(path)
    try:
        handle = RegionHandle.open_path(path, writable=False)
    except FileNotFoundError as exc:
        raise CacheFileRejected(RejectReason.IO_ERROR, f"{display}: no such file") from exc
    try:
        return handle.read_usage()
    finally:
        handle.close()
