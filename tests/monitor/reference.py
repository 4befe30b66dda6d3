"""The reference decoder: a whole ``.cache`` file to a snapshot, the plain way (the oracle).

The monitor's :class:`~hami_trio.monitor.snapshot.RegionDecoder` reads only the ranges it
needs, unpacks the slots into flat tuples with one ``struct`` call, sums columns of them and
keeps what it summed to skip the work next time.  This module does none of that: it reads
every value it reports at the offset the layout tables give (which a test checks against
gcc), one value at a time, decodes each UUID slot by the rule itself, and adds the live
slots up in a loop; it shares no code with ``hami_trio.monitor.snapshot`` but the result
types.  The property tests, the exact tests (``test_snapshot_exact.py``) and the fuzz
targets compare the decoders with it.
"""

from __future__ import annotations

import struct

from hami_trio.monitor.layout import (
    HEADER,
    MAX_DEVICES,
    MAX_SLOTS,
    TAIL_MEMBERS,
    USED_FIELDS,
    UTIL_FIELDS,
    UUID_SIZE,
    Layout,
    classify,
)
from hami_trio.monitor.snapshot import (
    DeviceUsage,
    DeviceUUID,
    SlotTotals,
    TickSnapshot,
    UsageSnapshot,
    UUIDState,
)

__all__ = ["reference_region", "reference_sums", "reference_tick", "reference_uuid"]

_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_MASK64 = (1 << 64) - 1


def _word(data: bytes | bytearray | memoryview, offset: int, size: int) -> int:
    """The int32 (4 bytes) or uint64 (8 bytes) at ``offset``."""
    codec = _I32 if size == 4 else _U64
    value: int = codec.unpack_from(data, offset)[0]
    return value


def reference_sums(
    layout: Layout,
    data: bytes | bytearray | memoryview,
    slots: int,
    skip_host_pids: frozenset[int] = frozenset(),
) -> SlotTotals:
    """The sums over slots ``[0, slots)`` whose status is not 0 (and whose host PID is not
    in ``skip_host_pids``), device by device, slot by slot."""
    num = _word(data, layout.num, 8)
    count = min(num, MAX_DEVICES)
    uuids = _uuids(layout, data)
    live = []
    for index in range(slots):
        base = layout.procs + index * layout.slot_size
        if _word(data, base + layout.slot_status, 4) == 0:
            continue
        if _word(data, base + layout.slot_hostpid, 4) in skip_host_pids:
            continue
        live.append(base)

    def member(base: int, name: str, device: int) -> int:
        if name in USED_FIELDS:
            entry = base + layout.slot_used + device * layout.used_stride
            return _word(data, entry + USED_FIELDS[name], 8)
        entry = base + layout.slot_util + device * layout.util_stride
        return _word(data, entry + UTIL_FIELDS[name], 8)

    def total(name: str, device: int) -> int:
        return sum(member(base, name, device) for base in live) & _MASK64

    devices = []
    busy = []
    for d in range(count):
        devices.append(
            DeviceUsage(
                index=d,
                uuid=uuids[d],
                memory_limit=_word(data, layout.limit + 8 * d, 8),
                sm_limit=_word(data, layout.sm_limit + 8 * d, 8),
                memory_total=total("total", d),
                context_size=total("context_size", d),
                module_size=total("module_size", d),
                buffer_size=total("data_size", d),
                offset=total("offset", d),
                sm_util=total("sm_util", d),
            )
        )
        used = [base for base in live if member(base, "total", d) or member(base, "sm_util", d)]
        busy.append(len(used))
    return SlotTotals(
        devices=tuple(devices),
        active_slots=len(live),
        pids=tuple(_word(data, base + layout.slot_pid, 4) for base in live),
        host_pids=tuple(_word(data, base + layout.slot_hostpid, 4) for base in live),
        device_processes=tuple(busy),
    )


def reference_region(data: bytes | bytearray | memoryview) -> UsageSnapshot:
    """The snapshot of a whole file in memory (its size is ``len(data)``).

    Raises:
        CacheFileRejected: the loader rule rejects the file.
    """
    size = len(data)
    layout = classify(size, bytes(data[:12]))
    tail = {}
    for name in TAIL_MEMBERS:
        spot = layout.field(name)
        tail[name] = 0 if spot is None else _word(data, *spot)  # v0: no last_kernel_time
    slots = min(max(tail["proc_num"], 0), MAX_SLOTS)
    totals = reference_sums(layout, data, slots)
    uuids = _uuids(layout, data)
    major, minor = HEADER.unpack_from(data)[1:] if layout.has_version else (None, None)
    return UsageSnapshot(
        format=layout.format,
        major=major,
        minor=minor,
        file_size=size,
        device_count=min(_word(data, layout.num, 8), MAX_DEVICES),
        proc_num=tail["proc_num"],
        active_slots=totals.active_slots,
        priority=tail["priority"],
        recent_kernel=tail["recent_kernel"],
        utilization_switch=tail["utilization_switch"],
        last_kernel_time=tail["last_kernel_time"],
        devices=totals.devices,
        uuids=uuids,
        device_keys=tuple(uuid.raw for uuid in uuids if uuid.raw[0] != 0),
        pids=totals.pids,
        host_pids=totals.host_pids,
        device_processes=totals.device_processes,
    )


def reference_tick(data: bytes | bytearray | memoryview) -> TickSnapshot:
    """What a tick read of this whole file gives when its head was read: the snapshot's
    fields but the sums and the slots' PIDs.

    Raises:
        CacheFileRejected: the loader rule rejects the file.
    """
    usage = reference_region(data)
    return TickSnapshot(
        format=usage.format,
        major=usage.major,
        minor=usage.minor,
        file_size=usage.file_size,
        device_count=usage.device_count,
        proc_num=usage.proc_num,
        priority=usage.priority,
        recent_kernel=usage.recent_kernel,
        utilization_switch=usage.utilization_switch,
        last_kernel_time=usage.last_kernel_time,
        uuids=usage.uuids,
        device_keys=usage.device_keys,
    )


def reference_uuid(raw: bytes) -> DeviceUUID:
    """A UUID slot: unused when its first byte is NUL, else its text before the first NUL
    (``INVALID_UTF8`` when that is not UTF-8)."""
    if raw[0] == 0:
        return DeviceUUID(raw, UUIDState.UNUSED, None)
    try:
        text = raw.split(b"\0")[0].decode("utf-8")
    except UnicodeDecodeError:
        return DeviceUUID(raw, UUIDState.INVALID_UTF8, None)
    return DeviceUUID(raw, UUIDState.VALID, text)


def _uuids(layout: Layout, data: bytes | bytearray | memoryview) -> tuple[DeviceUUID, ...]:
    start = layout.uuids
    return tuple(
        reference_uuid(bytes(data[start + i * UUID_SIZE : start + (i + 1) * UUID_SIZE]))
        for i in range(MAX_DEVICES)
    )
