"""The tick's decoder: the tail every tick, the static head only when something says so."""

from __future__ import annotations

import pytest

from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import LAYOUTS, Format, RejectReason
from hami_trio.monitor.snapshot import STATIC_REFRESH_TICKS, TickDecoder
from hami_trio.testing.regions import ProcSlot, RegionSpec, build_region
from tests.monitor.regionfile import File

V1 = LAYOUTS[Format.V1]


def file_of(region: RegionSpec) -> File:
    return File(build_region(region))


def tail_only(file: File) -> bool:
    return file.asked == [(V1.tail_offset, V1.tail_size)]


def spec(**kwargs: object) -> RegionSpec:
    base: dict[str, object] = {"uuids": ["GPU-a"], "procs": [ProcSlot(pid=1)], "priority": 2}
    base.update(kwargs)
    return RegionSpec(**base)  # type: ignore[arg-type]


def test_the_first_read_takes_the_head_then_only_the_tail() -> None:
    file, decoder = file_of(spec(recent_kernel=2)), TickDecoder()
    first = file.read(decoder)
    assert file.asked == [(V1.tail_offset, V1.tail_size), (0, V1.procs)]
    assert (first.priority, first.recent_kernel, first.device_count) == (2, 2, 1)
    assert first.device_keys == (b"GPU-a".ljust(96, b"\0"),)
    assert file.read(decoder) is first  # nothing changed: the same object
    assert tail_only(file)
    file.put(V1.recent_kernel, (-1).to_bytes(4, "little", signed=True))
    blocked = file.read(decoder)
    assert tail_only(file)
    assert blocked.recent_kernel == -1
    assert blocked.device_keys is first.device_keys


def test_the_head_is_read_again_every_refresh_and_a_rewritten_uuid_is_seen() -> None:
    file, decoder = file_of(spec()), TickDecoder(phase=0)
    file.read(decoder)
    file.put(V1.uuids, b"GPU-b".ljust(96, b"\0"))  # the tenant rewrites its own UUID
    heads = 0
    for _ in range(STATIC_REFRESH_TICKS):
        snapshot = file.read(decoder)
        heads += not tail_only(file)
    assert heads == 1
    assert snapshot.device_keys == (b"GPU-b".ljust(96, b"\0"),)


def test_phases_spread_the_head_reads_over_the_ticks() -> None:
    file = file_of(spec())
    decoders = [TickDecoder(phase=p) for p in range(STATIC_REFRESH_TICKS)]
    for decoder in decoders:
        file.read(decoder)
    per_tick = []
    for _ in range(2 * STATIC_REFRESH_TICKS):
        heads = 0
        for decoder in decoders:
            file.read(decoder)
            heads += not tail_only(file)
        per_tick.append(heads)
    assert per_tick == [1] * (2 * STATIC_REFRESH_TICKS)


@pytest.mark.parametrize(("before", "after"), [(0, 1), (3, 0)])
def test_proc_num_from_or_to_zero_reads_the_head(before: int, after: int) -> None:
    file, decoder = file_of(spec(proc_num=before)), TickDecoder()
    file.read(decoder)
    file.put(V1.proc_num, after.to_bytes(4, "little"))
    assert file.read(decoder).proc_num == after
    assert file.asked[-1] == (0, V1.procs)
    file.put(V1.proc_num, (2 * after).to_bytes(4, "little"))  # 1 -> 2, or 0 stays 0
    file.read(decoder)
    assert tail_only(file)


def test_a_bad_magic_is_refused_at_the_next_head_read_and_a_changed_size_at_once() -> None:
    file, decoder = file_of(spec()), TickDecoder(refresh_every=3)
    file.read(decoder)
    file.put(0, b"\0\0\0\1")
    seen = []
    for _ in range(3):
        try:
            file.read(decoder)
            seen.append("ok")
        except CacheFileRejected as exc:
            seen.append(exc.reason)
    # the tail alone until the refresh is due (this decoder's phase: at its third decode)
    assert seen == ["ok", RejectReason.MAGIC, RejectReason.MAGIC]
    file.put(0, (19920718).to_bytes(4, "little"))
    assert file.read(decoder).priority == 2  # a failed head is read again next time
    file.data += b"\0"  # another size: decoded afresh, head and all
    assert file.read(decoder).file_size == V1.sizeof + 2
    assert file.asked[-1] == (0, V1.procs)
    assert decoder.size == V1.sizeof + 2


def test_refresh_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="refresh_every must be >= 1 tick, got 0"):
        TickDecoder(refresh_every=0)


def test_a_size_no_layout_fits_is_refused_with_its_header() -> None:
    decoder = TickDecoder()
    assert decoder.start(64) == (0, 12)
    with pytest.raises(CacheFileRejected) as caught:
        decoder.feed(b"\0" * 12)
    assert caught.value.reason in (RejectReason.MAGIC, RejectReason.UNKNOWN_VERSION)
    assert decoder.layout is None
    decoder.start(V1.sizeof + 1)
    with pytest.raises(ValueError, match="asked for 24 bytes, got 3"):
        decoder.feed(b"abc")
