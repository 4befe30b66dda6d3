"""Write HAMi-core shared regions (``.cache`` files) from Python: tests, benchmark, demo.

How this works: :class:`RegionSpec` describes a region field by field with a freshly
initialised HAMi-core region's defaults; :func:`build_region` returns the file's bytes
(``sizeof + 1`` by default), :func:`write_region` writes them sparse by default (header, used
slots and tail only, so thousands of 2 MB files cost a few MB), and
:class:`SimulatedWorkload` updates a written file in place as HAMi-core does at run time.
Offsets come from :mod:`hami_trio.monitor.layout`; a test checks the output byte for byte
against a C program's files.  Values must fit their C types, else ``ValueError``.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami_trio.monitor.layout import (
    LAYOUTS,
    MAGIC,
    MAX_DEVICES,
    MAX_SLOTS,
    USED_FIELDS,
    UTIL_FIELDS,
    UUID_SIZE,
    Format,
    Layout,
)

__all__ = [
    "MemoryUse",
    "ProcSlot",
    "RegionSpec",
    "SimulatedWorkload",
    "UtilUse",
    "build_region",
    "region_pieces",
    "write_region",
]

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _check(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{name}={value} does not fit its C type ({low}..{high})")
    return value


def _u64(name: str, value: int) -> bytes:
    return _U64.pack(_check(name, value, 0, (1 << 64) - 1))


def _i32(name: str, value: int) -> bytes:
    return _I32.pack(_check(name, value, -(1 << 31), (1 << 31) - 1))


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """One ``used[d]`` entry of a process slot (bytes on device ``d``)."""

    context_size: int = 0
    module_size: int = 0
    data_size: int = 0
    offset: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class UtilUse:
    """One ``device_util[d]`` entry of a process slot (percent)."""

    dec_util: int = 0
    enc_util: int = 0
    sm_util: int = 0


@dataclass(frozen=True, slots=True)
class ProcSlot:
    """One process slot.  ``status``: 1 attached, 2 swapped, 0 exited (not summed).

    ``used`` and ``util`` give devices 0, 1, ... in order (at most 16); missing ones are 0.
    """

    pid: int = 0
    hostpid: int = 0
    status: int = 1
    used: Sequence[MemoryUse] = ()
    util: Sequence[UtilUse] = ()
    monitorused: Sequence[int] = ()
    seqlock: int = 0  # v1 only

    def encode(self, layout: Layout) -> bytes:
        """The slot's ``layout.slot_size`` bytes.

        Raises:
            ValueError: a value does not fit its C type, or more than 16 devices are given.
        """
        if max(len(self.used), len(self.util), len(self.monitorused)) > MAX_DEVICES:
            raise ValueError(f"a process slot has at most {MAX_DEVICES} devices")
        buf = bytearray(layout.slot_size)
        buf[0:4] = _i32("pid", self.pid)
        buf[4:8] = _i32("hostpid", self.hostpid)
        for d, use in enumerate(self.used):
            base = layout.slot_used + d * layout.used_stride
            for name, off in USED_FIELDS.items():
                buf[base + off : base + off + 8] = _u64(name, getattr(use, name))
        monitorused = layout.slot_field("monitorused")
        assert monitorused is not None
        for d, value in enumerate(self.monitorused):
            base = monitorused[0] + 8 * d
            buf[base : base + 8] = _u64("monitorused", value)
        for d, util in enumerate(self.util):
            base = layout.slot_util + d * layout.util_stride
            for name, off in UTIL_FIELDS.items():
                buf[base + off : base + off + 8] = _u64(name, getattr(util, name))
        buf[layout.slot_status : layout.slot_status + 4] = _i32("status", self.status)
        seqlock = layout.slot_field("seqlock")
        if seqlock is not None:
            buf[seqlock[0] : seqlock[0] + 8] = _u64("seqlock", self.seqlock)
        elif self.seqlock:
            raise ValueError("v0 process slots have no seqlock")
        return bytes(buf)


@dataclass(frozen=True, slots=True)
class RegionSpec:
    """A whole shared region.  Defaults: an initialised v1 region with one device and no
    process attached, priority 1 (HAMi-core's default).

    ``proc_num`` defaults to ``len(procs)``; set it explicitly to simulate stale or hostile
    values (slots beyond ``procs`` are zero).  ``uuids`` entries are text (UTF-8 encoded) or
    raw bytes (up to 96, NUL-padded).  ``major``/``minor`` are ignored for v0, which has no
    version words.  ``trailing_nul`` adds the one byte HAMi-core writes at ``sizeof``.
    """

    format: Format = Format.V1
    magic: int = MAGIC
    major: int = 1
    minor: int = 2
    sm_init_flag: int = 0
    owner_pid: int = 0
    num: int = 1
    uuids: Sequence[str | bytes] = ()
    limits: Sequence[int] = ()
    sm_limits: Sequence[int] = ()
    procs: Sequence[ProcSlot] = field(default_factory=tuple)
    proc_num: int | None = None
    utilization_switch: int = 0
    recent_kernel: int = 0
    priority: int = 1
    last_kernel_time: int = 0
    trailing_nul: bool = True

    @property
    def layout(self) -> Layout:
        """The layout of :attr:`format`."""
        return LAYOUTS[self.format]

    @property
    def file_size(self) -> int:
        """Size of the written file."""
        return self.layout.sizeof + (1 if self.trailing_nul else 0)


def _uuid_bytes(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if len(raw) > UUID_SIZE:
        raise ValueError(f"a UUID is at most {UUID_SIZE} bytes, got {len(raw)}")
    return raw.ljust(UUID_SIZE, b"\0")


def region_pieces(spec: RegionSpec) -> list[tuple[int, bytes]]:
    """The non-zero parts of the region as ``(offset, bytes)`` pieces, in offset order.

    Everything not covered is zero.  :func:`build_region` and :func:`write_region` both use
    this, so the dense and the sparse file are the same bytes.

    Raises:
        ValueError: a value does not fit its C type, or too many devices/slots are given.
    """
    layout = spec.layout
    if len(spec.procs) > MAX_SLOTS:
        raise ValueError(f"at most {MAX_SLOTS} process slots")
    for name, values in (("uuids", spec.uuids), ("limits", spec.limits)):
        if len(values) > MAX_DEVICES:
            raise ValueError(f"at most {MAX_DEVICES} {name}")
    if len(spec.sm_limits) > MAX_DEVICES:
        raise ValueError(f"at most {MAX_DEVICES} sm_limits")

    head = bytearray(layout.procs)
    head[0:4] = _i32("magic", spec.magic)
    if layout.has_version:
        head[4:8] = _U32.pack(_check("major", spec.major, 0, (1 << 32) - 1))
        head[8:12] = _U32.pack(_check("minor", spec.minor, 0, (1 << 32) - 1))
    sm_init = layout.field("sm_init_flag")
    owner = layout.field("owner_pid")
    assert sm_init is not None
    assert owner is not None
    head[sm_init[0] : sm_init[0] + 4] = _i32("sm_init_flag", spec.sm_init_flag)
    head[owner[0] : owner[0] + 8] = _u64("owner_pid", spec.owner_pid)
    head[layout.num : layout.num + 8] = _u64("num", spec.num)
    for i, uuid in enumerate(spec.uuids):
        start = layout.uuids + i * UUID_SIZE
        head[start : start + UUID_SIZE] = _uuid_bytes(uuid)
    for i, value in enumerate(spec.limits):
        head[layout.limit + 8 * i : layout.limit + 8 * i + 8] = _u64("limit", value)
    for i, value in enumerate(spec.sm_limits):
        head[layout.sm_limit + 8 * i : layout.sm_limit + 8 * i + 8] = _u64("sm_limit", value)

    slots = b"".join(slot.encode(layout) for slot in spec.procs)
    tail = bytearray(layout.tail_size)
    proc_num = len(spec.procs) if spec.proc_num is None else spec.proc_num
    tail[0:4] = _i32("proc_num", proc_num)
    tail[4:8] = _i32("utilization_switch", spec.utilization_switch)
    tail[8:12] = _i32("recent_kernel", spec.recent_kernel)
    tail[12:16] = _i32("priority", spec.priority)
    if layout.last_kernel_time is not None:
        tail[16:24] = _u64("last_kernel_time", spec.last_kernel_time)
    elif spec.last_kernel_time:
        raise ValueError("v0 regions have no last_kernel_time")
    return [(0, bytes(head) + slots), (layout.tail_offset, bytes(tail))]


def build_region(spec: RegionSpec) -> bytearray:
    """The whole file's bytes (``spec.file_size`` of them).

    Raises:
        ValueError: see :func:`region_pieces`.
    """
    data = bytearray(spec.file_size)
    for offset, piece in region_pieces(spec):
        data[offset : offset + len(piece)] = piece
    return data


def write_region(
    path: str | os.PathLike[str],
    spec: RegionSpec,
    *,
    sparse: bool = True,
    magic_last: bool = False,
) -> None:
    """Create or overwrite ``path`` with the region (mode 0666 before umask, like HAMi-core).

    Args:
        path: the file to write.
        spec: the region.
        sparse: write only the non-zero pieces and extend the file with ``ftruncate`` (the
            bytes read back are identical; disk use is a few KiB per file).
        magic_last: initialise like HAMi-core: everything else first (magic 0), then the
            4-byte magic in a last write, so a concurrent reader never sees the magic on a
            half-written region.

    Raises:
        ValueError: see :func:`region_pieces`.
        OSError: the file cannot be written.
    """
    pieces = region_pieces(spec)
    magic = pieces[0][1][:4]
    if magic_last:
        pieces[0] = (0, bytes(4) + pieces[0][1][4:])
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        if sparse:
            for offset, piece in pieces:
                os.pwrite(fd, piece, offset)
            os.ftruncate(fd, spec.file_size)
        else:
            data = bytearray(spec.file_size)
            for offset, piece in pieces:
                data[offset : offset + len(piece)] = piece
            os.pwrite(fd, data, 0)
        if magic_last:
            os.pwrite(fd, magic, 0)
    finally:
        os.close(fd)


class SimulatedWorkload:
    """Change a written region in place the way HAMi-core does while CUDA work runs.

    Each method is one ``pwrite`` at the field's offset, so a monitor reading concurrently
    sees the same kind of updates it sees from a real ``libvgpu.so``.  Used by the local demo
    (no GPU) and by benchmarks that need files that change between ticks.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: Format = Format.V1) -> None:
        self._path = os.fspath(path)
        self._layout = LAYOUTS[fmt]

    @property
    def path(self) -> str:
        """The file this workload writes."""
        return self._path

    def _write(self, offset: int, data: bytes) -> None:
        fd = os.open(self._path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def launch_kernel(self, now: float | None = None) -> None:
        """What HAMi-core does on a kernel launch: ``recent_kernel = 2`` and, in v1,
        ``last_kernel_time = now`` (Unix seconds)."""
        self._write(self._layout.recent_kernel, _i32("recent_kernel", 2))
        if self._layout.last_kernel_time is not None:
            stamp = int(time.time() if now is None else now)
            self._write(self._layout.last_kernel_time, _u64("last_kernel_time", stamp))

    def set_slot(self, index: int, slot: ProcSlot) -> None:
        """Overwrite process slot ``index`` (0..1023).

        Raises:
            ValueError: ``index`` out of range or a value that does not fit.
        """
        _check("slot index", index, 0, MAX_SLOTS - 1)
        self._write(self._layout.procs + index * self._layout.slot_size, slot.encode(self._layout))

    def set_proc_num(self, value: int) -> None:
        """Set ``proc_num`` (the number of slots in use)."""
        self._write(self._layout.proc_num, _i32("proc_num", value))

    def set_priority(self, value: int) -> None:
        """Set ``priority`` (``CUDA_TASK_PRIORITY``; lower is more important)."""
        self._write(self._layout.priority, _i32("priority", value))

    def read_control(self) -> tuple[int, int]:
        """``(recent_kernel, utilization_switch)`` as the monitor last left them."""
        fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            recent = os.pread(fd, 4, self._layout.recent_kernel)
            switch = os.pread(fd, 4, self._layout.utilization_switch)
        finally:
            os.close(fd)
        return _I32.unpack(recent)[0], _I32.unpack(switch)[0]
