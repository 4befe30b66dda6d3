"""Tests of the MIG allocation annotation decoder (HAMi's Go decoder is the reference)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from hami_trio.pods.migalloc import (
    MAX_ALLOCATIONS,
    MAX_ANNOTATION_BYTES,
    MAX_FIELD_CHARS,
    MigAllocation,
    MigAnnotationError,
    decode_mig_allocations,
    mig_container_name,
)
from tests.strategies import metrics as st_metrics

REALISED = {
    "containerIndex": 1,
    "deviceIndex": 0,
    "gpuUUID": "GPU-live",
    "profile": "1g.10gb",
    "placement": {"start": 6, "size": 1},
    "migUUID": "MIG-abc",
    "gpuInstanceID": 13,
    "computeInstanceID": 0,
}
PENDING = {
    "containerIndex": 0,
    "deviceIndex": 1,
    "gpuUUID": "GPU-pending",
    "profile": "2g.20gb",
    "placement": {"start": 0, "size": 2},
}


def test_upstream_container_name_mapping() -> None:
    # HAMi's TestMigAllocationContainerName: init containers first, then containers.
    init, containers = ("init",), ("main-a", "main-b")
    cases = [(0, "init"), (1, "main-a"), (2, "main-b"), (3, None), (-1, None)]
    for index, name in cases:
        assert mig_container_name(init, containers, index) == name
    assert mig_container_name((), ("only",), 0) == "only"
    assert mig_container_name((), (), 0) is None


def test_decodes_realised_and_pending() -> None:
    allocations = decode_mig_allocations(json.dumps([REALISED, PENDING]))
    assert allocations == (
        MigAllocation(1, 0, "GPU-live", "1g.10gb", 6, 1, "MIG-abc", 13, 0),
        MigAllocation(0, 1, "GPU-pending", "2g.20gb", 0, 2),
    )
    assert [a.realised for a in allocations] == [True, False]


@pytest.mark.parametrize("raw", [None, "", "null", "[]"])
def test_empty(raw: str | None) -> None:
    assert decode_mig_allocations(raw) == ()


def test_go_field_matching() -> None:
    doc = {k.upper(): v for k, v in REALISED.items()} | {"unknown": [1, 2]}
    assert decode_mig_allocations(json.dumps([doc]))[0].mig_uuid == "MIG-abc"
    # null resets a pointer field, and leaves a plain field as it was.
    text = json.dumps([REALISED])[:-2] + ', "gpuInstanceID": null, "gpuUUID": null}]'
    with pytest.raises(MigAnnotationError, match="partial runtime identity"):
        decode_mig_allocations(text)
    text = json.dumps([PENDING])[:-2] + ', "gpuUUID": null}]'
    assert decode_mig_allocations(text)[0].gpu_uuid == "GPU-pending"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"containerIndex": -1}, "incomplete"),
        ({"deviceIndex": -3}, "incomplete"),
        ({"gpuUUID": ""}, "incomplete"),
        ({"profile": ""}, "incomplete"),
        ({"placement": {"start": 1, "size": 0}}, "incomplete"),
        ({"placement": None}, "incomplete"),
        ({"migUUID": ""}, "partial runtime identity"),
        ({"computeInstanceID": None}, "partial runtime identity"),
        ({"containerIndex": 1.5}, "expected an integer"),
        ({"containerIndex": 1.0}, "expected an integer"),
        ({"containerIndex": "1"}, "expected an integer"),
        ({"containerIndex": True}, "expected an integer"),
        ({"containerIndex": 1 << 63}, "out of range"),
        ({"gpuInstanceID": -1}, "out of range"),
        ({"gpuInstanceID": 1 << 32}, "out of range"),
        ({"placement": {"start": -1, "size": 1}}, "out of range"),
        ({"placement": [1]}, "expected an object"),
        ({"profile": 7}, "expected a string"),
    ],
)
def test_rejects_like_upstream(change: dict[str, object], message: str) -> None:
    with pytest.raises(MigAnnotationError, match=message):
        decode_mig_allocations(json.dumps([REALISED | change]))


@pytest.mark.parametrize(
    "raw",
    ["{", "{}", '"x"', "[1]", "[null]", "NaN", '[{"containerIndex": NaN}]', "[]]"],
)
def test_rejects_malformed(raw: str) -> None:
    with pytest.raises(MigAnnotationError):
        decode_mig_allocations(raw)


def test_rejects_duplicates() -> None:
    other = REALISED | {"gpuUUID": "GPU-other"}
    with pytest.raises(MigAnnotationError, match="duplicate MIG allocation for container 1"):
        decode_mig_allocations(json.dumps([REALISED, other]))


@given(st_metrics.mig_annotations())
def test_any_annotation_decodes_or_raises_its_error(raw: str) -> None:
    try:
        allocations = decode_mig_allocations(raw)
    except MigAnnotationError:
        return
    keys = [(a.container_index, a.device_index) for a in allocations]
    assert len(keys) == len(set(keys))
    for allocation in allocations:
        assert allocation.container_index >= 0
        assert allocation.placement_size > 0


# What a pod's creator can write (no GPU request needed): bounded, refused with our error.


def _realised(count: int, **fields: object) -> list[dict[str, object]]:
    return [REALISED | {"deviceIndex": index} | fields for index in range(count)]


def test_nesting_too_deep_for_the_parser_is_refused() -> None:
    # 40 KB of "[": json.loads raises RecursionError, which is not a ValueError.
    with pytest.raises(MigAnnotationError, match="nested too deeply"):
        decode_mig_allocations("[" * 20_000 + "]" * 20_000)


@pytest.mark.parametrize("field", ["gpuUUID", "profile", "migUUID"])
@pytest.mark.parametrize("escape", ["\\ud800", "GPU-\\udfff", "\\ude00\\ud83d"])
def test_lone_surrogates_are_refused(field: str, escape: str) -> None:
    raw = json.dumps([REALISED | {field: "PLACEHOLDER"}]).replace("PLACEHOLDER", escape)
    with pytest.raises(MigAnnotationError, match=f"{field}: .* lone UTF-16 surrogate"):
        decode_mig_allocations(raw)


def test_a_surrogate_pair_is_a_character() -> None:
    raw = json.dumps([REALISED | {"profile": "P"}]).replace('"P"', '"\\ud83d\\ude00"')
    (allocation,) = decode_mig_allocations(raw)
    assert allocation.profile == "\U0001f600"


def test_allocation_count_is_capped() -> None:
    assert len(decode_mig_allocations(json.dumps(_realised(MAX_ALLOCATIONS)))) == MAX_ALLOCATIONS
    with pytest.raises(MigAnnotationError, match=f"{MAX_ALLOCATIONS + 1} allocations, more than"):
        decode_mig_allocations(json.dumps(_realised(MAX_ALLOCATIONS + 1)))


@pytest.mark.parametrize("field", ["gpuUUID", "profile", "migUUID"])
def test_label_fields_are_capped(field: str) -> None:
    longest = "x" * MAX_FIELD_CHARS
    (allocation,) = decode_mig_allocations(json.dumps([REALISED | {field: longest}]))
    assert longest in (allocation.gpu_uuid, allocation.profile, allocation.mig_uuid)
    with pytest.raises(MigAnnotationError, match=f"{field}: {MAX_FIELD_CHARS + 1} characters"):
        decode_mig_allocations(json.dumps([REALISED | {field: longest + "x"}]))


def test_value_size_is_capped_before_parsing() -> None:
    doc = json.dumps([REALISED])
    exactly = doc + " " * (MAX_ANNOTATION_BYTES - len(doc))
    assert len(decode_mig_allocations(exactly)) == 1
    with pytest.raises(MigAnnotationError, match="longer than the 65536 bytes allowed"):
        decode_mig_allocations(exactly + " ")
    # Bytes, not characters: 2-byte characters count twice.
    wide = doc.replace("1g.10gb", "é" * 100)
    wide += " " * (MAX_ANNOTATION_BYTES - 50 - len(wide))  # 50 characters short, 50 bytes over
    assert len(wide) < MAX_ANNOTATION_BYTES
    with pytest.raises(MigAnnotationError, match="longer than"):
        decode_mig_allocations(wide)


@pytest.mark.parametrize(
    "fields",
    [
        {"containerIndex": "x" * 60_000},
        {"deviceIndex": int("9" * 4000)},
        {"gpuInstanceID": [[[[1]]]]},
        {"placement": {"start": "y" * 60_000, "size": 1}},
    ],
)
def test_errors_never_copy_a_long_value(fields: dict[str, object]) -> None:
    with pytest.raises(MigAnnotationError) as caught:
        decode_mig_allocations(json.dumps([REALISED | fields]))
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize("raw", [b"[]", 5, ["[]"]])
def test_a_value_that_is_not_a_string_is_refused(raw: object) -> None:
    with pytest.raises(MigAnnotationError, match="expected a string value"):
        decode_mig_allocations(raw)  # type: ignore[arg-type]


@given(st_metrics.hostile_mig_annotations())
def test_hostile_annotations_decode_within_bounds_or_raise_our_error(raw: str) -> None:
    try:
        allocations = decode_mig_allocations(raw)
    except MigAnnotationError as exc:
        assert len(str(exc)) < 300  # noqa: PT017 - the message is part of the property
        return
    assert len(raw.encode("utf-8", "surrogatepass")) <= MAX_ANNOTATION_BYTES
    assert len(allocations) <= MAX_ALLOCATIONS
    for allocation in allocations:
        for text in (allocation.gpu_uuid, allocation.profile, allocation.mig_uuid):
            assert len(text) <= MAX_FIELD_CHARS
            text.encode("utf-8")  # every label value can be exported
