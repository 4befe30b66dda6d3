"""The loader rule's boundaries and messages, and the table lookups, pinned exactly.

test_layout.py and test_layout_c.py check the tables against the C structs and docs; these
tests pin the sizes on both sides of each boundary of the rule (v0 below v1's size, v1 from
it, the refused mis-layout), each rejection's whole message (it reaches the operator through
the rejection log line and ``hami-trio status``) and the table lookups' edge rows.
"""

from __future__ import annotations

import struct

import pytest

from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import (
    MAGIC,
    V0,
    V1,
    ControlField,
    RejectReason,
    classify,
    is_initialising,
    layout_for_size,
)


def header(magic: int = MAGIC, major: int = 1, minor: int = 2) -> bytes:
    return struct.pack("<iii", magic, major, minor)


def rejected(size: int, data: bytes) -> tuple[str, str]:
    with pytest.raises(CacheFileRejected) as info:
        classify(size, data)
    return info.value.reason, str(info.value)


def test_the_sizes() -> None:
    assert (V0.sizeof, V1.sizeof) == (1197896, 2008952)
    assert MAGIC == 19920718


def test_control_words_in_both_formats() -> None:
    assert ControlField.RECENT_KERNEL.offset(V0) == 1197888
    assert ControlField.UTILIZATION_SWITCH.offset(V0) == 1197884
    assert ControlField.RECENT_KERNEL.offset(V1) == 2008904
    assert ControlField.UTILIZATION_SWITCH.offset(V1) == 2008900


def test_field_lookups() -> None:
    assert V0.field("major_version") is None
    assert V1.field("major_version") == (4, 4)
    assert V0.field("initialized_flag") == (0, 4)
    assert V0.field("sizeof") == (0, 1197896)  # the pseudo-row has no offset: 0
    assert V1.slot_field("sizeof") == (0, 1960)
    assert V0.slot_field("seqlock") is None
    with pytest.raises(KeyError) as info:
        V1.field("no_such_member")
    assert info.value.args == ("no_such_member",)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1197895, None),
        (1197896, V0),
        (2008951, V0),
        (2008952, V1),
        (2008953, V1),
        (2008983, V1),
        (2008984, None),
        (2008985, None),
        (2008986, V1),
    ],
)
def test_layout_for_size_at_each_boundary(size: int, expected: object) -> None:
    assert layout_for_size(size) is expected


@pytest.mark.parametrize(
    ("size", "major", "expected"),
    [(1197896, 0, V0), (2008951, 7, V0), (2008952, 1, V1), (2008986, 1, V1)],
)
def test_classify_at_each_boundary(size: int, major: int, expected: object) -> None:
    assert classify(size, header(major=major)) is expected


@pytest.mark.parametrize(
    ("size", "data", "reason", "message"),
    [
        (11, b"", RejectReason.TOO_SMALL, "cache file size 11 too small (< 12 bytes)"),
        (
            2008952,
            header(magic=7, major=1, minor=2),
            RejectReason.MAGIC,
            "cache file magic flag not matched: found 7, expected 19920718 (size 2008952, "
            "header version 1.2): not a HAMi-core shared-region file (every HAMi-core version "
            "writes that magic), or a damaged one",
        ),
        (
            2008952,
            bytes(12),
            RejectReason.MAGIC,
            "cache file magic flag not matched: found 0, expected 19920718 (size 2008952): "
            "HAMi-core has not finished initialising it (it loads once it has), or it is not "
            "a HAMi-core shared-region file",
        ),
        (
            2008952,
            header(magic=1, major=0, minor=0),
            RejectReason.MAGIC,
            "cache file magic flag not matched: found 1, expected 19920718 (size 2008952, "
            "header version 0.0): not a HAMi-core shared-region file (every HAMi-core version "
            "writes that magic), or a damaged one",
        ),
        (
            2008984,
            header(minor=1),
            RejectReason.UNKNOWN_VERSION,
            "unknown cache file size 2008984 version 1.1 (the incompatible HAMi-core v1 "
            "mis-layout of 2008984 bytes; upgrade HAMi-core)",
        ),
        (
            2008985,
            header(minor=1),
            RejectReason.UNKNOWN_VERSION,
            "unknown cache file size 2008985 version 1.1 (the incompatible HAMi-core v1 "
            "mis-layout of 2008984 bytes; upgrade HAMi-core)",
        ),
        (
            2008952,
            header(major=2, minor=0),
            RejectReason.UNKNOWN_VERSION,
            "unknown cache file size 2008952 version 2.0",
        ),
        (
            1197895,
            header(),
            RejectReason.UNKNOWN_VERSION,
            "unknown cache file size 1197895 version 1.2",
        ),
    ],
)
def test_rejections_word_for_word(size: int, data: bytes, reason: str, message: str) -> None:
    assert rejected(size, data) == (reason, message)


def test_only_a_magic_of_zero_is_a_file_still_initialising() -> None:
    def rejection(size: int, data: bytes) -> CacheFileRejected:
        with pytest.raises(CacheFileRejected) as info:
            classify(size, data)
        return info.value

    assert is_initialising(rejection(2008952, bytes(12))) is True
    assert is_initialising(rejection(1197880, header(magic=0, major=5))) is True
    assert is_initialising(rejection(2008952, header(magic=7))) is False
    assert is_initialising(rejection(11, b"")) is False
    assert is_initialising(rejection(2008952, header(major=2))) is False
    # the reason alone, or the words alone, are not enough
    words = str(rejection(2008952, bytes(12)))
    assert is_initialising(CacheFileRejected(RejectReason.UNKNOWN_VERSION, words)) is False
    assert is_initialising(CacheFileRejected(RejectReason.MAGIC, "found 0")) is False


def test_the_tail_struct_reads_the_members_each_format_has() -> None:
    # proc_num, utilization_switch, recent_kernel, priority (int32), last_kernel_time (u64):
    # contiguous in both formats; v0 lacks the last, which a 0 stands in for
    assert (V1.tail_offset, V1.tail_size, V1.tail_struct.format, V1.tail_absent) == (
        2008896,
        24,
        "<iiiiQ",
        (),
    )
    assert (V0.tail_offset, V0.tail_size, V0.tail_struct.format, V0.tail_absent) == (
        1197880,
        16,
        "<iiii",
        (0,),
    )


def test_a_short_header_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match=r"^classify needs the first 12 bytes, got 4$"):
        classify(2008952, b"\x00" * 4)


def test_the_priority_word_and_the_control_field_names() -> None:
    assert (V0.priority, V1.priority) == (1197892, 2008908)
    assert [f.value for f in ControlField] == ["recent_kernel", "utilization_switch"]


def test_reject_reasons_are_the_documented_label_values() -> None:
    # The reason label of hami_trio_monitor_files_rejected_total (docs/metrics.md).
    assert [r.value for r in RejectReason] == [
        "too_small",
        "magic",
        "unknown_version",
        "not_regular_file",
        "hard_link",
        "replaced",
        "truncated",
        "io_error",
        "too_many_files",
    ]
