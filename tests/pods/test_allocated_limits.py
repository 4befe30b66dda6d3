"""The allocated decoder's documented limits and Go's integer syntax, pinned to the numbers.

test_allocated.py refuses "limit + 1" through the ``MAX_*`` constants themselves; these tests
use the documented figures (64 KiB, 512 entries, 128 devices, 128-character fields, int32)
and show both sides of each bound: exactly at the limit is accepted, one past it is refused
with the words the collector's warning carries.
"""

from __future__ import annotations

import pytest

from hami_trio.pods.allocated import (
    ALLOCATED_ANNOTATION,
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

A = AllocatedDevice("GPU-aaaa", "NVIDIA", 4096, 30)
B = AllocatedDevice("GPU-bbbb", "NVIDIA", 2048, 0)
DEVICE = "GPU-a,NVIDIA,1,1"
D = AllocatedDevice("GPU-a", "NVIDIA", 1, 1)


def refusal(raw: str) -> str:
    with pytest.raises(AllocatedAnnotationError) as info:
        decode_allocated(raw)
    return str(info.value)


def test_the_documented_numbers() -> None:
    assert ALLOCATED_ANNOTATION == "hami.io/vgpu-devices-allocated"
    assert MAX_ANNOTATION_BYTES == 65536
    assert MAX_ENTRIES == 512
    assert MAX_DEVICES == 128
    assert MAX_FIELD_CHARS == 128
    assert MIB == 1048576
    assert AllocatedDevice("u", "t", 3, 0).memory_bytes == 3 * 1048576


# -- 64 KiB of UTF-8 ---------------------------------------------------------------------------


def test_an_annotation_of_exactly_64_kib_is_decoded() -> None:
    # Empty device segments are skipped: 65536 colons are one entry without devices.
    assert decode_allocated(":" * 65536) == ((),)


def test_one_character_past_64_kib_is_refused() -> None:
    assert refusal(":" * 65537) == "65537 characters, longer than the 65536 bytes allowed"


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    device = "GPU-\u00e9,NVIDIA,1,1"  # 16 characters, 17 bytes
    at_limit = device + ":" * (65536 - 17)
    assert len(at_limit.encode()) == 65536
    assert decode_allocated(at_limit) == ((AllocatedDevice("GPU-\u00e9", "NVIDIA", 1, 1),),)
    over = at_limit + ":"
    assert refusal(over) == f"{len(over)} characters, longer than the 65536 bytes allowed"
    assert len(over) == 65536  # at the limit in characters, over it in bytes


def test_lone_surrogates_count_as_their_three_bytes() -> None:
    # "surrogatepass": a lone surrogate is measured (3 bytes) instead of crashing the count.
    over = "\ud800" * 21846  # 65538 bytes in 21846 characters
    assert refusal(over) == "21846 characters, longer than the 65536 bytes allowed"
    assert "lone UTF-16 surrogate" in refusal("\ud800,NVIDIA,1,1")


# -- 512 entries ----------------------------------------------------------------------------------


def test_512_entries_are_decoded() -> None:
    assert decode_allocated(";" * 511) == ((),) * 512
    last = ";" * 511 + DEVICE
    assert decode_allocated(last)[511] == (D,)


def test_513_entries_are_refused() -> None:
    assert refusal(";" * 512) == "513 container entries, more than the 512 allowed"
    assert refusal(DEVICE + ";" * 600) == "601 container entries, more than the 512 allowed"


# -- 128 devices, all containers together ------------------------------------------------------


def test_128_devices_are_decoded() -> None:
    (entry,) = decode_allocated(":".join([DEVICE] * 128))
    assert len(entry) == 128
    split = decode_allocated(";".join([":".join([DEVICE] * 64)] * 2))
    assert [len(e) for e in split] == [64, 64]


def test_the_129th_device_is_refused_even_in_another_container() -> None:
    message = "more than the 128 devices one pod may have"
    assert refusal(":".join([DEVICE] * 129)) == message
    assert refusal(":".join([DEVICE] * 65) + ";" + ":".join([DEVICE] * 64)) == message
    # The count runs over devices, not segments: empty segments do not count.
    assert len(decode_allocated("::".join([DEVICE] * 128) + "::")[0]) == 128


# -- 128-character UUID and type -----------------------------------------------------------------


@pytest.mark.parametrize("what", ["UUID", "type"])
def test_fields_of_128_characters_are_accepted(what: str) -> None:
    text = "G" * 128
    raw = f"{text},NVIDIA,1,1" if what == "UUID" else f"GPU-a,{text},1,1"
    ((device,),) = decode_allocated(raw)
    assert (device.uuid if what == "UUID" else device.type) == text


@pytest.mark.parametrize("what", ["UUID", "type"])
def test_fields_of_129_characters_are_refused(what: str) -> None:
    text = "G" * 129
    raw = f"{text},NVIDIA,1,1" if what == "UUID" else f"GPU-a,{text},1,1"
    assert refusal(raw) == (
        f"container entry 0, device 0: device {what} of 129 characters, more than the 128 allowed"
    )


def test_non_ascii_fields_are_kept() -> None:
    assert decode_allocated("GPU-\u00e9\u4e2d,\u00c9,1,1") == (
        (AllocatedDevice("GPU-\u00e9\u4e2d", "\u00c9", 1, 1),),
    )


@pytest.mark.parametrize("what", ["UUID", "type"])
def test_surrogate_message(what: str) -> None:
    raw = "GPU-\ud800,NVIDIA,1,1" if what == "UUID" else "GPU-a,x\udfff,1,1"
    shown = "'GPU-\\ud800'" if what == "UUID" else "'x\\udfff'"
    assert refusal(raw) == (
        f"container entry 0, device 0: device {what} {shown} holds a lone UTF-16 surrogate"
    )


# -- Go's strconv.ParseInt(s, 10, 32) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("+0", 0),
        ("-0", 0),
        ("4096", 4096),
        ("+2147483647", 2147483647),
        ("2147483647", 2147483647),
        ("00000000004096", 4096),
        ("0000000002147483647", 2147483647),
        ("+0000000000000000000000001", 1),
    ],
)
def test_go_integer_syntax_is_accepted(text: str, value: int) -> None:
    ((memory,),) = decode_allocated(f"u,t,{text},0")
    assert memory.memory_mib == value
    ((cores,),) = decode_allocated(f"u,t,0,{text}")
    assert cores.cores == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2147483648", "'2147483648' is out of range"),
        ("+2147483648", "'+2147483648' is out of range"),
        ("00000000002147483648", "'00000000002147483648' is out of range"),
        ("9999999999", "'9999999999' is out of range"),
        ("99999999999", "'99999999999' is out of range"),
        ("-2147483649", "'-2147483649' is out of range"),
        ("-2147483648", "-2147483648 is negative"),
        ("-1", "-1 is negative"),
        ("-01", "-1 is negative"),
        ("++1", "'++1' is not an integer"),
        ("1+", "'1+' is not an integer"),
        ("1\n", "'1\\n' is not an integer"),
        ("", "'' is not an integer"),
    ],
)
def test_go_integer_refusals(text: str, message: str) -> None:
    assert refusal(f"u,t,{text},0") == f"container entry 0, device 0: memory {message}"
    assert refusal(f"u,t,0,{text}") == f"container entry 0, device 0: cores {message}"


def test_long_values_are_shown_cut_at_40_characters() -> None:
    forty = "x" * 40
    assert refusal(f"u,t,{forty},0") == (
        f"container entry 0, device 0: memory '{forty}' is not an integer"
    )
    assert refusal(f"u,t,{forty}y,0") == (
        f"container entry 0, device 0: memory '{forty}...' is not an integer"
    )
    assert refusal("1" * 41) == (
        f"container entry 0, device 0: '{'1' * 40}...' is not UUID,Type,MiB,cores"
    )


# -- where: entry and segment positions, word for word ------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("GPU-a", "container entry 0, device 0: 'GPU-a' is not UUID,Type,MiB,cores"),
        ("::GPU-a", "container entry 0, device 2: 'GPU-a' is not UUID,Type,MiB,cores"),
        (
            ";;" + DEVICE + ":x,y",
            "container entry 2, device 1: 2 fields, want UUID,Type,memory MiB,cores",
        ),
        ("a,b,c", "container entry 0, device 0: 3 fields, want UUID,Type,memory MiB,cores"),
        (",t,1,1", "container entry 0, device 0: missing device UUID"),
        ("u,,1,1", "container entry 0, device 0: missing device type"),
    ],
)
def test_refusal_messages_name_the_entry_and_segment(raw: str, message: str) -> None:
    assert refusal(raw) == message


def test_a_non_string_value_names_its_type() -> None:
    assert refusal(b"x") == "expected a string value, got bytes"  # type: ignore[arg-type]
    assert refusal(7) == "expected a string value, got int"  # type: ignore[arg-type]


def test_four_fields_suffice_and_a_fifth_is_ignored() -> None:
    assert decode_allocated("u,t,1,2") == ((AllocatedDevice("u", "t", 1, 2),),)
    assert decode_allocated("u,t,1,2,") == ((AllocatedDevice("u", "t", 1, 2),),)
    assert decode_allocated("u,t,1,2,x,y,z") == ((AllocatedDevice("u", "t", 1, 2),),)
    # The fifth field is not checked as a number or a text field.
    assert decode_allocated("u,t,1,2,-5") == ((AllocatedDevice("u", "t", 1, 2),),)
    assert decode_allocated("u,t,1,2,,") == ((AllocatedDevice("u", "t", 1, 2),),)


# -- orphan entries after the last container -----------------------------------------------------


def test_one_orphan_entry_after_the_last_container() -> None:
    entries = decode_allocated("GPU-aaaa,NVIDIA,4096,30:;GPU-bbbb,NVIDIA,2048,0:;")
    named, orphans = allocated_containers((), ("main",), entries)
    assert named == (ContainerAllocation("main", 0, A),)
    assert orphans == (1,)


def test_two_orphan_entries_after_the_last_container() -> None:
    entries = decode_allocated(
        "GPU-aaaa,NVIDIA,4096,30;GPU-bbbb,NVIDIA,2048,0;;GPU-aaaa,NVIDIA,4096,30:GPU-bbbb,NVIDIA,2048,0;"
    )
    named, orphans = allocated_containers(("init",), (), entries)
    assert named == (ContainerAllocation("init", 0, A),)
    assert orphans == (1, 3)


def test_the_entry_just_past_the_names_is_an_orphan() -> None:
    entries = ((A,), (B,), (A, B))
    named, orphans = allocated_containers(("i",), ("c",), entries)
    assert named == (ContainerAllocation("i", 0, A), ContainerAllocation("c", 0, B))
    assert orphans == (2,)


def test_empty_entries_between_containers_keep_the_indexes() -> None:
    named, orphans = allocated_containers((), ("a", "b", "c"), ((), (), (B,), ()))
    assert named == (ContainerAllocation("c", 0, B),)
    assert orphans == ()
    assert allocated_containers((), (), ()) == ((), ())
    assert allocated_containers((), (), ((),)) == ((), ())
