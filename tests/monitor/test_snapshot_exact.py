"""The region decoders' exact outputs and messages, on explicit examples (mutation measure).

Every answer is checked against explicit numbers and against the reference decoder
(``tests/monitor/reference.py``: a plain restatement of the rules, docs/monitor.md "Usage
snapshot", that reads each field at its layout offset, one slot at a time, and shares no
code with ``hami_trio.monitor.snapshot``).  Only the public API is
used, so these tests hold whatever the module's private helpers are called.  They are the
covering tests of ``monitor/snapshot.py`` for ``tools/mutation/run`` (with
``tests/monitor/test_tick_decoder.py``) and run in about a second.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import pytest

from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import (
    LAYOUTS,
    MAGIC,
    USED_FIELDS,
    Format,
    Layout,
    RejectReason,
    classify,
)
from hami_trio.monitor.snapshot import (
    STATIC_REFRESH_TICKS,
    DeviceUsage,
    DeviceUUID,
    RegionDecoder,
    SlotTotals,
    StaticInfo,
    TickDecoder,
    TickSnapshot,
    UsageSnapshot,
    UUIDState,
    parse_region,
    parse_static,
    read_tail,
    sum_slots_without,
)
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, build_region
from tests.monitor.reference import reference_region, reference_sums, reference_tick
from tests.monitor.regionfile import Decoder, File

V0 = LAYOUTS[Format.V0]
V1 = LAYOUTS[Format.V1]
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


# -- helpers -----------------------------------------------------------------------------


def refusal(call: Callable[[], object]) -> str:
    """The whole message of the ValueError ``call`` raises (compared whole by the caller)."""
    with pytest.raises(ValueError) as info:  # noqa: PT011 - the caller compares the message
        call()
    return str(info.value)


# -- driving the decoders ------------------------------------------------------------------


def slot_at(layout: Layout, slot: int, field: int) -> int:
    return layout.procs + slot * layout.slot_size + field


def used_at(layout: Layout, slot: int, device: int, name: str) -> int:
    return slot_at(layout, slot, layout.slot_used + device * layout.used_stride + USED_FIELDS[name])


def sm_at(layout: Layout, slot: int, device: int) -> int:
    return slot_at(layout, slot, layout.slot_util + device * layout.util_stride + 16)


# -- the explicit example ------------------------------------------------------------------


def raw_uuid(text: bytes) -> bytes:
    return text.ljust(96, b"\0")


def example_procs() -> list[ProcSlot]:
    """Five slots: live, exited, swapped, live on device 1 by memory alone, past proc_num."""
    return [
        ProcSlot(
            pid=101,
            hostpid=5101,
            used=[MemoryUse(1, 2, 3, 4, 10), MemoryUse(5, 6, 7, 8, 20)],
            util=[UtilUse(dec_util=11, enc_util=12, sm_util=30)],
            monitorused=[999, 999],
        ),
        ProcSlot(pid=102, hostpid=5102, status=0, used=[MemoryUse(9, 9, 9, 9, 5000)]),
        ProcSlot(
            pid=103,
            hostpid=0,
            status=2,
            used=[MemoryUse(100, 200, 300, 400, 1000)],
            util=[UtilUse(), UtilUse(sm_util=7)],
        ),
        ProcSlot(pid=104, hostpid=5104, used=[MemoryUse(), MemoryUse(total=40)]),
        ProcSlot(pid=105, hostpid=5105, used=[MemoryUse(total=77777)]),
    ]


def example(fmt: Format = Format.V1, **changes: object) -> bytearray:
    spec: dict[str, object] = {
        "format": fmt,
        "minor": 3,
        "num": 2,
        "uuids": [b"GPU-1111", b"GPU-2222", b"", b"\xff\xfe-not-utf8"],
        "limits": [1000, 2000, 3000],
        "sm_limits": [50, 60, 70],
        "procs": example_procs(),
        "proc_num": 4,
        "utilization_switch": 1,
        "recent_kernel": 3,
        "priority": 5,
        "last_kernel_time": 0 if fmt is Format.V0 else 1_700_000_777,
        "sm_init_flag": 19,
        "owner_pid": 4242,
    }
    spec.update(changes)
    return build_region(RegionSpec(**spec))  # type: ignore[arg-type]


EXAMPLE_UUIDS = (
    DeviceUUID(raw_uuid(b"GPU-1111"), UUIDState.VALID, "GPU-1111"),
    DeviceUUID(raw_uuid(b"GPU-2222"), UUIDState.VALID, "GPU-2222"),
    DeviceUUID(bytes(96), UUIDState.UNUSED, None),
    DeviceUUID(raw_uuid(b"\xff\xfe-not-utf8"), UUIDState.INVALID_UTF8, None),
) + (DeviceUUID(bytes(96), UUIDState.UNUSED, None),) * 12


def example_snapshot(fmt: Format) -> UsageSnapshot:
    """The example's snapshot, written out: slot 1 exited, slot 4 past proc_num."""
    v1 = fmt is Format.V1
    return UsageSnapshot(
        format=fmt,
        major=1 if v1 else None,
        minor=3 if v1 else None,
        file_size=LAYOUTS[fmt].sizeof + 1,
        device_count=2,
        proc_num=4,
        active_slots=3,
        priority=5,
        recent_kernel=3,
        utilization_switch=1,
        last_kernel_time=1_700_000_777 if v1 else 0,
        devices=(
            DeviceUsage(0, EXAMPLE_UUIDS[0], 1000, 50, 1010, 101, 202, 303, 404, 30),
            DeviceUsage(1, EXAMPLE_UUIDS[1], 2000, 60, 60, 5, 6, 7, 8, 7),
        ),
        uuids=EXAMPLE_UUIDS,
        device_keys=(raw_uuid(b"GPU-1111"), raw_uuid(b"GPU-2222"), raw_uuid(b"\xff\xfe-not-utf8")),
        pids=(101, 103, 104),
        host_pids=(5101, 0, 5104),
        device_processes=(2, 3),
    )


@pytest.mark.parametrize("fmt", list(Format))
def test_the_example_decodes_to_its_written_out_snapshot_by_every_route(fmt: Format) -> None:
    data = example(fmt)
    want = example_snapshot(fmt)
    assert reference_region(data) == want  # the oracle agrees with the hand count
    assert parse_region(data) == want
    assert parse_region(bytes(data)) == want
    file = File(data)
    got = file.read(RegionDecoder())
    assert got == want
    # counts are ints (3.0 == 3, but not in a metric's text)
    counts = (got.active_slots, *got.device_processes, *got.pids)
    assert [type(v) for v in counts] == [int] * 6
    layout = LAYOUTS[fmt]
    assert file.asked == [(layout.tail_offset, layout.tail_size), (0, layout.body_size(4))]
    # a decoder that decoded another region of this size first (its fast path)
    decoder = RegionDecoder()
    File(example(fmt, procs=[], proc_num=0, num=1, uuids=["GPU-x"])).read(decoder)
    assert file.read(decoder) == want
    tick = TickDecoder()
    ticked = file.read(tick)
    assert ticked == reference_tick(data)
    assert file.asked == [(layout.tail_offset, layout.tail_size), (0, layout.procs)]
    assert (ticked.format, ticked.major, ticked.minor, ticked.file_size) == (
        fmt,
        want.major,
        want.minor,
        layout.sizeof + 1,
    )
    assert (ticked.device_count, ticked.proc_num, ticked.priority) == (2, 4, 5)
    assert (ticked.recent_kernel, ticked.utilization_switch, ticked.last_kernel_time) == (
        3,
        1,
        want.last_kernel_time,
    )
    assert (ticked.uuids, ticked.device_keys) == (EXAMPLE_UUIDS, want.device_keys)


def test_the_public_pieces_give_the_example_s_parts() -> None:
    data = example()
    static = parse_static(V1, data)
    assert static == StaticInfo(
        num=2,
        device_count=2,
        uuids=EXAMPLE_UUIDS,
        limits=(1000, 2000, 3000) + (0,) * 13,
        sm_limits=(50, 60, 70) + (0,) * 13,
        device_keys=example_snapshot(Format.V1).device_keys,
    )
    tail = bytes(data[V1.tail_offset : V1.tail_offset + 24])
    assert read_tail(V1, tail) == (4, 1, 3, 5, 1_700_000_777)
    assert read_tail(V1, tail + b"extra") == (4, 1, 3, 5, 1_700_000_777)
    v0 = example(Format.V0)
    assert read_tail(V0, bytes(v0[V0.tail_offset : V0.tail_offset + 16])) == (4, 1, 3, 5, 0)
    want = example_snapshot(Format.V1)
    totals = sum_slots_without(V1, data, 4, frozenset())
    assert totals == SlotTotals(
        devices=want.devices,
        active_slots=3,
        pids=(101, 103, 104),
        host_pids=(5101, 0, 5104),
        device_processes=(2, 3),
    )
    assert totals == reference_sums(V1, data, 4)
    # the head may end where the slots do
    assert sum_slots_without(V1, data[: V1.body_size(4)], 4, frozenset()) == totals


def test_sum_slots_without_leaves_out_the_slots_of_the_host_pids_given() -> None:
    data = example()
    # 5102 is the exited slot's, left out anyway; 9 is no slot's
    without = sum_slots_without(V1, data, 4, frozenset({5101, 5102, 9}))
    assert without == SlotTotals(
        devices=(
            DeviceUsage(0, EXAMPLE_UUIDS[0], 1000, 50, 1000, 100, 200, 300, 400, 0),
            DeviceUsage(1, EXAMPLE_UUIDS[1], 2000, 60, 40, 0, 0, 0, 0, 7),
        ),
        active_slots=2,
        pids=(103, 104),
        host_pids=(0, 5104),
        device_processes=(1, 2),
    )
    assert without == reference_sums(V1, data, 4, frozenset({5101, 5102, 9}))
    # host PID 0 (slot 2) is a host PID like any other
    only = sum_slots_without(V1, data, 4, frozenset({0, 5104}))
    assert (only.active_slots, only.pids, only.host_pids, only.device_processes) == (
        1,
        (101,),
        (5101,),
        (1, 1),
    )
    assert only == reference_sums(V1, data, 4, frozenset({0, 5104}))
    # fewer slots than the file has: slot 3 is not read
    first = sum_slots_without(V1, data, 3, frozenset({5101}))
    assert (first.active_slots, first.pids, first.device_processes) == (1, (103,), (1, 1))
    assert [d.memory_total for d in first.devices] == [1000, 0]
    for slots, skip in ((0, frozenset[int]()), (4, frozenset({5101, 0, 5104}))):
        empty = sum_slots_without(V1, data, slots, skip)
        assert empty == SlotTotals(
            devices=tuple(
                DeviceUsage(d, EXAMPLE_UUIDS[d], limit, sm, 0, 0, 0, 0, 0, 0)
                for d, limit, sm in ((0, 1000, 50), (1, 2000, 60))
            ),
            active_slots=0,
            pids=(),
            host_pids=(),
            device_processes=(0, 0),
        )
    # one device: the other device's words are not summed
    one = example(num=1)
    single = sum_slots_without(V1, one, 4, frozenset({5104}))
    assert single.devices == (
        DeviceUsage(0, EXAMPLE_UUIDS[0], 1000, 50, 1010, 101, 202, 303, 404, 30),
    )
    assert (single.active_slots, single.device_processes) == (2, (2,))
    assert single == reference_sums(V1, one, 4, frozenset({5104}))
    # v0 the same
    v0 = example(Format.V0)
    assert sum_slots_without(V0, v0, 4, frozenset({5101})) == reference_sums(
        V0, v0, 4, frozenset({5101})
    )
    assert sum_slots_without(V0, v0, 4, frozenset()).devices == example_snapshot(Format.V0).devices


def test_parse_region_classifies_by_the_size_it_is_told() -> None:
    data = example()
    got = parse_region(data + b"\0" * 10, file_size=len(data))
    assert got == example_snapshot(Format.V1)
    assert parse_region(data + b"\0", file_size=len(data) + 5).file_size == len(data) + 5
    assert (
        refusal(lambda: parse_region(data[: V1.tail_offset + 23], file_size=len(data)))
        == f"data needs {V1.tail_offset + 24} bytes, got {V1.tail_offset + 23}"
    )
    v0 = example(Format.V0)
    assert (
        refusal(lambda: parse_region(v0[:100], file_size=len(v0)))
        == f"data needs {V0.tail_offset + 16} bytes, got 100"
    )


# -- the messages --------------------------------------------------------------------------


def test_short_buffers_are_refused_with_the_lengths_in_the_message() -> None:
    data = example()
    assert refusal(lambda: read_tail(V1, b"\0" * 23)) == "tail needs 24 bytes, got 23"
    assert refusal(lambda: read_tail(V0, b"\0" * 15)) == "tail needs 16 bytes, got 15"
    assert read_tail(V0, b"\1\0\0\0" + b"\0" * 12) == (1, 0, 0, 0, 0)
    assert (
        refusal(lambda: parse_static(V1, data[: V1.procs - 1]))
        == f"head needs at least {V1.procs} bytes, got {V1.procs - 1}"
    )
    assert parse_static(V1, data[: V1.procs]).num == 2
    assert (
        refusal(lambda: sum_slots_without(V1, data[: V1.body_size(2) - 1], 2, frozenset()))
        == f"head needs {V1.body_size(2)} bytes for 2 slots, got {V1.body_size(2) - 1}"
    )
    assert sum_slots_without(V1, data[: V1.body_size(2)], 2, frozenset()).active_slots == 1
    assert refusal(lambda: DeviceUUID.from_raw(b"GPU")) == "a UUID slot is 96 bytes, got 3"


@pytest.mark.parametrize("make", [RegionDecoder, TickDecoder])
def test_bytes_fed_out_of_turn_or_of_the_wrong_length_are_refused(
    make: type[RegionDecoder] | type[TickDecoder],
) -> None:
    decoder: Decoder[UsageSnapshot | TickSnapshot] = make()
    assert refusal(lambda: decoder.feed(b"")) == "no range was asked for: call start() first"
    file = File(example())
    assert decoder.start(len(file.data)) == (V1.tail_offset, 24)
    assert refusal(lambda: decoder.feed(b"abc")) == "asked for 24 bytes, got 3"
    tail = bytes(file.data[V1.tail_offset : V1.tail_offset + 24])
    step = decoder.feed(tail)
    assert isinstance(step, tuple)
    assert step[0] == 0
    assert refusal(lambda: decoder.feed(tail)).startswith("asked for ")
    # a decode that ended (a snapshot, or a rejection) takes nothing more
    snapshot = file.read(decoder)
    assert snapshot.priority == 5
    assert refusal(lambda: decoder.feed(tail)) == "no range was asked for: call start() first"
    with pytest.raises(CacheFileRejected):
        decoder.start(11)
    assert refusal(lambda: decoder.feed(b"")) == "no range was asked for: call start() first"
    assert decoder.start(100) == (0, 12)
    with pytest.raises(CacheFileRejected):
        decoder.feed(bytes(12))
    assert refusal(lambda: decoder.feed(bytes(12))) == "no range was asked for: call start() first"


def _classify_message(size: int, header: bytes) -> tuple[RejectReason, str]:
    try:
        classify(size, header)
    except CacheFileRejected as exc:
        return (RejectReason(exc.reason), str(exc))
    raise AssertionError("classify accepted it")


@pytest.mark.parametrize("make", [RegionDecoder, TickDecoder])
@pytest.mark.parametrize(
    "header",
    [bytes(12), struct.pack("<iii", 7, 1, 2), struct.pack("<iii", MAGIC, 1, 2)],
    ids=["zero", "magic", "size"],
)
def test_a_size_no_layout_fits_is_refused_as_classify_refuses_it(
    make: type[RegionDecoder] | type[TickDecoder], header: bytes
) -> None:
    decoder = make()
    for size in (11, 12):
        if size < 12:
            with pytest.raises(CacheFileRejected) as info:
                decoder.start(size)
            assert (info.value.reason, str(info.value)) == _classify_message(size, b"")
            assert str(info.value) == "cache file size 11 too small (< 12 bytes)"
            continue
        assert decoder.start(size) == (0, 12)
        with pytest.raises(CacheFileRejected) as info:
            decoder.feed(header)
        assert (info.value.reason, str(info.value)) == _classify_message(size, header)
        assert decoder.layout is None
        assert decoder.size is None


def test_tick_refresh_every_is_checked_and_the_default_is_twelve() -> None:
    assert STATIC_REFRESH_TICKS == 12
    assert refusal(lambda: TickDecoder(refresh_every=0)) == "refresh_every must be >= 1 tick, got 0"
    assert (
        refusal(lambda: TickDecoder(refresh_every=-3)) == "refresh_every must be >= 1 tick, got -3"
    )
    file, decoder = File(example()), TickDecoder()
    heads = []
    for _ in range(25):
        file.read(decoder)
        heads.append(len(file.asked) == 2)
    # the first read, then every twelfth read: the first one already counts as a tick
    assert [i for i, head in enumerate(heads) if head] == [0, 11, 23]
    every_tick = TickDecoder(refresh_every=1)
    for _ in range(3):
        file.read(every_tick)
        assert file.asked == [(V1.tail_offset, 24), (0, V1.procs)]


@pytest.mark.parametrize(("phase", "first"), [(0, 11), (5, 6), (11, 12), (12, 11), (17, 6)])
def test_tick_phase_is_where_the_refresh_cycle_starts(phase: int, first: int) -> None:
    file, decoder = File(example()), TickDecoder(phase=phase)
    heads = []
    for _ in range(15):
        file.read(decoder)
        heads.append(len(file.asked) == 2)
    assert [i for i, head in enumerate(heads) if head][:2] == [0, first]


# -- the UUIDs -----------------------------------------------------------------------------


def test_uuid_slots_decode_and_show_as_documented() -> None:
    valid = DeviceUUID.from_raw(raw_uuid(b"GPU-1111\0junk"))
    assert (valid.state, valid.text, valid.valid) == (UUIDState.VALID, "GPU-1111", True)
    assert repr(valid) == "DeviceUUID(b'GPU-1111\\x00junk', valid)"
    assert valid.label == "GPU-1111junk"
    unused = DeviceUUID.from_raw(bytes(96))
    assert (unused.state, unused.text, unused.valid, unused.label) == (
        UUIDState.UNUSED,
        None,
        False,
        None,
    )
    assert repr(unused) == "DeviceUUID(b'', unused)"
    bad = DeviceUUID.from_raw(raw_uuid(b"\xffGPU"))
    assert (bad.state, bad.text, bad.valid, bad.label) == (UUIDState.INVALID_UTF8, None, True, None)
    assert repr(bad) == "DeviceUUID(b'\\xffGPU', invalid_utf8)"
    # HAMi's label is the first 40 bytes: a bad byte at 40 is past it
    long = DeviceUUID.from_raw(raw_uuid(b"G" * 40 + b"\xff"))
    assert (long.state, long.label) == (UUIDState.INVALID_UTF8, "G" * 40)
    longer = DeviceUUID.from_raw(raw_uuid(b"GPU-" + b"7" * 50))
    assert longer.label == "GPU-" + "7" * 36
    assert longer.text == "GPU-" + "7" * 50
    assert [s.value for s in UUIDState] == ["unused", "valid", "invalid_utf8"]


# -- one decoder over changing bytes -------------------------------------------------------


def test_one_usage_decoder_follows_every_kind_of_change_exactly() -> None:
    file = File(example())
    decoder = RegionDecoder()
    assert (decoder.layout, decoder.size) == (None, None)
    seen = file.read(decoder)
    assert (decoder.layout, decoder.size) == (V1, V1.sizeof + 1)

    def step(expect_same: bool = False) -> UsageSnapshot:
        nonlocal seen
        got = file.read(decoder)
        assert got == reference_region(file.data) == parse_region(file.data)
        assert (got is seen) == expect_same
        assert decoder.layout is V1
        seen = got
        return got

    step(expect_same=True)  # nothing changed
    before = seen.devices
    file.put_i32(V1.priority, 0)  # the tail alone
    assert step().priority == 0
    assert seen.devices is before
    file.put_u64(V1.last_kernel_time or 0, 5)
    assert step().last_kernel_time == 5
    file.put_i32(V1.recent_kernel, -1)
    file.put_i32(V1.utilization_switch, 0)
    assert (step().recent_kernel, seen.utilization_switch) == (-1, 0)
    file.put_u64(sm_at(V1, 0, 0), 31)  # utilisation alone: memory sums kept
    assert [d.sm_util for d in step().devices] == [31, 7]
    file.put_u64(sm_at(V1, 3, 0), 4)  # slot 3 now uses device 0 too
    assert step().device_processes == (3, 3)
    file.put_u64(used_at(V1, 2, 0, "total"), 2000)  # memory
    assert [d.memory_total for d in step().devices] == [2010, 60]
    file.put_u64(used_at(V1, 0, 1, "offset"), 18)
    file.put_u64(used_at(V1, 0, 1, "context_size"), 15)
    assert (seen.devices[1].offset, seen.devices[1].context_size) == (8, 5)
    step()
    assert (seen.devices[1].offset, seen.devices[1].context_size) == (18, 15)
    file.put_i32(slot_at(V1, 1, V1.slot_status), 1)  # the exited slot comes back
    assert (step().active_slots, seen.pids, seen.devices[0].memory_total) == (
        4,
        (101, 102, 103, 104),
        7010,
    )
    file.put_u64(sm_at(V1, 2, 1), 8)  # and utilisation moves while all are live
    assert [d.sm_util for d in step().devices] == [35, 8]
    file.put_u64(used_at(V1, 1, 0, "module_size"), 19)  # then memory, all still live
    assert [d.module_size for d in step().devices] == [221, 6]
    file.put_u64(used_at(V1, 1, 0, "module_size"), 9)
    assert [d.module_size for d in step().devices] == [211, 6]
    file.put_i32(slot_at(V1, 1, V1.slot_status), 2)  # live either way: nothing it holds moved
    step(expect_same=True)
    file.put_i32(slot_at(V1, 1, V1.slot_status), 0)  # gone again
    assert (step().active_slots, seen.devices[0].memory_total) == (3, 2010)
    file.put_i32(slot_at(V1, 0, V1.slot_hostpid), 6101)  # a host PID alone
    same_devices = seen.devices
    assert step().host_pids == (6101, 0, 5104)
    assert seen.devices is same_devices  # equal sums: the same device objects
    file.put_i32(slot_at(V1, 3, V1.slot_pid), 204)  # a PID alone
    assert step().pids == (101, 103, 204)
    for offset in range(12, V1.num):  # the lock words: never read
        file.data[offset] ^= 0x5A
    step(expect_same=True)
    file.put_i32(8, 4)  # the minor version
    assert (step().major, seen.minor) == (1, 4)
    file.put_u64(V1.num, 3)  # the device count
    assert (step().device_count, len(seen.devices), seen.device_processes) == (3, 3, (3, 3, 0))
    assert seen.devices[2] == DeviceUsage(2, EXAMPLE_UUIDS[2], 3000, 70, 0, 0, 0, 0, 0, 0)
    file.data[V1.uuids + 96 * 5] = ord("Z")  # a UUID past the device count
    assert len(step().device_keys) == 4
    file.put_u64(V1.limit + 8, 2500)  # a limit
    assert step().devices[1].memory_limit == 2500
    file.put_u64(V1.sm_limit, 55)
    assert step().devices[0].sm_limit == 55
    file.put_i32(V1.proc_num, 5)  # one slot more: a longer head
    assert (step().active_slots, seen.pids[-1]) == (4, 105)
    assert file.asked[-1] == (0, V1.body_size(5))
    file.put_i32(V1.proc_num, 0)
    assert (step().active_slots, seen.pids, seen.device_processes) == (0, (), (0, 0, 0))
    assert file.asked[-1] == (0, V1.procs)
    file.put_i32(V1.proc_num, 4)
    step()
    file.put_i32(4, 2)  # an unknown major: refused, the last good decode kept
    with pytest.raises(CacheFileRejected) as info:
        file.read(decoder)
    assert (info.value.reason, str(info.value)) == _classify_message(
        len(file.data), bytes(file.data[:12])
    )
    assert (decoder.layout, decoder.size) == (None, V1.sizeof + 1)
    file.put_i32(4, 1)  # back: the very snapshot of before
    step(expect_same=True)
    file.put_i32(0, 0)  # magic 0: HAMi-core still initialising
    with pytest.raises(CacheFileRejected) as info:
        file.read(decoder)
    assert info.value.reason is RejectReason.MAGIC
    file.put_i32(0, MAGIC)
    step(expect_same=True)
    file.data += b"\0" * 3  # another size of the same format
    assert step().file_size == V1.sizeof + 4
    assert decoder.size == V1.sizeof + 4


def test_a_v0_decoder_keeps_its_snapshot_over_lock_words_and_sees_the_magic() -> None:
    file = File(example(Format.V0))
    decoder = RegionDecoder()
    first = file.read(decoder)
    assert first == example_snapshot(Format.V0)
    for offset in range(4, V0.num):  # v0 has no version words: the lock follows the magic
        file.data[offset] ^= 0xFF
    assert file.read(decoder) is first
    file.put_i32(0, MAGIC + 1)
    with pytest.raises(CacheFileRejected) as info:
        file.read(decoder)
    assert (info.value.reason, str(info.value)) == _classify_message(
        len(file.data), bytes(file.data[:12])
    )
    file.put_i32(0, MAGIC)
    assert file.read(decoder) == first


def test_a_decoder_follows_a_file_that_changes_format() -> None:
    decoder = RegionDecoder()
    tick = TickDecoder()
    for fmt in (Format.V1, Format.V0, Format.V1):
        file = File(example(fmt))
        assert file.read(decoder) == example_snapshot(fmt)
        assert decoder.layout is LAYOUTS[fmt]
        assert file.read(tick) == reference_tick(file.data)
        assert (tick.layout, tick.size) == (LAYOUTS[fmt], LAYOUTS[fmt].sizeof + 1)


# -- the sums ------------------------------------------------------------------------------


def _slots(totals: Sequence[int], sm: int = 0, status: int = 1) -> list[ProcSlot]:
    return [
        ProcSlot(
            pid=i + 1,
            hostpid=i + 1001,
            status=status,
            used=[MemoryUse(total=t)],
            util=[UtilUse(sm_util=sm)],
        )
        for i, t in enumerate(totals)
    ]


@pytest.mark.parametrize("count", [1, 56, 57, 58, 300])
def test_many_slots_sum_as_few_do(count: int) -> None:
    # 56 slots of one device are 504 fields, 57 are 513: either side of how they are unpacked
    procs = _slots([(i % 7) * 3 for i in range(count)], sm=2)
    procs[count // 2] = ProcSlot(pid=9999, status=0, used=[MemoryUse(total=1 << 40)])
    data = example(num=1, procs=procs, proc_num=count)
    decoder = RegionDecoder()
    got = File(data).read(decoder)
    assert got == reference_region(data) == parse_region(data)
    live = count - 1
    assert got.active_slots == live
    assert got.devices[0].memory_total == sum((i % 7) * 3 for i in range(count) if i != count // 2)
    assert got.devices[0].sm_util == 2 * live
    assert got.device_processes == (live,)
    # the exited-process re-read over as many slots
    skip = frozenset({1001, 1000 + count})
    without = sum_slots_without(V1, memoryview(data), count, skip)
    assert without == reference_sums(V1, data, count, skip)
    kept = tuple(i + 1 for i in range(count) if i != count // 2 and i + 1001 not in skip)
    assert (without.active_slots, without.pids) == (len(kept), kept)
    assert without.devices[0].sm_util == 2 * len(kept)
    # the same decoder over one slot fewer and back
    smaller = example(num=1, procs=procs[:-1], proc_num=count - 1)
    assert File(smaller).read(decoder) == reference_region(smaller)
    assert File(data).read(decoder) == got


def test_sums_wrap_at_64_bits_exactly() -> None:
    top = (1 << 64) - 1
    for totals, want in (
        ([top, 0], top),
        ([top, 1], 0),
        ([top, 2], 1),
        ([top, top], top - 1),
        ([1 << 63, 1 << 63], 0),
    ):
        procs = [
            ProcSlot(
                pid=1, used=[MemoryUse(top, 0, 0, 0, totals[0])], util=[UtilUse(sm_util=totals[0])]
            ),
            ProcSlot(
                pid=2, used=[MemoryUse(1, 0, 0, 0, totals[1])], util=[UtilUse(sm_util=totals[1])]
            ),
        ]
        data = example(num=1, procs=procs, proc_num=2)
        for got in (parse_region(data), File(data).read(RegionDecoder())):
            device = got.devices[0]
            assert (device.memory_total, device.sm_util, device.context_size) == (want, want, 0)
            assert got == reference_region(data)


def test_device_processes_count_memory_or_utilisation_per_device() -> None:
    cases: list[tuple[list[ProcSlot], tuple[int, int]]] = [
        # every live slot has memory on both devices: all of them use both
        (
            [
                ProcSlot(pid=1, used=[MemoryUse(total=1), MemoryUse(total=1)]),
                ProcSlot(pid=2, used=[MemoryUse(total=2), MemoryUse(total=2)]),
            ],
            (2, 2),
        ),
        # no memory anywhere: utilisation alone counts
        (
            [
                ProcSlot(pid=1, util=[UtilUse(sm_util=1)]),
                ProcSlot(pid=2, util=[UtilUse(), UtilUse(sm_util=1)]),
                ProcSlot(pid=3),
            ],
            (1, 1),
        ),
        # memory on device 0 for one slot, utilisation on device 0 for the other
        (
            [
                ProcSlot(pid=1, used=[MemoryUse(total=5)]),
                ProcSlot(pid=2, util=[UtilUse(sm_util=3)]),
                ProcSlot(pid=3, used=[MemoryUse(context_size=4)]),
            ],
            (2, 0),
        ),
    ]
    for procs, busy in cases:
        data = example(procs=procs, proc_num=len(procs))
        decoder, tick = RegionDecoder(), TickDecoder()
        File(example()).read(decoder)  # the fast path too
        for got in (
            parse_region(data),
            File(data).read(RegionDecoder()),
            File(data).read(decoder),
        ):
            assert got.device_processes == busy
            assert got == reference_region(data)
        assert File(data).read(tick) == reference_tick(data)


def test_the_device_count_is_num_up_to_sixteen() -> None:
    for num, count in ((0, 0), (1, 1), (16, 16), (17, 16), ((1 << 64) - 1, 16)):
        procs = [ProcSlot(pid=1, used=[MemoryUse(total=d + 1) for d in range(16)])]
        data = example(num=num, procs=procs, proc_num=1)
        got = File(data).read(RegionDecoder())
        assert (got.device_count, len(got.devices)) == (count, count)
        assert [d.memory_total for d in got.devices] == list(range(1, count + 1))
        assert [d.index for d in got.devices] == list(range(count))
        assert got == reference_region(data) == parse_region(data)
        assert File(data).read(TickDecoder()).device_count == count


@pytest.mark.parametrize(
    ("proc_num", "slots"), [(-1, 0), (-(2**31), 0), (1024, 1024), (1025, 1024)]
)
def test_proc_num_is_clamped_to_the_slots(proc_num: int, slots: int) -> None:
    procs = _slots([1] * 1024) if slots else []
    data = example(num=1, procs=procs, proc_num=proc_num)
    file = File(data)
    got = file.read(RegionDecoder())
    assert file.asked == [(V1.tail_offset, 24), (0, V1.body_size(slots))]
    assert (got.proc_num, got.active_slots, got.devices[0].memory_total) == (proc_num, slots, slots)
    assert got == reference_region(data)


# -- the tick decoder ----------------------------------------------------------------------


def test_one_tick_decoder_reads_the_head_only_when_it_must() -> None:
    file = File(example())
    # the first read counts as a tick: phase 4 of 5 puts the refreshes at reads 5, 10, ...
    decoder = TickDecoder(phase=4, refresh_every=5)
    assert (decoder.layout, decoder.size) == (None, None)
    tail = (V1.tail_offset, 24)
    head = (0, V1.procs)
    seen = file.read(decoder)
    assert file.asked == [tail, head]
    assert seen == reference_tick(file.data)
    assert (decoder.layout, decoder.size) == (V1, V1.sizeof + 1)

    def tick(asked: list[tuple[int, int]], expect_same: bool = False) -> TickSnapshot:
        nonlocal seen
        got = file.read(decoder)
        assert file.asked == asked
        assert (got is seen) == expect_same
        seen = got
        return got

    tick([tail], expect_same=True)  # tick 1 of 5
    file.put_i32(V1.priority, 7)
    assert tick([tail]).priority == 7  # tick 2
    file.put_i32(V1.recent_kernel, -1)
    assert tick([tail]).recent_kernel == -1  # 3
    file.put_i32(V1.utilization_switch, 0)
    assert tick([tail]).utilization_switch == 0  # 4
    got = tick([tail, head], expect_same=True)  # 5: the refresh; the head is the same bytes
    assert got == reference_tick(file.data)
    file.put_u64(V1.last_kernel_time or 0, 9)
    assert tick([tail]).last_kernel_time == 9  # 1
    file.put_i32(V1.proc_num, 3)
    assert tick([tail]).proc_num == 3  # 2: 4 -> 3 slots, no head
    file.put_i32(V1.proc_num, 0)  # 3: to 0, the head is read
    assert tick([tail, head]).proc_num == 0
    file.put_i32(V1.proc_num, 0)
    tick([tail], expect_same=True)  # 4: 0 stays 0
    file.put_i32(V1.proc_num, 2)  # 5: from 0 (and the refresh anyway)
    assert tick([tail, head]).proc_num == 2
    file.put_i32(V1.proc_num, 1)  # 1
    assert tick([tail]).proc_num == 1
    # the head changes: not seen until the refresh, then exactly
    file.put_u64(V1.num, 1)
    file.data[V1.uuids] = ord("X")
    file.put_i32(8, 9)  # minor
    for _ in range(3):
        assert tick([tail], expect_same=True).device_count == 2  # 2, 3, 4
    got = tick([tail, head])  # 5
    assert got == reference_tick(file.data)
    assert (got.device_count, got.minor, got.uuids[0].text) == (1, 9, "XPU-1111")
    assert got.device_keys[0] == raw_uuid(b"XPU-1111")
    # the head changes back at once: its bytes are decoded again, not taken from before
    file.put_u64(V1.num, 2)
    for _ in range(4):
        tick([tail], expect_same=True)
    assert tick([tail, head]).device_count == 2
    # a UUID rewritten and back keeps equal values; a limit is not the tick's concern
    file.put_u64(V1.limit, 1)
    for _ in range(4):
        tick([tail], expect_same=True)
    tick([tail, head], expect_same=True)


def test_the_tick_snapshot_is_new_when_any_of_its_fields_changes() -> None:
    base = example()
    changes: list[tuple[int, bytes]] = [
        (V1.proc_num, _I32.pack(3)),
        (V1.utilization_switch, _I32.pack(2)),
        (V1.recent_kernel, _I32.pack(4)),
        (V1.priority, _I32.pack(6)),
        (V1.last_kernel_time or 0, _U64.pack(8)),
        (4, _I32.pack(1)),  # major: the same
        (8, _I32.pack(7)),  # minor
        (V1.num, _U64.pack(1)),
        (V1.uuids + 96 * 7, b"K"),
    ]
    for offset, raw in changes:
        decoder = TickDecoder(refresh_every=1)
        file = File(base)
        first = file.read(decoder)
        file.data[offset : offset + len(raw)] = raw
        got = file.read(decoder)
        assert got == reference_tick(file.data)
        assert (got is first) == (file.data == base), offset
        assert (got == first) == (file.data == base), offset
    # the size (the same format and the same bytes)
    decoder = TickDecoder(refresh_every=1)
    first = File(base).read(decoder)
    got = File(base + b"\0").read(decoder)
    assert got.file_size == first.file_size + 1
    assert got == reference_tick(base + b"\0")


def test_a_tick_decoder_refuses_a_bad_head_and_reads_it_again_next_time() -> None:
    file = File(example())
    decoder = TickDecoder(phase=1, refresh_every=2)  # the head at reads 2, 4, ...
    first = file.read(decoder)
    file.put_i32(0, 7)  # a bad magic: seen at the next head read
    assert file.read(decoder) is first  # tick 1: tail only
    with pytest.raises(CacheFileRejected) as info:
        file.read(decoder)  # 2: the head
    assert (info.value.reason, str(info.value)) == _classify_message(
        len(file.data), bytes(file.data[:12])
    )
    assert (decoder.layout, decoder.size) == (None, None)
    with pytest.raises(CacheFileRejected):
        file.read(decoder)  # 1: read again, because the last head read failed
    file.put_i32(0, MAGIC)
    got = file.read(decoder)
    assert file.asked == [(V1.tail_offset, 24), (0, V1.procs)]
    assert got == first == reference_tick(file.data)
    assert (decoder.layout, decoder.size) == (V1, V1.sizeof + 1)
    file.put_i32(4, 3)  # an unknown major, and back, between two refreshes
    assert file.read(decoder) == first  # 1: the tail only
    with pytest.raises(CacheFileRejected) as info:
        file.read(decoder)  # 2: the head
    assert info.value.reason is RejectReason.UNKNOWN_VERSION
    file.put_i32(4, 1)
    assert file.read(decoder) == first


def test_slot_words_are_signed_where_the_c_struct_says_so() -> None:
    procs = [ProcSlot(pid=-7, hostpid=-9, status=-1, used=[MemoryUse(total=3)])]
    data = example(num=1, procs=procs, proc_num=1)
    for got in (parse_region(data), File(data).read(RegionDecoder())):
        assert (got.pids, got.host_pids, got.active_slots) == ((-7,), (-9,), 1)
        assert got == reference_region(data)


def test_device_processes_when_a_live_slot_has_no_memory_on_a_device() -> None:
    cases: list[tuple[int, list[ProcSlot], tuple[int, ...]]] = [
        # one device: the first slot uses nothing, the last has other memory words set
        (1, [ProcSlot(pid=1), ProcSlot(pid=2, used=[MemoryUse(module_size=7, total=5)])], (1,)),
        # two devices: device 1 has no memory in slot 0, device 0 has a context in slot 1
        (
            2,
            [
                ProcSlot(pid=1, used=[MemoryUse(context_size=1, total=1)]),
                ProcSlot(pid=2, used=[MemoryUse(context_size=3, total=1), MemoryUse(total=5)]),
            ],
            (2, 1),
        ),
    ]
    for num, procs, busy in cases:
        data = example(num=num, procs=procs, proc_num=len(procs))
        for got in (parse_region(data), File(data).read(RegionDecoder())):
            assert got.device_processes == busy
            assert got == reference_region(data)


def test_a_change_that_keeps_the_fields_plain_sum_is_still_seen() -> None:
    # the decoder keys the slots by their fields' hash and plain sum: moving a value from one
    # field to another keeps the sum, not the snapshot
    file = File(example())
    decoder = RegionDecoder()
    first = file.read(decoder)
    file.put_u64(used_at(V1, 0, 0, "total"), 11)  # +1
    file.put_u64(used_at(V1, 0, 0, "context_size"), 0)  # -1
    got = file.read(decoder)
    assert (got.devices[0].memory_total, got.devices[0].context_size) == (1011, 100)
    assert got == reference_region(file.data) != first
    file.put_u64(sm_at(V1, 0, 0), 29)  # -1
    file.put_i32(slot_at(V1, 0, V1.slot_pid), 102)  # +1
    got = file.read(decoder)
    assert (got.devices[0].sm_util, got.pids[0]) == (29, 102)
    assert got == reference_region(file.data)


def test_parse_region_takes_data_that_ends_with_the_tail() -> None:
    data = example()
    end = V1.tail_offset + 24
    assert parse_region(data[:end], file_size=len(data)) == example_snapshot(Format.V1)


def test_a_uuid_repr_strips_only_the_nul_padding() -> None:
    assert repr(DeviceUUID.from_raw(raw_uuid(b"GPU-XX"))) == "DeviceUUID(b'GPU-XX', valid)"


def test_a_tail_only_tick_ends_the_decode_and_keeps_the_layout() -> None:
    file = File(example())
    decoder = TickDecoder()
    first = file.read(decoder)
    tail = bytes(file.data[V1.tail_offset : V1.tail_offset + 24])
    assert file.read(decoder) is first
    assert file.asked == [(V1.tail_offset, 24)]
    assert (decoder.layout, decoder.size) == (V1, V1.sizeof + 1)
    assert refusal(lambda: decoder.feed(tail)) == "no range was asked for: call start() first"
    assert refusal(lambda: decoder.feed(b"x")) == "no range was asked for: call start() first"


def test_a_tick_refresh_keeps_the_uuid_objects_it_already_has() -> None:
    file = File(example())
    decoder = TickDecoder(phase=1, refresh_every=2)
    first = file.read(decoder)
    assert file.read(decoder) is first  # tail only
    file.put_i32(V1.priority, 1)  # a new snapshot, built at the refresh
    file.put_u64(V1.limit, 1)  # other head bytes: decoded again, the same UUIDs
    got = file.read(decoder)
    assert file.asked == [(V1.tail_offset, 24), (0, V1.procs)]
    assert got.priority == 1
    assert got.uuids is first.uuids
    assert got.device_keys is first.device_keys
