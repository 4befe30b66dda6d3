"""The pure RegionDecoder: which ranges it asks for, what it decodes, change detection.

The decoder is driven here over bytes in memory, as ``monitor/region.py`` drives it over
``pread``; its answers are compared with the reference decoder of the whole buffer
(``tests/monitor/reference.py``: the same rules, read value by value) and with what the
bytes say.
"""

from __future__ import annotations

import dataclasses
import functools
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tests.strategies.layout as st_layout
from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import (
    LAYOUTS,
    MAGIC,
    TAIL_INDEX,
    TAIL_MEMBERS,
    Format,
    RejectReason,
    layout_for_size,
)
from hami_trio.monitor.snapshot import (
    DeviceUsage,
    RegionDecoder,
    TickDecoder,
    TickSnapshot,
    UsageSnapshot,
    _new_device_usage,
    _new_tick_snapshot,
    _new_usage_snapshot,
    parse_region,
    read_tail,
    sum_slots_without,
)
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, build_region
from tests.monitor.reference import reference_region, reference_sums

V0 = LAYOUTS[Format.V0]
V1 = LAYOUTS[Format.V1]


def region(**changes: object) -> bytearray:
    base: dict[str, object] = {
        "num": 2,
        "uuids": ["GPU-aaaa", "GPU-bbbb"],
        "limits": [1 << 30, 2 << 30],
        "procs": [
            ProcSlot(
                pid=1, used=[MemoryUse(total=10), MemoryUse(total=20)], util=[UtilUse(sm_util=5)]
            ),
            ProcSlot(pid=2, used=[MemoryUse(total=100)], util=[UtilUse(sm_util=7)]),
        ],
        "priority": 3,
        "recent_kernel": 2,
        "last_kernel_time": 1_700_000_123,
    }
    base.update(changes)
    return build_region(RegionSpec(**base))  # type: ignore[arg-type]


def decode(
    decoder: RegionDecoder, data: bytes | bytearray, reads: list[tuple[int, int]] | None = None
) -> UsageSnapshot:
    """Drive ``decoder`` over ``data`` (a whole file), checking every range it asks for."""
    size = len(data)
    step: tuple[int, int] | UsageSnapshot = decoder.start(size)
    while isinstance(step, tuple):
        offset, length = step
        assert offset >= 0, (offset, length, size)
        assert offset + length <= size, (offset, length, size)
        if reads is not None:
            reads.append(step)
        step = decoder.feed(bytes(data[offset : offset + length]))
    return step


def outcome_of(call: Callable[[], UsageSnapshot]) -> UsageSnapshot | CacheFileRejected:
    try:
        result = call()
    except CacheFileRejected as exc:
        return exc
    return result


def same_outcome(got: UsageSnapshot | CacheFileRejected, want: object) -> None:
    if isinstance(want, CacheFileRejected):
        assert isinstance(got, CacheFileRejected), (got, want)
        assert (got.reason, str(got)) == (want.reason, str(want))
    else:
        assert got == want


# -- the ranges it asks for ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(Format))
def test_asks_for_the_tail_then_the_head_up_to_the_live_slots(fmt: Format) -> None:
    data = region(format=fmt, last_kernel_time=0 if fmt is Format.V0 else 1)
    layout = LAYOUTS[fmt]
    reads: list[tuple[int, int]] = []
    snapshot = decode(RegionDecoder(), data, reads)
    assert reads == [(layout.tail_offset, layout.tail_size), (0, layout.body_size(2))]
    assert snapshot.format is fmt
    assert (snapshot.proc_num, snapshot.active_slots, snapshot.priority) == (2, 2, 3)
    assert [d.memory_total for d in snapshot.devices] == [110, 20]


@pytest.mark.parametrize(("proc_num", "slots"), [(-5, 0), (0, 0), (7, 7), (5000, 1024)])
def test_the_head_range_follows_the_clamped_proc_num(proc_num: int, slots: int) -> None:
    data = region(proc_num=proc_num)
    reads: list[tuple[int, int]] = []
    snapshot = decode(RegionDecoder(), data, reads)
    assert reads[1] == (0, V1.body_size(slots))
    assert snapshot.proc_num == proc_num


def test_a_tiny_file_is_refused_before_anything_is_read() -> None:
    decoder = RegionDecoder()
    with pytest.raises(CacheFileRejected) as info:
        decoder.start(11)
    assert info.value.reason is RejectReason.TOO_SMALL
    assert str(info.value) == "cache file size 11 too small (< 12 bytes)"
    assert decoder.layout is None


@pytest.mark.parametrize(
    ("header_magic", "reason"), [(MAGIC, RejectReason.UNKNOWN_VERSION), (7, RejectReason.MAGIC)]
)
def test_a_size_no_layout_fits_reads_only_the_header_to_name_it(
    header_magic: int, reason: RejectReason
) -> None:
    data = bytearray(100)
    data[:4] = header_magic.to_bytes(4, "little")
    reads: list[tuple[int, int]] = []
    with pytest.raises(CacheFileRejected) as info:
        decode(RegionDecoder(), data, reads)
    assert reads == [(0, 12)]
    assert info.value.reason is reason
    assert "size 100" in str(info.value)


def test_bytes_of_the_wrong_length_or_out_of_turn_are_an_error() -> None:
    decoder = RegionDecoder()
    with pytest.raises(ValueError, match="call start"):
        decoder.feed(b"")
    offset, length = decoder.start(V1.sizeof + 1)
    with pytest.raises(ValueError, match=f"asked for {length} bytes, got 3"):
        decoder.feed(b"abc")
    data = region()
    snapshot = decode(decoder, data)  # a new start() begins afresh
    with pytest.raises(ValueError, match="call start"):
        decoder.feed(bytes(data[offset : offset + length]))
    assert decode(decoder, data) is snapshot


@pytest.mark.parametrize("fmt", list(Format))
def test_the_tail_is_read_member_by_member_at_the_table_offsets(fmt: Format) -> None:
    layout = LAYOUTS[fmt]
    data = bytearray(layout.tail_size)
    wanted = {}
    for value, name in enumerate(TAIL_MEMBERS, start=-2):
        spot = layout.field(name)
        if spot is None:  # v0 has no last_kernel_time: it reads as 0
            wanted[name] = 0
            continue
        offset, size = spot
        at = offset - layout.tail_offset
        wanted[name] = value << 8 * (size - 1) if size == 8 else value
        data[at : at + size] = wanted[name].to_bytes(size, "little", signed=size == 4)
    got = read_tail(layout, data)
    assert {name: got[TAIL_INDEX[name]] for name in TAIL_MEMBERS} == wanted
    assert len(got) == len(TAIL_MEMBERS)
    with pytest.raises(ValueError, match=f"^tail needs {layout.tail_size} bytes, got 3$"):
        read_tail(layout, data[:3])


# -- change detection ----------------------------------------------------------------------


def test_unchanged_bytes_give_the_same_snapshot_object() -> None:
    decoder = RegionDecoder()
    assert (decoder.layout, decoder.size) == (None, None)
    data = region()
    first = decode(decoder, data)
    assert (decoder.layout, decoder.size) == (V1, len(data))
    assert decode(decoder, bytes(data)) is first


def test_a_tail_change_keeps_the_slot_sums_and_a_slot_change_is_seen() -> None:
    decoder = RegionDecoder()
    first = decode(decoder, region())
    moved = decode(decoder, region(priority=0, recent_kernel=-1))
    assert (moved.priority, moved.recent_kernel) == (0, -1)
    assert moved.devices is first.devices  # the slots were not summed again
    slot = ProcSlot(
        pid=1, used=[MemoryUse(total=11), MemoryUse(total=20)], util=[UtilUse(sm_util=5)]
    )
    changed = decode(decoder, region(priority=0, recent_kernel=-1, procs=[slot]))
    assert (changed.active_slots, changed.devices[0].memory_total) == (1, 11)
    assert decode(decoder, region()) == first


@pytest.mark.parametrize("fmt", list(Format))
def test_live_slots_give_their_pids_and_the_devices_they_use(fmt: Format) -> None:
    procs = [
        ProcSlot(pid=7, hostpid=4001, used=[MemoryUse(total=10)]),  # device 0 only
        ProcSlot(pid=8, hostpid=0, status=0, used=[MemoryUse(total=5), MemoryUse(total=5)]),
        ProcSlot(
            pid=9, hostpid=0, used=[MemoryUse(), MemoryUse()], util=[UtilUse(), UtilUse(sm_util=1)]
        ),
        ProcSlot(pid=10, hostpid=4003, used=[MemoryUse(total=1), MemoryUse(total=2)]),
        ProcSlot(pid=11, hostpid=4004, used=[MemoryUse(total=3)]),  # beyond proc_num
    ]
    data = region(format=fmt, procs=procs, proc_num=4, last_kernel_time=0)
    for snapshot in (decode(RegionDecoder(), data), reference_region(data)):
        # slot 1 exited (status 0) and slot 4 is past proc_num: neither is a process
        assert (snapshot.pids, snapshot.host_pids) == ((7, 9, 10), (4001, 0, 4003))
        # slot 9 uses device 1 by SM utilisation alone, slot 10 both devices by memory
        assert snapshot.device_processes == (2, 2)
        assert [d.memory_total for d in snapshot.devices] == [11, 2]


def test_a_host_pid_change_alone_is_a_new_snapshot() -> None:
    decoder = RegionDecoder()
    first = decode(decoder, region())
    assert first.host_pids == (0, 0)
    slots = [
        ProcSlot(
            pid=1,
            hostpid=5001,
            used=[MemoryUse(total=10), MemoryUse(total=20)],
            util=[UtilUse(sm_util=5)],
        ),
        ProcSlot(pid=2, used=[MemoryUse(total=100)], util=[UtilUse(sm_util=7)]),
    ]
    learned = decode(decoder, region(procs=slots))
    assert learned.host_pids == (5001, 0)
    assert learned.devices == first.devices


def test_no_live_slot_means_no_processes() -> None:
    snapshot = decode(RegionDecoder(), region(procs=[]))
    assert (snapshot.pids, snapshot.host_pids, snapshot.device_processes) == ((), (), (0, 0))


def test_a_static_change_is_decoded_afresh() -> None:
    decoder = RegionDecoder()
    decode(decoder, region())
    again = decode(decoder, region(uuids=["GPU-cccc", "GPU-bbbb"], limits=[5, 6]))
    assert again.devices[0].uuid.text == "GPU-cccc"
    assert [d.memory_limit for d in again.devices] == [5, 6]


def test_a_rejection_keeps_what_the_last_good_decode_knew() -> None:
    decoder = RegionDecoder()
    data = region()
    first = decode(decoder, data)
    bad = bytearray(data)
    bad[:4] = b"\0\0\0\0"
    with pytest.raises(CacheFileRejected) as info:
        decode(decoder, bad)
    assert info.value.reason is RejectReason.MAGIC
    assert decoder.layout is None  # nothing to write against
    assert decoder.size == len(data)
    assert decode(decoder, data) == first


def test_many_live_slots_are_re_summed_not_kept() -> None:
    # 1024 live slots on 16 devices: the decoder keeps sums, not ~100,000 ints.
    slot = ProcSlot(
        pid=1,
        used=[MemoryUse(total=(d + 1) << 20) for d in range(16)],
        util=[UtilUse(sm_util=d) for d in range(16)],
    )
    many = {"num": 16, "uuids": [f"GPU-{d}" for d in range(16)], "procs": [slot] * 1024}
    data = region(**many)
    decoder = RegionDecoder()
    tracemalloc.start()
    try:
        first = decode(decoder, data)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 512 << 10, kept
    assert first.devices[15].memory_total == 1024 * (16 << 20)
    assert decode(decoder, data) is first
    data[V1.procs + 7 * V1.slot_size + V1.slot_status] = 0  # slot 7's status word: 0
    changed = decode(decoder, data)
    assert changed.active_slots == 1023
    assert changed.devices[0].memory_total == 1023 << 20


def test_memory_sums_are_reused_only_while_memory_words_and_live_slots_are_the_same() -> None:
    # Memory and the other slot fields are told apart: an SM utilisation change alone keeps
    # the memory sums; a slot that exits or comes back, or a memory word, sums afresh.
    def slots(sm: int, status: int = 1, total: int = 100) -> list[ProcSlot]:
        return [
            ProcSlot(pid=1, used=[MemoryUse(total=10), MemoryUse(total=20)]),
            ProcSlot(
                pid=2, status=status, used=[MemoryUse(total=total)], util=[UtilUse(sm_util=sm)]
            ),
            ProcSlot(pid=3, used=[MemoryUse(), MemoryUse(total=1)], util=[UtilUse(sm_util=1)]),
        ]

    decoder = RegionDecoder()
    for procs in (
        slots(5),
        slots(6),  # utilisation only
        slots(6, status=0),  # slot 2 exits: its memory leaves the sums
        slots(7, status=0),
        slots(7),  # back
        slots(7, total=300),  # memory
        slots(8, total=300),
    ):
        data = region(procs=procs)
        got = decode(decoder, data)
        assert got == reference_region(data)
    assert [d.memory_total for d in got.devices] == [310, 21]
    assert (got.devices[0].sm_util, got.device_processes) == (9, (3, 2))


@pytest.mark.parametrize("fmt", list(Format))
def test_the_lock_words_between_header_and_static_part_are_not_a_change(fmt: Format) -> None:
    # HAMi-core's processes take the region's lock (sem, owner_pid, sm_init_flag next to it)
    # all the time; nothing is read from it, so it must not cost a fresh decode.
    layout = LAYOUTS[fmt]
    data = region(format=fmt, last_kernel_time=0)
    decoder = RegionDecoder()
    first = decode(decoder, data)
    lock = range(12 if layout.has_version else 4, layout.num)
    for offset in lock:
        data[offset] ^= 0xFF
    assert decode(decoder, data) is first
    data[layout.num] ^= 1  # num is read: a change
    assert decode(decoder, data) == reference_region(data) != first


def test_values_that_hash_alike_are_still_told_apart() -> None:
    # An int hashes to itself modulo 2**61 - 1, so the slot fields' tuple hash alone would
    # miss a counter that moved by exactly that much; the decoder keeps their sum as well.
    step = (1 << 61) - 1
    decoder = RegionDecoder()
    for total in (5, 5 + step, 5 + 2 * step, 5):
        slot = ProcSlot(pid=1, used=[MemoryUse(total=total)])
        got = decode(decoder, region(procs=[slot]))
        assert got.devices[0].memory_total == total
        assert got == reference_region(region(procs=[slot]))


def test_sums_wrap_at_64_bits_and_a_dead_slot_between_live_ones_is_left_out() -> None:
    decoder = RegionDecoder()
    decode(decoder, region())
    huge = (1 << 64) - 5
    procs = [
        ProcSlot(pid=1, used=[MemoryUse(total=huge), MemoryUse(total=1)]),
        ProcSlot(pid=2, status=0, used=[MemoryUse(total=1000), MemoryUse(total=1000)]),
        ProcSlot(pid=3, used=[MemoryUse(total=10)], util=[UtilUse(), UtilUse(sm_util=4)]),
    ]
    for got in (decode(decoder, region(procs=procs)), decode(RegionDecoder(), region(procs=procs))):
        assert [d.memory_total for d in got.devices] == [5, 1]  # (huge + 10) mod 2**64
        assert (got.active_slots, got.pids, got.device_processes) == (2, (1, 3), (2, 2))
        assert got == reference_region(region(procs=procs))


def test_the_fast_constructors_build_what_the_classes_build() -> None:
    # The decoder builds its objects through a twin class (then switches their class); they
    # must be the very objects the dataclass constructors make: equal, hashable alike,
    # frozen, all fields.  The snapshots take the tail's fields as one tuple (in TAIL_MEMBERS'
    # order), in the place of the first of them.
    data = region()
    snapshot = parse_region(data)
    tick = TickDecoder()
    step: tuple[int, int] | TickSnapshot = tick.start(len(data))
    while isinstance(step, tuple):
        step = tick.feed(bytes(data[step[0] : step[0] + step[1]]))
    for cls, make, obj, spread in (
        (UsageSnapshot, _new_usage_snapshot, snapshot, True),
        (TickSnapshot, _new_tick_snapshot, step, True),
        (DeviceUsage, _new_device_usage, snapshot.devices[0], False),
    ):
        values = [getattr(obj, f.name) for f in dataclasses.fields(cls)]
        names = [f.name for f in dataclasses.fields(cls)]
        args = [getattr(obj, name) for name in names if not spread or name not in TAIL_MEMBERS]
        if spread:
            first = min(names.index(name) for name in TAIL_MEMBERS)
            args.insert(first, tuple(getattr(obj, name) for name in TAIL_MEMBERS))
        made = make(*args)
        assert type(made) is cls
        assert made == cls(*values) == obj
        assert hash(made) == hash(obj)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, dataclasses.fields(cls)[0].name, 1)


# -- against the reference decoder ---------------------------------------------------------


@given(st_layout.region_files())
def test_any_file_decodes_as_the_reference_does(data: bytes) -> None:
    want = outcome_of(lambda: reference_region(data))
    same_outcome(outcome_of(lambda: decode(RegionDecoder(), data)), want)
    same_outcome(outcome_of(lambda: parse_region(data)), want)


def test_parse_region_refuses_data_shorter_than_the_size_it_is_given() -> None:
    data = region()
    assert parse_region(data, len(data)) == reference_region(data)
    end = V1.tail_offset + V1.tail_size
    with pytest.raises(ValueError, match=f"^data needs {end} bytes, got {end - 1}$"):
        parse_region(data[: end - 1], len(data))


@st.composite
def edited_regions(draw: st.DrawFn) -> list[bytes]:
    """One region, then a few versions of it with bytes changed in its prefix, in the
    summed fields (used memory, SM utilisation, status) of its first slots, or in its tail
    (the parts the decoder keeps apart), or not changed at all."""
    data = bytearray(draw(st_layout.region_bytes()))
    layout = layout_for_size(len(data))
    assert layout is not None
    summed = [layout.slot_status, layout.slot_status + 3]
    for d in range(3):
        used = layout.slot_used + d * layout.used_stride
        summed += range(used, used + 40)
        summed.append(layout.slot_util + d * layout.util_stride + 16)
    slot_bytes = st.builds(
        lambda slot, offset: layout.procs + slot * layout.slot_size + offset,
        st.integers(0, 3),
        st.sampled_from(summed),
    )
    positions = st.one_of(
        st.integers(0, layout.procs - 1),
        slot_bytes,
        st.integers(layout.tail_offset, layout.tail_offset + layout.tail_size - 1),
    )
    versions = [bytes(data)]
    for _ in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(0, 3))):
            data[draw(positions)] = draw(st.integers(0, 255))
        versions.append(bytes(data))
    return versions


@given(edited_regions())
def test_one_decoder_over_changing_bytes_answers_as_a_fresh_parse(versions: list[bytes]) -> None:
    decoder = RegionDecoder()
    previous: tuple[bytes, UsageSnapshot | CacheFileRejected] | None = None
    for data in versions:
        got = outcome_of(functools.partial(decode, decoder, data))
        same_outcome(got, outcome_of(functools.partial(reference_region, data)))
        if previous is not None and previous[0] == data and isinstance(got, UsageSnapshot):
            assert got is previous[1], "unchanged bytes: the same snapshot object"
        previous = (data, got)


# -- sums without the exited slots (--exclude-exited-processes) ---------------------------


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 1 << 40)), max_size=20),
    st.frozensets(st.integers(0, 5)),
)
def test_sums_without_some_host_pids_are_the_sums_of_the_other_slots(
    slots: list[tuple[int, int, int]], exclude: frozenset[int]
) -> None:
    procs = [
        ProcSlot(pid=i + 1, hostpid=hostpid, status=status, used=[MemoryUse(total=total)])
        for i, (hostpid, status, total) in enumerate(slots)
    ]
    spec = RegionSpec(uuids=["GPU-0"], procs=procs)
    data = build_region(spec)
    kept = [p for p in procs if p.status and p.hostpid not in exclude]
    totals = sum_slots_without(V1, data, len(procs), exclude)
    assert totals.devices[0].memory_total == sum(p.used[0].total for p in kept)
    assert totals.active_slots == len(kept)
    assert totals.host_pids == tuple(p.hostpid for p in kept)
    assert totals == reference_sums(V1, data, len(procs), exclude)
    if not exclude:
        snapshot = parse_region(data)
        assert (totals.devices, totals.active_slots) == (snapshot.devices, snapshot.active_slots)


def test_sums_without_need_the_slots_they_sum() -> None:
    data = region()
    with pytest.raises(ValueError, match=f"^head needs {V1.body_size(2)} bytes for 2 slots"):
        sum_slots_without(V1, data[: V1.body_size(2) - 1], 2, frozenset())


def test_the_lister_builds_its_states_as_the_class_does() -> None:
    from hami_trio.monitor.state import (
        ContainerKey,
        ContainerState,
        ContainerStatus,
        new_container_state,
    )

    values: list[Any] = [
        ContainerKey("pod", "main"),
        "/hook/containers/pod_main",
        "x.cache",
        ContainerStatus.LOADED,
        parse_region(region()),
        None,
    ]
    made = new_container_state(*values)
    assert type(made) is ContainerState
    assert made == ContainerState(*values)
    assert hash(made) == hash(ContainerState(*values))
    assert [getattr(made, f.name) for f in dataclasses.fields(ContainerState)] == values
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.status = ContainerStatus.REJECTED  # type: ignore[misc]
