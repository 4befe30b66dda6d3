"""Hypothesis strategies for the metrics subject: MIG allocation annotations and watch lines.

Both are JSON that comes from the API server (the scheduler and device plugin write the
annotation; any pod owner can edit it), so the decoders must accept or reject anything with
their own error.  The strategies mix well-formed allocation lists, near misses (wrong types,
partial runtime identity, odd key case, duplicates) and arbitrary JSON and text.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

__all__ = ["json_values", "mig_allocation_objects", "mig_annotations", "watch_lines"]

_KEYS = [
    "containerIndex",
    "deviceIndex",
    "gpuUUID",
    "profile",
    "placement",
    "migUUID",
    "gpuInstanceID",
    "computeInstanceID",
    "CONTAINERINDEX",
    "gpuuuid",
    "extra",
]


def json_values(max_leaves: int = 10) -> st.SearchStrategy[Any]:
    """Arbitrary JSON values (finite numbers, any text)."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(1 << 70), max_value=1 << 70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
        max_leaves=max_leaves,
    )


def mig_allocation_objects() -> st.SearchStrategy[dict[str, Any]]:
    """Allocation objects: mostly plausible field values, sometimes wrong ones."""
    small = st.integers(min_value=-2, max_value=4)
    values: dict[str, st.SearchStrategy[Any]] = {
        "containerIndex": small | json_values(2),
        "deviceIndex": small,
        "gpuUUID": st.sampled_from(["GPU-a", "GPU-b", ""]) | json_values(2),
        "profile": st.sampled_from(["1g.10gb", "3g.40gb", ""]),
        "placement": st.fixed_dictionaries(
            {"start": st.integers(0, 7), "size": st.integers(0, 4) | json_values(1)}
        )
        | st.none(),
        "migUUID": st.sampled_from(["MIG-1", "MIG-2", ""]),
        "gpuInstanceID": st.integers(-1, 14) | st.none() | st.integers(1 << 32, 1 << 33),
        "computeInstanceID": st.integers(0, 3) | st.none(),
    }
    return st.builds(
        lambda chosen, extra: {**chosen, **extra},
        st.fixed_dictionaries({}, optional=values),
        st.dictionaries(st.sampled_from(_KEYS), json_values(2), max_size=2),
    )


def mig_annotations() -> st.SearchStrategy[str]:
    """Annotation values: allocation lists, arbitrary JSON, and arbitrary text."""
    lists = st.lists(mig_allocation_objects() | json_values(2), max_size=4).map(json.dumps)
    return lists | json_values().map(json.dumps) | st.text(max_size=30)


def watch_lines() -> st.SearchStrategy[bytes]:
    """Watch stream lines: event-shaped JSON, arbitrary JSON and arbitrary bytes."""
    events = st.fixed_dictionaries(
        {
            "type": st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "X"]),
            "object": json_values(6)
            | st.fixed_dictionaries(
                {
                    "metadata": st.dictionaries(
                        st.sampled_from(["uid", "resourceVersion"]), json_values(1)
                    )
                }
            ),
        }
    ).map(lambda doc: json.dumps(doc).encode())
    return (
        events
        | json_values().map(lambda value: json.dumps(value).encode())
        | st.binary(max_size=40)
    )
