"""The MIG annotation decoder's documented limits and messages, pinned to the numbers.

test_migalloc.py checks what HAMi's Go decoder accepts and refuses; these tests pin both
sides of each bound (64 KiB, 128 allocations, 128-character fields, int64 indexes, uint32
IDs and placements) and the whole message the collector's warning carries.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hami_trio.pods.migalloc import (
    MAX_ALLOCATIONS,
    MAX_ANNOTATION_BYTES,
    MAX_FIELD_CHARS,
    MIG_ALLOCATIONS_ANNOTATION,
    MigAllocation,
    MigAnnotationError,
    decode_mig_allocations,
)

REALISED: dict[str, Any] = {
    "containerIndex": 1,
    "deviceIndex": 0,
    "gpuUUID": "GPU-live",
    "profile": "1g.10gb",
    "placement": {"start": 6, "size": 1},
    "migUUID": "MIG-abc",
    "gpuInstanceID": 13,
    "computeInstanceID": 0,
}
LIVE = MigAllocation(1, 0, "GPU-live", "1g.10gb", 6, 1, "MIG-abc", 13, 0)


def refusal(raw: object) -> str:
    with pytest.raises(MigAnnotationError) as info:
        decode_mig_allocations(raw)  # type: ignore[arg-type]
    return str(info.value)


def one(**change: Any) -> str:
    return json.dumps([REALISED | change])


def test_the_documented_numbers() -> None:
    assert MIG_ALLOCATIONS_ANNOTATION == "hami.io/vgpu-mig-allocations"
    assert MAX_ANNOTATION_BYTES == 65536
    assert MAX_ALLOCATIONS == 128
    assert MAX_FIELD_CHARS == 128


def test_64_kib_of_utf8_is_the_limit() -> None:
    assert decode_mig_allocations("[" + " " * 65534 + "]") == ()
    assert refusal("[" + " " * 65535 + "]") == (
        "65537 characters, longer than the 65536 bytes allowed"
    )
    base = json.dumps([REALISED | {"note": "\u00e9"}], ensure_ascii=False)
    at_limit = base[:-1] + " " * (65536 - len(base.encode())) + "]"
    assert len(at_limit.encode()) == 65536
    assert decode_mig_allocations(at_limit) == (LIVE,)
    over = at_limit[:-1] + " ]"
    assert refusal(over) == "65536 characters, longer than the 65536 bytes allowed"


def test_128_allocations_are_the_limit() -> None:
    def many(count: int) -> str:
        return json.dumps([REALISED | {"deviceIndex": i} for i in range(count)])

    assert len(decode_mig_allocations(many(128))) == 128
    assert refusal(many(129)) == "129 allocations, more than the 128 one pod may have"


@pytest.mark.parametrize("field", ["gpuUUID", "profile", "migUUID"])
def test_128_character_fields_are_the_limit(field: str) -> None:
    (allocation,) = decode_mig_allocations(one(**{field: "G" * 128}))
    assert "G" * 128 in (allocation.gpu_uuid, allocation.profile, allocation.mig_uuid)
    assert refusal(one(**{field: "G" * 129})) == (
        f"allocation 0.{field}: 129 characters, more than the 128 allowed"
    )


@pytest.mark.parametrize("field", ["containerIndex", "deviceIndex"])
def test_indexes_are_int64(field: str) -> None:
    (allocation,) = decode_mig_allocations(one(**{field: 2**63 - 1}))
    assert (2**63 - 1) in (allocation.container_index, allocation.device_index)
    assert refusal(one(**{field: 2**63})) == (
        f"allocation 0.{field}: 9223372036854775808 is out of range"
    )
    assert refusal(one(**{field: -(2**63) - 1})) == (
        f"allocation 0.{field}: -9223372036854775809 is out of range"
    )
    # In range but negative: Go decodes it, HAMi's check refuses it as incomplete.
    assert refusal(one(**{field: -(2**63)})) == "MIG allocation 0 is incomplete"


@pytest.mark.parametrize("field", ["gpuInstanceID", "computeInstanceID"])
def test_instance_ids_are_uint32(field: str) -> None:
    for value in (0, 2**32 - 1):
        (allocation,) = decode_mig_allocations(one(**{field: value}))
        assert value in (allocation.gpu_instance_id, allocation.compute_instance_id)
    assert refusal(one(**{field: 2**32})) == f"allocation 0.{field}: 4294967296 is out of range"
    assert refusal(one(**{field: -1})) == f"allocation 0.{field}: -1 is out of range"


@pytest.mark.parametrize("part", ["start", "size"])
def test_placements_are_uint32(part: str) -> None:
    placement = {"start": 0, "size": 1} | {part: 2**32 - 1}
    (allocation,) = decode_mig_allocations(one(placement=placement))
    assert (allocation.placement_start, allocation.placement_size) == (
        placement["start"],
        placement["size"],
    )
    placement[part] = 2**32
    assert refusal(one(placement=placement)) == (
        f"allocation 0.placement.{part}: 4294967296 is out of range"
    )
    placement[part] = -1
    assert refusal(one(placement=placement)) == f"allocation 0.placement.{part}: -1 is out of range"


def test_placement_fields_default_to_zero_and_match_like_go() -> None:
    (allocation,) = decode_mig_allocations(one(placement={"SIZE": 3}))
    assert (allocation.placement_start, allocation.placement_size) == (0, 3)
    (allocation,) = decode_mig_allocations(one(placement={"Start": 2, "size": 1, "x": 0}))
    assert (allocation.placement_start, allocation.placement_size) == (2, 1)
    assert refusal(one(placement={"start": 2})) == "MIG allocation 0 is incomplete"
    assert refusal(one(placement=[])) == "allocation 0.placement: expected an object"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1.5, "1.5"),
        (1.0, "1.0"),
        ("1", '"1"'),
        (True, "true"),
        (False, "false"),
        ([1], "an array"),
        ({"a": 1}, "an object"),
        ("x" * 41, '"' + "x" * 40 + '..."'),
        ("x" * 40, '"' + "x" * 40 + '"'),
        ("\n", '"\\n"'),
        (1e300, "1e+300"),
    ],
)
def test_wrong_types_are_described_not_copied(value: Any, shown: str) -> None:
    assert refusal(one(containerIndex=value)) == (
        f"allocation 0.containerIndex: expected an integer, got {shown}"
    )


def test_long_numbers_are_counted_not_copied() -> None:
    assert refusal(one(deviceIndex=10**40)) == (
        "allocation 0.deviceIndex: a number of 41 digits is out of range"
    )
    assert refusal(one(deviceIndex=10**39)) == (
        f"allocation 0.deviceIndex: {10**39} is out of range"
    )
    assert refusal(one(profile=7)) == "allocation 0.profile: expected a string, got 7"
    assert refusal(one(gpuUUID=None, profile=None, migUUID=[])) == (
        "allocation 0.migUUID: expected a string, got an array"
    )


@pytest.mark.parametrize("field", ["gpuUUID", "profile", "migUUID"])
def test_surrogate_message(field: str) -> None:
    raw = one()[:-2] + f', "{field}": "\\ud800x"' + "}]"
    assert refusal(raw) == (
        f'allocation 0.{field}: "\\ud800x" holds a lone UTF-16 surrogate (not valid Unicode)'
    )


def test_non_ascii_fields_are_kept() -> None:
    (allocation,) = decode_mig_allocations(one(profile="\u00e9\u4e2d"))
    assert allocation.profile == "\u00e9\u4e2d"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (42, "expected a string value, got int"),
        (b"[]", "expected a string value, got bytes"),
        ("{}", "expected a JSON array of allocations"),
        ('"x"', "expected a JSON array of allocations"),
        ("1", "expected a JSON array of allocations"),
        ("[1]", "allocation 0: expected an object"),
        ("[null]", "MIG allocation 0 is incomplete"),
        ("NaN", "invalid JSON value NaN"),
        ("[Infinity]", "invalid JSON value Infinity"),
        ("[-Infinity]", "invalid JSON value -Infinity"),
        ("x", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("[]]", "not JSON: Extra data: line 1 column 3 (char 2)"),
        ("[" * 100_000, "not JSON: nested too deeply"),
    ],
)
def test_document_refusals(raw: object, message: str) -> None:
    if isinstance(raw, str) and len(raw) > MAX_ANNOTATION_BYTES:
        raw = raw[:MAX_ANNOTATION_BYTES]
    assert refusal(raw) == message


def test_json_errors_keep_their_cause() -> None:
    with pytest.raises(MigAnnotationError) as info:
        decode_mig_allocations("x")
    assert isinstance(info.value.__cause__, json.JSONDecodeError)
    with pytest.raises(MigAnnotationError) as deep:
        decode_mig_allocations("[" * MAX_ANNOTATION_BYTES)
    assert isinstance(deep.value.__cause__, RecursionError)


@pytest.mark.parametrize(
    "change",
    [
        {"migUUID": ""},
        {"gpuInstanceID": None},
        {"computeInstanceID": None},
        {"migUUID": "", "gpuInstanceID": None},
        {"gpuInstanceID": None, "computeInstanceID": None},
    ],
)
def test_partial_runtime_identity_message(change: dict[str, Any]) -> None:
    raw = json.dumps([{k: v for k, v in (REALISED | change).items() if v is not None}])
    assert refusal(raw) == "MIG allocation 0 has partial runtime identity"


def test_pending_has_no_runtime_identity() -> None:
    pending = {k: v for k, v in REALISED.items() if k not in ("migUUID", "gpuInstanceID")}
    pending.pop("computeInstanceID")
    (allocation,) = decode_mig_allocations(json.dumps([pending]))
    assert (allocation.mig_uuid, allocation.gpu_instance_id, allocation.compute_instance_id) == (
        "",
        None,
        None,
    )
    assert not allocation.realised


def test_realised_needs_all_three() -> None:
    assert LIVE.realised
    assert not MigAllocation(0, 0, "g", "p", 0, 1, "", 1, 1).realised
    assert not MigAllocation(0, 0, "g", "p", 0, 1, "m", None, 1).realised
    assert not MigAllocation(0, 0, "g", "p", 0, 1, "m", 1, None).realised
    assert MigAllocation(0, 0, "g", "p", 0, 1, "m", 0, 0).realised


def test_keys_match_exactly_or_case_insensitively_and_the_last_wins() -> None:
    raw = one()[:-2] + ', "GPUUUID": "B", "gpuUUID": "A"}]'
    assert decode_mig_allocations(raw)[0].gpu_uuid == "A"
    raw = one()[:-2] + ', "gpuUUID": "A", "GPUUUID": "B"}]'
    assert decode_mig_allocations(raw)[0].gpu_uuid == "B"
    # null clears an ID set earlier (a pointer), then a later value sets it again.
    raw = one()[:-2] + ', "gpuInstanceID": null, "gpuinstanceid": 7}]'
    assert decode_mig_allocations(raw)[0].gpu_instance_id == 7


def test_incomplete_names_the_allocation() -> None:
    raw = json.dumps([REALISED, REALISED | {"deviceIndex": 1, "profile": ""}])
    assert refusal(raw) == "MIG allocation 1 is incomplete"
    raw = json.dumps([REALISED, REALISED | {"deviceIndex": 1}, REALISED])
    assert refusal(raw) == "duplicate MIG allocation for container 1 device 0"
    raw = json.dumps([REALISED, REALISED | {"containerIndex": 0}])
    assert len(decode_mig_allocations(raw)) == 2


def test_absent_fields_take_go_zero_values() -> None:
    # containerIndex and deviceIndex default to 0; absent text fields are empty (incomplete).
    bare = {k: v for k, v in REALISED.items() if k not in ("containerIndex", "deviceIndex")}
    (allocation,) = decode_mig_allocations(json.dumps([bare]))
    assert (allocation.container_index, allocation.device_index) == (0, 0)
    for field in ("gpuUUID", "profile"):
        missing = {k: v for k, v in REALISED.items() if k != field}
        assert refusal(json.dumps([missing])) == "MIG allocation 0 is incomplete"
    assert refusal(one(placement=None)) == "MIG allocation 0 is incomplete"


def test_unknown_keys_anywhere_are_skipped() -> None:
    first = {"note": 1, **REALISED, "placement": {"x": 0, "start": 6, "size": 1}}
    assert decode_mig_allocations(json.dumps([first])) == (LIVE,)


@pytest.mark.parametrize("field", ["gpuInstanceID", "computeInstanceID"])
def test_null_clears_either_instance_id(field: str) -> None:
    raw = one()[:-2] + f', "{field}": null' + "}]"
    assert refusal(raw) == "MIG allocation 0 has partial runtime identity"
    raw = one()[:-2] + f', "{field}": null, "{field}": 4' + "}]"
    (allocation,) = decode_mig_allocations(raw)
    assert 4 in (allocation.gpu_instance_id, allocation.compute_instance_id)
