"""The loader rule and the layout table (pure; the C cross-check is in test_layout_c.py)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given

from hami_trio.errors import CacheFileRejected, HamiTrioError
from hami_trio.monitor.layout import (
    LAYOUTS,
    MAGIC,
    MAX_SLOTS,
    ControlField,
    Format,
    Layout,
    RejectReason,
    clamp_proc_num,
    classify,
    layout_for_size,
)
from hami_trio.monitor.snapshot import UsageSnapshot, parse_region
from hami_trio.testing.regions import RegionSpec, build_region
from tests.strategies import layout as st_layout

V0 = LAYOUTS[Format.V0]
V1 = LAYOUTS[Format.V1]


def header(magic: int = MAGIC, major: int = 1, minor: int = 2) -> bytes:
    return struct.pack("<iii", magic, major, minor)


def rejected(size: int, head: bytes) -> CacheFileRejected:
    with pytest.raises(CacheFileRejected) as info:
        classify(size, head)
    assert isinstance(info.value, HamiTrioError)
    return info.value


def test_sizes_match_layout_md() -> None:
    assert (V0.sizeof, V1.sizeof) == (1197896, 2008952)
    assert (V0.slot_size, V1.slot_size) == (1168, 1960)
    assert (V1.proc_num, V1.recent_kernel, V1.utilization_switch) == (2008896, 2008904, 2008900)
    assert (V0.proc_num, V0.recent_kernel, V0.utilization_switch) == (1197880, 1197888, 1197884)
    assert V1.last_kernel_time == 2008912
    assert V0.last_kernel_time is None
    assert (V0.tail_size, V1.tail_size) == (16, 24)


def test_control_words_are_aligned_32_bit_words() -> None:
    for layout in (V0, V1):
        for field in ControlField:
            assert field.offset(layout) % 4 == 0


# -- upstream loadCache cases (HAMi pkg/monitor/nvidia/cudevshr_test.go) -------------------


def test_cache_file_too_small() -> None:
    error = rejected(4, b"tiny")
    assert error.reason == RejectReason.TOO_SMALL
    assert "too small" in str(error)


def test_magic_flag_mismatch_reports_the_value_found() -> None:
    error = rejected(64, header(magic=0))
    assert error.reason == RejectReason.MAGIC
    assert "found 0" in str(error)
    assert str(MAGIC) in str(error)


def test_unknown_version_and_size() -> None:
    error = rejected(64, header(major=99, minor=0))
    assert error.reason == RejectReason.UNKNOWN_VERSION
    assert str(error).startswith("unknown cache file size 64 version 99.0")


def test_v1_header_but_file_too_small_for_v1() -> None:
    error = rejected(64, header(major=1, minor=0))
    assert error.reason == RejectReason.UNKNOWN_VERSION
    assert "unknown cache file size 64 version 1.0" in str(error)


@pytest.mark.parametrize("size", [V1.sizeof, V1.sizeof + 1])
def test_v1_cache_file_and_its_plus_one_size(size: int) -> None:
    assert classify(size, header(major=1, minor=0)) is V1
    assert classify(size, header(major=1, minor=2)) is V1


@pytest.mark.parametrize("size", [V0.sizeof, V0.sizeof + 1, V1.sizeof - 1])
def test_v0_by_size_alone_whatever_the_version_words(size: int) -> None:
    # v0 has no version words: bytes 4..12 are sm_init_flag and owner_pid.
    for major in (0, 1, 7, -3):
        assert classify(size, header(major=major)) is V0


def test_v0_data_round_trips_through_the_loader() -> None:
    spec = RegionSpec(format=Format.V0, num=2, limits=[4 << 30, 2 << 30])
    snapshot = parse_region(build_region(spec))
    assert snapshot.format is Format.V0
    assert snapshot.device_count == 2
    assert [d.memory_limit for d in snapshot.devices] == [4 << 30, 2 << 30]
    assert snapshot.major is None
    assert snapshot.minor is None
    assert snapshot.last_kernel_time == 0


# -- beyond upstream ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2008984, 2008985])
@pytest.mark.parametrize("minor", [1, 2])
def test_known_mislayout_is_rejected_not_misread(size: int, minor: int) -> None:
    error = rejected(size, header(major=1, minor=minor))
    assert error.reason == RejectReason.UNKNOWN_VERSION
    assert f"size {size} version 1.{minor}" in str(error)
    assert "mis-layout" in str(error)
    assert layout_for_size(size) is None


@pytest.mark.parametrize("size", [2008983, 2008986, 4 << 20])
def test_sizes_next_to_the_mislayout_still_load_as_v1(size: int) -> None:
    assert classify(size, header()) is V1


@pytest.mark.parametrize("size", [12, 13, V0.sizeof - 1])
def test_between_header_and_v0_is_unknown(size: int) -> None:
    assert rejected(size, header()).reason == RejectReason.UNKNOWN_VERSION


def test_magic_is_checked_before_the_size_rule() -> None:
    assert rejected(V1.sizeof + 1, header(magic=MAGIC + 1)).reason == RejectReason.MAGIC
    assert rejected(V0.sizeof, header(magic=-1)).reason == RejectReason.MAGIC


def test_v1_size_with_other_major_is_unknown() -> None:
    error = rejected(V1.sizeof + 1, header(major=2, minor=0))
    assert str(error) == f"unknown cache file size {V1.sizeof + 1} version 2.0"


def test_classify_requires_the_header_when_the_file_has_one() -> None:
    with pytest.raises(ValueError, match="first 12 bytes"):
        classify(64, b"\x00" * 4)


@pytest.mark.parametrize(
    ("raw", "clamped"), [(-5, 0), (0, 0), (3, 3), (1024, 1024), (1025, 1024), (2000, 1024)]
)
def test_clamp_proc_num(raw: int, clamped: int) -> None:
    assert clamp_proc_num(raw) == clamped
    assert clamp_proc_num(2**31 - 1) == MAX_SLOTS
    assert clamp_proc_num(-(2**31)) == 0


def test_layout_table_accessors() -> None:
    assert V1.field("major_version") == (4, 4)
    assert V0.field("major_version") is None
    assert V1.slot_field("seqlock") == (1936, 8)
    assert V0.slot_field("seqlock") is None
    with pytest.raises(KeyError):
        V1.field("no_such_member")
    assert V1.name == "v1"
    assert V1.body_size(8) == 1856 + 8 * 1960


@given(st_layout.sizes_and_headers())
def test_classify_returns_a_layout_or_a_typed_rejection(case: tuple[int, bytes]) -> None:
    size, head = case
    outcome: Layout | CacheFileRejected
    try:
        outcome = classify(size, head)
    except CacheFileRejected as exc:
        outcome = exc
    if isinstance(outcome, CacheFileRejected):
        assert outcome.reason in set(RejectReason)
        assert layout_for_size(size) is None or outcome.reason in (
            RejectReason.MAGIC,
            RejectReason.UNKNOWN_VERSION,
        )
        return
    assert isinstance(outcome, Layout)
    assert outcome is layout_for_size(size)
    assert size >= outcome.sizeof


@given(st_layout.region_bytes())
def test_parse_region_of_any_bytes_is_a_snapshot_or_a_typed_rejection(data: bytes) -> None:
    outcome: UsageSnapshot | CacheFileRejected
    try:
        outcome = parse_region(data)
    except CacheFileRejected as exc:
        outcome = exc
    if isinstance(outcome, CacheFileRejected):
        assert outcome.reason in (RejectReason.MAGIC, RejectReason.UNKNOWN_VERSION)
        return
    assert 0 <= outcome.device_count <= 16
    assert len(outcome.devices) == outcome.device_count
    assert len(outcome.uuids) == 16
    assert 0 <= outcome.active_slots <= clamp_proc_num(outcome.proc_num)
    for device in outcome.devices:
        for value in (device.memory_total, device.sm_util, device.offset):
            assert 0 <= value < 2**64
