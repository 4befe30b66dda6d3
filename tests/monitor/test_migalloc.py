"""Tests of the MIG allocation annotation decoder (HAMi's Go decoder is the reference)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from hami_trio.monitor.migalloc import (
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
