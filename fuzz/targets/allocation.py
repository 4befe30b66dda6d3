"""Target ``allocation``: the allocation response merge and its JSON loader.

The merge properties are stated once, in the allocation tests (tests/allocation/), and this
target runs those very bodies (``test.hypothesis.inner_test``) over the same strategies for
much longer: purity, idempotence, exactly one canonical parent (and broker mount when on),
parent before broker, unrelated mounts kept in order, reserved env keys cleared, the parent at
the first equivalent entry, path cleaning.  A regression found here goes into those tests as
an ``@example``.

New here: the JSON loader a Go device plugin feeds (``ContainerAllocateResponse.from_dict``)
over hostile documents: any JSON value, or a valid document with one field replaced at any
depth.  It returns a response or raises ``ConfigError`` naming the field - never another
exception - and what it returns survives a round trip and the merge.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from hami_trio.allocation.response import ContainerAllocateResponse, configure_host_pid_broker
from hami_trio.errors import ConfigError
from tests.allocation import test_constants as test_paths
from tests.allocation import test_response
from tests.strategies import allocation as st_alloc

__all__ = ["TARGET"]


def _body(test: Any) -> Any:
    """The undecorated body of a ``@given`` test."""
    return test.hypothesis.inner_test


def check_from_dict(document: object) -> None:
    """Hostile JSON: a response (that round-trips and merges) or a ConfigError."""
    try:
        response = ContainerAllocateResponse.from_dict(document)  # type: ignore[arg-type]
    except ConfigError as exc:
        refusal = str(exc)
    else:
        refusal = None
    if refusal is not None:
        assert refusal, "a refusal must name what is wrong"
        return
    assert ContainerAllocateResponse.from_dict(response.to_dict()) == response
    assert ContainerAllocateResponse.from_json(response.to_json()) == response
    for enabled in (False, True):
        merged = configure_host_pid_broker(response, enabled)
        assert configure_host_pid_broker(merged, enabled) == merged


TARGET = Target(
    name="allocation",
    description="allocation merge properties (from the tests) and the JSON loader",
    ci_seconds=20,
    weight=1.0,
    properties=(
        Property(
            "merge_properties",
            (st_alloc.responses(), st.booleans()),
            _body(test_response.test_merge_properties),
            weight=2.0,
        ),
        Property(
            "merge_parent_position",
            (st_alloc.responses(), st.booleans()),
            _body(test_response.test_merge_keeps_the_parent_at_the_first_equivalent_entry),
        ),
        Property(
            "json_round_trip",
            (st_alloc.responses(),),
            _body(test_response.test_json_round_trip),
            weight=0.5,
        ),
        Property("from_dict", (st_alloc.json_documents(),), check_from_dict, weight=1.5),
        Property(
            "go_clean",
            (st_alloc.raw_paths(),),
            _body(test_paths.test_go_clean_is_idempotent_and_normal),
            weight=0.5,
        ),
        Property(
            "container_target",
            (st_alloc.raw_paths(),),
            _body(test_paths.test_container_target_agrees_with_normpath_on_single_slash_root),
            weight=0.5,
        ),
    ),
)
