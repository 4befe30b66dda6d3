"""The ``hami.io/vgpu-devices-allocated`` decoder: HAMi's format, Go's rules, the caps.

The expectations follow HAMi's ``DecodePodDevices`` / ``DecodeContainerDevices``: entries by
``;`` all kept (empty ones too, so the trailing ``;`` of the encoder gives one empty entry),
devices by ``:`` with empty segments skipped, at least four ``,`` fields (more are ignored),
non-empty UUID and type, memory and cores parsed by ``strconv.ParseInt(s, 10, 32)`` and not
negative.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given

from hami_trio.pods.allocated import (
    MAX_ANNOTATION_BYTES,
    MAX_DEVICES,
    MAX_ENTRIES,
    MAX_FIELD_CHARS,
    MIB,
    AllocatedAnnotationError,
    AllocatedDevice,
    ContainerAllocation,
    allocated_containers,
    decode_allocated,
)
from tests.strategies.metrics import (
    AllocatedTuple,
    allocated_annotations,
    allocated_entries,
    encode_allocated,
    hostile_allocated_annotations,
)

A = AllocatedDevice("GPU-aaaa", "NVIDIA", 4096, 30)
B = AllocatedDevice("GPU-bbbb", "NVIDIA", 2048, 0)


def test_the_example_of_the_format() -> None:
    # Two devices for the first entry, then two empty entries (the last one after the
    # encoder's trailing ";").
    assert decode_allocated("GPU-aaaa,NVIDIA,4096,30:GPU-bbbb,NVIDIA,2048,0:;;") == ((A, B), (), ())
    assert A.memory_bytes == 4096 * MIB == 4096 << 20


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ()),
        ("", ()),
        (";", ((), ())),
        ("GPU-aaaa,NVIDIA,4096,30", ((A,),)),  # no trailing separators
        ("::GPU-aaaa,NVIDIA,4096,30::", ((A,),)),  # empty device segments are skipped
        ("GPU-aaaa,NVIDIA,4096,30,extra,more", ((A,),)),  # fields after the fourth ignored
        ("GPU-aaaa,NVIDIA,+4096,030", ((A,),)),  # Go's ParseInt: sign and leading zeros
        ("GPU-aaaa,NVIDIA,4096,-0", ((AllocatedDevice("GPU-aaaa", "NVIDIA", 4096, 0),),)),
        ("x,y,2147483647,0", ((AllocatedDevice("x", "y", (1 << 31) - 1, 0),),)),
        (";;GPU-bbbb,NVIDIA,2048,0:;", ((), (), (B,), ())),
    ],
)
def test_accepted_like_upstream(raw: str | None, expected: object) -> None:
    assert decode_allocated(raw) == expected


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("GPU-aaaa", "is not UUID,Type,MiB,cores"),
        ("GPU-aaaa,NVIDIA,4096", "3 fields"),
        (",NVIDIA,1,1", "missing device UUID"),
        ("GPU-a,,1,1", "missing device type"),
        ("GPU-a,NVIDIA,-1,1", "memory -1 is negative"),
        ("GPU-a,NVIDIA,1,-5", "cores -5 is negative"),
        ("GPU-a,NVIDIA, 1,1", "memory ' 1' is not an integer"),
        ("GPU-a,NVIDIA,1 ,1", "is not an integer"),
        ("GPU-a,NVIDIA,1_000,1", "is not an integer"),
        ("GPU-a,NVIDIA,0x10,1", "is not an integer"),
        ("GPU-a,NVIDIA,\u0661,1", "is not an integer"),  # Python's int() would take it
        ("GPU-a,NVIDIA,,1", "memory '' is not an integer"),
        ("GPU-a,NVIDIA,2147483648,1", "out of range"),
        ("GPU-a,NVIDIA,1,-2147483649", "out of range"),
        ("GPU-a,NVIDIA,1," + "9" * 5000, "out of range"),
        ("ok,NVIDIA,1,1:;bad,NVIDIA,x,1", "container entry 1, device 0: memory 'x'"),
        ("GPU-\ud800,NVIDIA,1,1", "lone UTF-16 surrogate"),
        ("G" * (MAX_FIELD_CHARS + 1) + ",NVIDIA,1,1", f"more than the {MAX_FIELD_CHARS}"),
        ("GPU-a,NVIDIA,1,1:" * (MAX_DEVICES + 1), f"more than the {MAX_DEVICES} devices"),
        (";" * MAX_ENTRIES, f"{MAX_ENTRIES + 1} container entries"),
        (" " * (MAX_ANNOTATION_BYTES + 1), "longer than the"),
        ("\u00e9" * (MAX_ANNOTATION_BYTES // 2 + 1), "longer than the"),  # bytes, not chars
    ],
)
def test_refused_with_a_message_that_says_where(raw: str, words: str) -> None:
    with pytest.raises(AllocatedAnnotationError) as info:
        decode_allocated(raw)
    assert words in str(info.value)
    assert len(str(info.value)) < 200  # the value itself is never copied


def test_a_non_string_value_is_refused() -> None:
    with pytest.raises(AllocatedAnnotationError, match="expected a string"):
        decode_allocated(42)  # type: ignore[arg-type]


def test_entries_name_init_containers_first_then_containers() -> None:
    # HAMi's Resourcereqs numbers init containers 0..n-1, then the containers.
    entries = decode_allocated(
        "GPU-aaaa,NVIDIA,4096,30:;;GPU-aaaa,NVIDIA,4096,30:GPU-bbbb,NVIDIA,2048,0:;"
    )
    named, orphans = allocated_containers(("setup",), ("main", "worker"), entries)
    assert named == (
        ContainerAllocation("setup", 0, A),
        ContainerAllocation("worker", 0, A),
        ContainerAllocation("worker", 1, B),
    )
    assert orphans == ()  # the trailing empty entry names nothing and lists nothing


def test_entries_past_the_last_container_are_reported_not_named() -> None:
    entries = decode_allocated("GPU-aaaa,NVIDIA,4096,30:;;GPU-bbbb,NVIDIA,2048,0:;")
    named, orphans = allocated_containers((), ("main",), entries)
    assert named == (ContainerAllocation("main", 0, A),)
    assert orphans == (2,)


def test_vdevice_index_counts_devices_not_segments() -> None:
    (entry,) = decode_allocated("::GPU-aaaa,NVIDIA,4096,30:::GPU-bbbb,NVIDIA,2048,0")
    named, _ = allocated_containers((), ("main",), (entry,))
    assert [(a.vdevice_index, a.device.uuid) for a in named] == [(0, "GPU-aaaa"), (1, "GPU-bbbb")]


@given(allocated_entries())
def test_what_hami_encodes_decodes_to_the_same_devices(entries: list[list[AllocatedTuple]]) -> None:
    decoded = decode_allocated(encode_allocated(entries))
    expected = [[AllocatedDevice(*device) for device in entry] for entry in entries]
    # The encoder's trailing ";" adds one empty entry (an empty pod encodes to nothing).
    assert [list(entry) for entry in decoded] == ([*expected, []] if entries else [])


@given(allocated_annotations())
@example("GPU-a,NVIDIA,1,2:;x")
def test_any_annotation_decodes_or_raises_its_error(raw: str) -> None:
    try:
        entries = decode_allocated(raw)
    except AllocatedAnnotationError as exc:
        message = str(exc)
    else:
        message = ""
        for entry in entries:
            for device in entry:
                assert device.uuid
                assert device.type
                assert 0 <= device.memory_mib < 1 << 31
                assert 0 <= device.cores < 1 << 31
        return
    assert message


@given(hostile_allocated_annotations())
def test_hostile_annotations_decode_within_bounds_or_raise_our_error(raw: str) -> None:
    try:
        entries = decode_allocated(raw)
    except AllocatedAnnotationError as exc:
        message = str(exc)
        assert 0 < len(message) < 300
        return
    assert len(entries) <= MAX_ENTRIES
    devices = [device for entry in entries for device in entry]
    assert len(devices) <= MAX_DEVICES
    for device in devices:
        assert len(device.uuid) <= MAX_FIELD_CHARS
        assert len(device.type) <= MAX_FIELD_CHARS
        device.uuid.encode("utf-8")  # a label value: must be valid Unicode
