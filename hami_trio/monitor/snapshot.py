"""Immutable usage snapshots of one shared region, parsed from bytes (pure).

The monitor never keeps a live view into a tenant's file.  Each tick it copies the few byte
ranges it needs (:mod:`hami_trio.monitor.region` does the ``pread``) and this module turns
them into a :class:`UsageSnapshot`: frozen dataclasses that the feedback step, the metrics
collector and the ``inspect`` command share without locks.

What is read, for a region with ``k = clamp(proc_num, 0, 1024)`` live slots:

- the *head*: bytes ``[0, procs + k * slot_size)`` - header, device count, UUIDs, limits and
  the first ``k`` process slots (about 17 KiB for 8 slots in v1, not the whole 2 MB);
- the *tail*: ``proc_num, utilization_switch, recent_kernel, priority`` and, in v1,
  ``last_kernel_time`` (16 or 24 bytes).

Per-device memory and SM utilisation are sums over the live slots whose ``status != 0``, in
uint64 arithmetic (wrapping modulo 2**64, as HAMi-core's and HAMi's own sums do).  Only the
first ``device_count = min(num, 16)`` devices get sums; all 16 UUIDs are kept because the
feedback step, like upstream, looks at every UUID slot.
"""

from __future__ import annotations

import enum
import functools
import struct
from dataclasses import dataclass

from hami_trio.monitor.layout import (
    HEADER,
    MAX_DEVICES,
    USED_FIELDS,
    UTIL_FIELDS,
    UUID_SIZE,
    Format,
    Layout,
    clamp_proc_num,
    classify,
)

__all__ = [
    "DeviceUUID",
    "DeviceUsage",
    "SlotTotals",
    "StaticInfo",
    "UUIDState",
    "UsageSnapshot",
    "parse_region",
    "parse_static",
    "parse_usage",
    "read_tail",
    "slot_rows",
    "slot_struct",
    "sum_rows",
    "sum_slots",
]

_U64 = struct.Struct("<Q")
_LIMITS = struct.Struct(f"<{MAX_DEVICES}Q")
_TAIL_V0 = struct.Struct("<iiii")
_TAIL_V1 = struct.Struct("<iiiiQ")
_MASK64 = (1 << 64) - 1
_LABEL_BYTES = 40  # HAMi's metrics label uses the first 40 bytes of the UUID


class UUIDState(enum.Enum):
    """What a 96-byte UUID slot holds."""

    UNUSED = "unused"  # first byte is 0: no device in this slot
    VALID = "valid"  # text before the first NUL is valid UTF-8
    INVALID_UTF8 = "invalid_utf8"  # set, but not UTF-8 (corrupt or hostile); never crashes


@dataclass(frozen=True, slots=True, repr=False)
class DeviceUUID:
    """One ``uuids[i]`` slot: the raw 96 bytes and what they decode to.

    ``raw`` is the identity HAMi's feedback uses (two containers share a GPU when their raw
    slots are equal).  ``text`` is the UTF-8 text before the first NUL, or None when the slot
    is unused or not UTF-8.
    """

    raw: bytes
    state: UUIDState
    text: str | None

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def from_raw(raw: bytes) -> DeviceUUID:
        """Decode a 96-byte slot (memoised: the same GPUs appear in many containers).

        Raises:
            ValueError: ``raw`` is not exactly 96 bytes.
        """
        if len(raw) != UUID_SIZE:
            raise ValueError(f"a UUID slot is {UUID_SIZE} bytes, got {len(raw)}")
        if raw[0] == 0:
            return DeviceUUID(raw, UUIDState.UNUSED, None)
        try:
            text = raw.split(b"\0", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            return DeviceUUID(raw, UUIDState.INVALID_UTF8, None)
        return DeviceUUID(raw, UUIDState.VALID, text)

    def __repr__(self) -> str:
        shown = self.raw.rstrip(b"\0")
        return f"DeviceUUID({shown!r}, {self.state.value})"

    @property
    def valid(self) -> bool:
        """HAMi's ``IsValidUUID``: the first byte is not NUL (UTF-8 validity not required)."""
        return self.state is not UUIDState.UNUSED

    @property
    def label(self) -> str | None:
        """HAMi's metrics label: the first 40 bytes with NULs removed, if UTF-8, else None."""
        if self.state is UUIDState.UNUSED:
            return None
        try:
            return self.raw[:_LABEL_BYTES].replace(b"\0", b"").decode("utf-8")
        except UnicodeDecodeError:
            return None


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device of a container: its limits and the sums over the live process slots."""

    index: int
    uuid: DeviceUUID
    memory_limit: int
    sm_limit: int
    memory_total: int
    context_size: int
    module_size: int
    buffer_size: int
    offset: int
    sm_util: int


@dataclass(frozen=True, slots=True)
class StaticInfo:
    """The part of a region that changes rarely: device count, UUIDs and limits."""

    num: int
    device_count: int
    uuids: tuple[DeviceUUID, ...]
    limits: tuple[int, ...]
    sm_limits: tuple[int, ...]
    device_keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """Everything the monitor knows about one region at one instant.

    ``devices`` has ``device_count`` entries; ``uuids`` always has 16 (every UUID slot, as
    the feedback step needs) and ``device_keys`` holds the raw bytes of those that are valid
    (first byte not NUL), in slot order - HAMi's device identity for Observe.
    ``major``/``minor`` are None for v0 (it has no version words).
    ``proc_num`` is the raw value from the file; ``active_slots`` counts the slots that were
    summed (index below the clamped ``proc_num`` and ``status != 0``).
    """

    format: Format
    major: int | None
    minor: int | None
    file_size: int
    device_count: int
    proc_num: int
    active_slots: int
    priority: int
    recent_kernel: int
    utilization_switch: int
    last_kernel_time: int
    devices: tuple[DeviceUsage, ...]
    uuids: tuple[DeviceUUID, ...]
    device_keys: tuple[bytes, ...]


def read_tail(
    layout: Layout, tail: bytes | bytearray | memoryview
) -> tuple[int, int, int, int, int]:
    """Decode the tail range of ``layout``.

    Returns:
        ``(proc_num, utilization_switch, recent_kernel, priority, last_kernel_time)``;
        ``last_kernel_time`` is 0 for v0.

    Raises:
        ValueError: ``tail`` is shorter than ``layout.tail_size``.
    """
    if len(tail) < layout.tail_size:
        raise ValueError(f"tail needs {layout.tail_size} bytes, got {len(tail)}")
    if layout.last_kernel_time is None:
        proc_num, switch, recent, priority = _TAIL_V0.unpack_from(tail)
        return proc_num, switch, recent, priority, 0
    values: tuple[int, int, int, int, int] = _TAIL_V1.unpack_from(tail)
    return values


def parse_static(layout: Layout, head: bytes | bytearray | memoryview) -> StaticInfo:
    """Decode ``num``, the 16 UUIDs and the limits from a head buffer.

    Raises:
        ValueError: ``head`` does not reach the process slots.
    """
    if len(head) < layout.procs:
        raise ValueError(f"head needs at least {layout.procs} bytes, got {len(head)}")
    (num,) = _U64.unpack_from(head, layout.num)
    data = bytes(head[layout.uuids : layout.uuids + MAX_DEVICES * UUID_SIZE])
    uuids = tuple(
        DeviceUUID.from_raw(data[i * UUID_SIZE : (i + 1) * UUID_SIZE]) for i in range(MAX_DEVICES)
    )
    return StaticInfo(
        num=num,
        device_count=min(num, MAX_DEVICES),
        uuids=uuids,
        limits=_LIMITS.unpack_from(head, layout.limit),
        sm_limits=_LIMITS.unpack_from(head, layout.sm_limit),
        device_keys=tuple(uuid.raw for uuid in uuids if uuid.valid),
    )


@dataclass(frozen=True, slots=True)
class SlotTotals:
    """The per-device sums over the live slots of one head buffer, and how many were live."""

    devices: tuple[DeviceUsage, ...]
    active_slots: int


# (format, device_count) -> slot struct; at most 2 x 17 entries.
_SLOT_STRUCTS: dict[tuple[Format, int], struct.Struct] = {}


def slot_struct(layout: Layout, device_count: int) -> struct.Struct:
    """A ``struct`` spanning exactly one slot that picks, in offset order: per device below
    ``device_count`` the five ``used`` words (context, module, data, offset, total), then per
    device ``sm_util``, then ``status``.  ``iter_unpack`` then reads every slot in C.
    Memoised per (format, device count): at most 2 x 17 of them."""
    codec = _SLOT_STRUCTS.get((layout.format, device_count))
    if codec is None:
        codec = _SLOT_STRUCTS[(layout.format, device_count)] = _build_slot_struct(
            layout, device_count
        )
    return codec


def _build_slot_struct(layout: Layout, device_count: int) -> struct.Struct:
    picks: list[tuple[int, str]] = []
    for d in range(device_count):
        base = layout.slot_used + d * layout.used_stride
        picks += [(base + off, "Q") for off in USED_FIELDS.values()]
    for d in range(device_count):
        picks.append((layout.slot_util + d * layout.util_stride + UTIL_FIELDS["sm_util"], "Q"))
    picks.append((layout.slot_status, "i"))
    fmt, pos = "<", 0
    for offset, code in picks:
        if offset < pos:  # pragma: no cover - the layouts put these in ascending order
            raise AssertionError(f"{layout.name} slot fields out of order at {offset}")
        fmt += f"{offset - pos}x{code}" if offset > pos else code
        pos = offset + struct.calcsize(code)
    fmt += f"{layout.slot_size - pos}x"
    return struct.Struct(fmt)


def slot_rows(
    layout: Layout, head: bytes | bytearray | memoryview, slots: int, device_count: int
) -> list[tuple[int, ...]]:
    """The fields the monitor uses from each of slots ``[0, slots)``, one tuple per slot:
    per device below ``device_count`` (context, module, data, offset, total), then per
    device ``sm_util``, then ``status`` (last).  A few hundred bytes of ints instead of the
    ~2 KB slot, so the reader can keep them to detect change cheaply.

    Raises:
        ValueError: ``head`` is too short for ``slots`` slots.
    """
    body_end = layout.body_size(slots)
    if len(head) < body_end:
        raise ValueError(f"head needs {body_end} bytes for {slots} slots, got {len(head)}")
    codec = slot_struct(layout, device_count)
    return list(codec.iter_unpack(memoryview(head)[layout.procs : body_end]))


def sum_rows(rows: list[tuple[int, ...]], static: StaticInfo) -> SlotTotals:
    """Sum :func:`slot_rows` over the slots whose status is not 0 (uint64, wrapping)."""
    count = static.device_count
    live = [row for row in rows if row[-1]]
    if live:
        sums = [sum(column) & _MASK64 for column in zip(*live, strict=True)]
    else:
        sums = [0] * (6 * count + 1)
    uuids, limits, sm_limits = static.uuids, static.limits, static.sm_limits
    sm_base = 5 * count
    # positional: (index, uuid, limit, sm_limit, total, context, module, buffer, offset, sm)
    devices = tuple(
        [
            DeviceUsage(
                d,
                uuids[d],
                limits[d],
                sm_limits[d],
                sums[5 * d + 4],
                sums[5 * d],
                sums[5 * d + 1],
                sums[5 * d + 2],
                sums[5 * d + 3],
                sums[sm_base + d],
            )
            for d in range(count)
        ]
    )
    return SlotTotals(devices, len(live))


def sum_slots(
    layout: Layout, head: bytes | bytearray | memoryview, slots: int, static: StaticInfo
) -> SlotTotals:
    """Sum memory and SM utilisation over slots ``[0, slots)`` whose status is not 0.

    Args:
        layout: the file's layout.
        head: bytes from offset 0 through at least ``layout.body_size(slots)``.
        slots: the clamped ``proc_num``.
        static: :func:`parse_static` of the same head.

    Raises:
        ValueError: ``head`` is too short for ``slots`` slots.
    """
    return sum_rows(slot_rows(layout, head, slots, static.device_count), static)


def parse_usage(
    layout: Layout,
    file_size: int,
    head: bytes | bytearray | memoryview,
    tail: bytes | bytearray | memoryview,
    static: StaticInfo | None = None,
    totals: SlotTotals | None = None,
) -> UsageSnapshot:
    """Build a snapshot from the head and tail ranges of a region (see the module docstring).

    Args:
        layout: the file's layout, from :func:`~hami_trio.monitor.layout.classify`.
        file_size: the file size the layout was chosen for (reported, not used to index).
        head: bytes ``[0, layout.body_size(clamp_proc_num(proc_num)))``; extra bytes are
            ignored, so a whole-file buffer works too.
        tail: the ``layout.tail_size`` bytes at ``layout.tail_offset``.
        static: :func:`parse_static` of the same head, if the caller cached it.
        totals: :func:`sum_slots` of the same head and slot count, if the caller cached it
            (the monitor changes ``recent_kernel`` every tick while the slots stay put).

    Raises:
        ValueError: a buffer is shorter than the ranges the tail's ``proc_num`` requires.
    """
    proc_num, switch, recent, priority, last_kernel = read_tail(layout, tail)
    if static is None:
        static = parse_static(layout, head)
    if totals is None:
        totals = sum_slots(layout, head, clamp_proc_num(proc_num), static)
    if layout.has_version:
        _, major, minor = HEADER.unpack_from(head)
        version: tuple[int | None, int | None] = (major, minor)
    else:
        version = (None, None)
    return UsageSnapshot(
        format=layout.format,
        major=version[0],
        minor=version[1],
        file_size=file_size,
        device_count=static.device_count,
        proc_num=proc_num,
        active_slots=totals.active_slots,
        priority=priority,
        recent_kernel=recent,
        utilization_switch=switch,
        last_kernel_time=last_kernel,
        devices=totals.devices,
        uuids=static.uuids,
        device_keys=static.device_keys,
    )


def parse_region(
    data: bytes | bytearray | memoryview, file_size: int | None = None
) -> UsageSnapshot:
    """Parse a whole ``.cache`` file held in memory (the loader rule, then the snapshot).

    Args:
        data: the file's bytes (at least up to the tail; a real file is ``sizeof + 1``).
        file_size: the size to classify by; defaults to ``len(data)``.

    Raises:
        CacheFileRejected: the loader rule rejects the file.
        ValueError: ``data`` is shorter than the layout chosen for ``file_size``.
    """
    size = len(data) if file_size is None else file_size
    layout = classify(size, data[:12])
    end = layout.tail_offset + layout.tail_size
    if len(data) < end:
        raise ValueError(f"{layout.name} data needs {end} bytes, got {len(data)}")
    return parse_usage(layout, size, data, data[layout.tail_offset : end])
