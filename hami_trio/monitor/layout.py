"""The byte layouts of HAMi-core's shared region (``.cache`` file) and the loader rule.

How this works: the two layouts in the field (v0 and v1) are one table,
:data:`REGION_TABLE` (one row per C member, one offset column per format), plus
:data:`SLOT_TABLE` for the per-process slot; a test checks every offset and size against
gcc's ``offsetof``/``sizeof``.  :func:`classify` decides a file's layout from its size and
12-byte header alone, exactly as HAMi's Go monitor does, plus the rejected mis-layout of
sizes 2008984 and 2008985.  Pure: no I/O, only integers and little-endian bytes.  The loader
rule's table and the layouts' history: docs/monitor.md (Loader rule).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from hami_trio.errors import CacheFileRejected

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "LAYOUTS",
    "MAGIC",
    "MAX_DEVICES",
    "MAX_SLOTS",
    "MISLAYOUT_SIZES",
    "REGION_TABLE",
    "SLOT_TABLE",
    "TAIL_INDEX",
    "TAIL_MEMBERS",
    "UUID_SIZE",
    "ControlField",
    "Format",
    "Layout",
    "RejectReason",
    "clamp_proc_num",
    "classify",
    "is_initialising",
    "layout_for_size",
]

#: ``initialized_flag`` of a fully initialised region (HAMi-core writes it last).
MAGIC = 19920718
#: The header the loader reads: ``int32 magic, int32 major, int32 minor``.
HEADER = struct.Struct("<iii")
HEADER_SIZE = HEADER.size
#: Device slots in the region (``uuids``, ``limit``, ``sm_limit``, per-slot ``used``).
MAX_DEVICES = 16
#: Process slots in the region; ``proc_num`` is clamped to this.
MAX_SLOTS = 1024
#: Bytes per device UUID (NVML UUID, NUL-padded).
UUID_SIZE = 96
#: File sizes of a short-lived HAMi-core build (Mar-Apr 2026, minor 1) whose v1 has shifted
#: offsets: sizeof 2008984, written as 2008985 bytes.  Upstream misreads it; we refuse it.
MISLAYOUT_SIZES = frozenset({2008984, 2008985})


class Format(enum.Enum):
    """The two shared-region layouts."""

    V0 = "v0"
    V1 = "v1"


class ControlField(enum.Enum):
    """The two 32-bit words the monitor writes back."""

    RECENT_KERNEL = "recent_kernel"
    UTILIZATION_SWITCH = "utilization_switch"

    def offset(self, layout: Layout) -> int:
        """The word's offset in ``layout`` (4-byte aligned in both formats)."""
        if self is ControlField.RECENT_KERNEL:
            return layout.recent_kernel
        return layout.utilization_switch


class RejectReason(enum.StrEnum):
    """Why a ``.cache`` file was not used; the ``reason`` label of the rejection counter."""

    TOO_SMALL = "too_small"
    MAGIC = "magic"
    UNKNOWN_VERSION = "unknown_version"
    NOT_REGULAR_FILE = "not_regular_file"
    HARD_LINK = "hard_link"
    REPLACED = "replaced"
    TRUNCATED = "truncated"
    IO_ERROR = "io_error"
    TOO_MANY_FILES = "too_many_files"


# One row per member of the C struct, in declaration order:
#   (name, v0 offset, v0 size, v1 offset, v1 size); None = the member does not exist.
# v0 is HAMi-core Apr-Aug 2024, v1 the current layout (major 1, minor 1 or 2).
REGION_TABLE: tuple[tuple[str, int | None, int | None, int | None, int | None], ...] = (
    ("initialized_flag", 0, 4, 0, 4),
    ("major_version", None, None, 4, 4),
    ("minor_version", None, None, 8, 4),
    ("sm_init_flag", 4, 4, 12, 4),
    ("owner_pid", 8, 8, 16, 8),
    ("sem", 16, 32, 24, 32),
    ("num", 48, 8, 56, 8),
    ("uuids", 56, MAX_DEVICES * UUID_SIZE, 64, MAX_DEVICES * UUID_SIZE),
    ("limit", 1592, 8 * MAX_DEVICES, 1600, 8 * MAX_DEVICES),
    ("sm_limit", 1720, 8 * MAX_DEVICES, 1728, 8 * MAX_DEVICES),
    ("procs", 1848, 1168 * MAX_SLOTS, 1856, 1960 * MAX_SLOTS),
    ("proc_num", 1197880, 4, 2008896, 4),
    ("utilization_switch", 1197884, 4, 2008900, 4),
    ("recent_kernel", 1197888, 4, 2008904, 4),
    ("priority", 1197892, 4, 2008908, 4),
    ("last_kernel_time", None, None, 2008912, 8),
    ("sem_postinit", None, None, 2008920, 32),
    # sizeof(the whole struct), as a pseudo-row so the C check covers it too.
    ("sizeof", None, 1197896, None, 2008952),
)

# The per-process slot, same shape: (name, v0 offset, v0 size, v1 offset, v1 size).
# ``used[16]`` entries are {context_size, module_size, data_size, offset, total} (v1 adds
# unused[3]); ``device_util[16]`` entries are {dec_util, enc_util, sm_util} (v1 adds unused[3]).
SLOT_TABLE: tuple[tuple[str, int | None, int | None, int | None, int | None], ...] = (
    ("pid", 0, 4, 0, 4),
    ("hostpid", 4, 4, 4, 4),
    ("used", 8, 40 * MAX_DEVICES, 8, 64 * MAX_DEVICES),
    ("monitorused", 648, 8 * MAX_DEVICES, 1032, 8 * MAX_DEVICES),
    ("device_util", 776, 24 * MAX_DEVICES, 1160, 48 * MAX_DEVICES),
    ("status", 1160, 4, 1928, 4),
    ("seqlock", None, None, 1936, 8),
    ("unused", None, None, 1944, 16),
    ("sizeof", None, 1168, None, 1960),
)

# Offsets inside one used[] entry and one device_util[] entry (identical in both formats).
USED_FIELDS: Mapping[str, int] = MappingProxyType(
    {"context_size": 0, "module_size": 8, "data_size": 16, "offset": 24, "total": 32}
)
UTIL_FIELDS: Mapping[str, int] = MappingProxyType({"dec_util": 0, "enc_util": 8, "sm_util": 16})


def _members(first: str, last: str) -> tuple[str, ...]:
    names = [row[0] for row in REGION_TABLE]
    return tuple(names[names.index(first) : names.index(last) + 1])


#: The members after the process slots that the monitor reads (the tail range), in the
#: table's order.  ``sem_postinit`` follows them and is not read.
TAIL_MEMBERS: tuple[str, ...] = _members("proc_num", "last_kernel_time")


#: Where each tail member's value is in a decoded tail (the tuple ``tail_struct`` unpacks,
#: extended by ``tail_absent``), by name: readers index it through these, never by a number.
TAIL_INDEX: Mapping[str, int] = MappingProxyType({name: i for i, name in enumerate(TAIL_MEMBERS)})

#: The ``struct`` code of a tail member by its size: its 4-byte members are C ``int32``, its
#: 8-byte one (``last_kernel_time``) ``uint64``.
_TAIL_CODES: Mapping[int, str] = MappingProxyType({4: "i", 8: "Q"})


@dataclass(frozen=True, slots=True)
class Layout:
    """Absolute offsets of one format, derived from the tables (the hot paths use these).

    ``tail_offset``/``tail_size`` cover the :data:`TAIL_MEMBERS` the format has
    (``proc_num .. priority``, and ``last_kernel_time`` in v1): everything the monitor reads
    after the process slots, in one contiguous range.  ``tail_struct`` unpacks that range
    into the members the format has, in :data:`TAIL_MEMBERS` order; ``tail_absent`` holds a
    0 for each one it lacks (they come last): ``unpacked + tail_absent`` has every member, at
    its :data:`TAIL_INDEX`.
    """

    format: Format
    sizeof: int
    has_version: bool
    num: int
    uuids: int
    limit: int
    sm_limit: int
    procs: int
    slot_size: int
    slot_pid: int
    slot_hostpid: int
    slot_used: int
    used_stride: int
    slot_util: int
    util_stride: int
    slot_status: int
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int | None
    tail_offset: int
    tail_size: int
    tail_struct: struct.Struct
    tail_absent: tuple[int, ...]

    @property
    def name(self) -> str:
        """``"v0"`` or ``"v1"``."""
        return self.format.value

    def body_size(self, active_slots: int) -> int:
        """Bytes from offset 0 through the first ``active_slots`` process slots."""
        return self.procs + active_slots * self.slot_size

    def field(self, name: str) -> tuple[int, int] | None:
        """(offset, size) of a region member from :data:`REGION_TABLE`, None if absent."""
        return _lookup(REGION_TABLE, self.format, name)

    def slot_field(self, name: str) -> tuple[int, int] | None:
        """(offset, size) of a process-slot member from :data:`SLOT_TABLE`, None if absent."""
        return _lookup(SLOT_TABLE, self.format, name)


def _lookup(
    table: tuple[tuple[str, int | None, int | None, int | None, int | None], ...],
    fmt: Format,
    name: str,
) -> tuple[int, int] | None:
    for row_name, off0, size0, off1, size1 in table:
        if row_name == name:
            offset, size = (off0, size0) if fmt is Format.V0 else (off1, size1)
            if size is None:
                return None
            return (offset if offset is not None else 0, size)
    raise KeyError(name)


def _build(fmt: Format) -> Layout:
    def off(name: str) -> int:
        found = _lookup(REGION_TABLE, fmt, name)
        assert found is not None, name
        return found[0]

    def slot_off(name: str) -> int:
        found = _lookup(SLOT_TABLE, fmt, name)
        assert found is not None, name
        return found[0]

    def size(table: tuple[tuple[str, int | None, int | None, int | None, int | None], ...]) -> int:
        found = _lookup(table, fmt, "sizeof")
        assert found is not None
        return found[1]

    used = _lookup(SLOT_TABLE, fmt, "used")
    util = _lookup(SLOT_TABLE, fmt, "device_util")
    assert used is not None
    assert util is not None
    lkt = _lookup(REGION_TABLE, fmt, "last_kernel_time")
    tail_offset, tail_format, tail_end, absent = off(TAIL_MEMBERS[0]), "<", -1, 0
    for name in TAIL_MEMBERS:
        found = _lookup(REGION_TABLE, fmt, name)
        if found is None:
            absent += 1
            continue
        if absent:  # pragma: no cover - the tables put the members a format lacks last
            raise AssertionError(f"{fmt.value}: tail member {name} after an absent one")
        at, width = found
        gap = at - (tail_offset if tail_end < 0 else tail_end)
        tail_format += f"{gap}x" * (gap > 0) + _TAIL_CODES[width]
        tail_end = at + width
    return Layout(
        format=fmt,
        sizeof=size(REGION_TABLE),
        has_version=_lookup(REGION_TABLE, fmt, "major_version") is not None,
        num=off("num"),
        uuids=off("uuids"),
        limit=off("limit"),
        sm_limit=off("sm_limit"),
        procs=off("procs"),
        slot_size=size(SLOT_TABLE),
        slot_pid=slot_off("pid"),
        slot_hostpid=slot_off("hostpid"),
        slot_used=used[0],
        used_stride=used[1] // MAX_DEVICES,
        slot_util=util[0],
        util_stride=util[1] // MAX_DEVICES,
        slot_status=slot_off("status"),
        proc_num=tail_offset,
        utilization_switch=off("utilization_switch"),
        recent_kernel=off("recent_kernel"),
        priority=off("priority"),
        last_kernel_time=lkt[0] if lkt is not None else None,
        tail_offset=tail_offset,
        tail_size=tail_end - tail_offset,
        tail_struct=struct.Struct(tail_format),
        tail_absent=(0,) * absent,
    )


#: The layout of each format.
LAYOUTS: Mapping[Format, Layout] = MappingProxyType({fmt: _build(fmt) for fmt in Format})
V0 = LAYOUTS[Format.V0]
V1 = LAYOUTS[Format.V1]


def layout_for_size(size: int) -> Layout | None:
    """The only layout a file of ``size`` bytes can have, before its header is read.

    v0 is chosen by size alone; v1 additionally needs ``major == 1`` (checked by
    :func:`classify`).  None: no layout fits this size (the file will be rejected).
    """
    if V0.sizeof <= size < V1.sizeof:
        return V0
    if size >= V1.sizeof and size not in MISLAYOUT_SIZES:
        return V1
    return None


#: The reason given for a file whose magic is still 0: HAMi-core creates the file,
#: sizes it and writes the magic last, so a new file reads as zeros for a moment.
_MAGIC_ZERO: Final = (
    "HAMi-core has not finished initialising it (it loads once it has), or it is not a "
    "HAMi-core shared-region file"
)


def is_initialising(exc: CacheFileRejected) -> bool:
    """Whether a rejection is of a file whose magic is still 0 (see :func:`classify`)."""
    return exc.reason == RejectReason.MAGIC and _MAGIC_ZERO in str(exc)


def classify(size: int, header: bytes | bytearray | memoryview) -> Layout:
    """Apply the loader rule (module docstring) to a file's size and first bytes.

    Args:
        size: the file size in bytes.
        header: at least the first 12 bytes of the file (more is ignored); may be shorter
            only when ``size < 12``.

    Returns:
        The file's layout.

    Raises:
        CacheFileRejected: reason ``too_small``, ``magic`` or ``unknown_version``; the message
            names the size and the values found.
    """
    if size < HEADER_SIZE:
        raise CacheFileRejected(
            RejectReason.TOO_SMALL, f"cache file size {size} too small (< {HEADER_SIZE} bytes)"
        )
    if len(header) < HEADER_SIZE:
        raise ValueError(f"classify needs the first {HEADER_SIZE} bytes, got {len(header)}")
    magic, major, minor = HEADER.unpack_from(header)
    if magic == 0:
        raise CacheFileRejected(
            RejectReason.MAGIC,
            f"cache file magic flag not matched: found 0, expected {MAGIC} (size {size}): "
            f"{_MAGIC_ZERO}",
        )
    if magic != MAGIC:
        raise CacheFileRejected(
            RejectReason.MAGIC,
            f"cache file magic flag not matched: found {magic}, expected {MAGIC} "
            f"(size {size}, header version {major}.{minor}): not a HAMi-core shared-region "
            "file (every HAMi-core version writes that magic), or a damaged one",
        )
    if V0.sizeof <= size < V1.sizeof:
        return V0
    if size in MISLAYOUT_SIZES:
        raise CacheFileRejected(
            RejectReason.UNKNOWN_VERSION,
            f"unknown cache file size {size} version {major}.{minor} (the incompatible "
            "HAMi-core v1 mis-layout of 2008984 bytes; upgrade HAMi-core)",
        )
    if major == 1 and size >= V1.sizeof:
        return V1
    raise CacheFileRejected(
        RejectReason.UNKNOWN_VERSION, f"unknown cache file size {size} version {major}.{minor}"
    )


def clamp_proc_num(proc_num: int) -> int:
    """The number of process slots to read: ``proc_num`` clamped to ``0..MAX_SLOTS``.

    ``proc_num`` is tenant-writable; slots at index >= proc_num hold stale data.
    """
    return min(max(proc_num, 0), MAX_SLOTS)
