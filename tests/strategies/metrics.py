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

__all__ = [
    "allocated_annotations",
    "allocated_entries",
    "encode_allocated",
    "hostile_allocated_annotations",
    "hostile_mig_annotations",
    "hostile_text",
    "json_values",
    "mig_allocation_objects",
    "mig_annotations",
    "pod_lists",
    "pod_objects",
    "watch_lines",
]

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


def hostile_text(max_size: int = 12) -> st.SearchStrategy[str]:
    """Text as a hostile writer makes it: controls, lone surrogates, separators, plain."""
    return st.lists(
        st.characters()
        | st.characters(min_codepoint=0, max_codepoint=0xA0)
        | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
        | st.sampled_from(["\u2028", "\ufffd", "\U0001f600"]),
        max_size=max_size,
    ).map("".join)


def _realised(index: int, gpu: str = "GPU-a", mig: str = "MIG-a", profile: str = "1g.10gb") -> str:
    return json.dumps(
        {
            "containerIndex": 0,
            "deviceIndex": index,
            "gpuUUID": gpu,
            "profile": profile,
            "placement": {"start": 0, "size": 1},
            "migUUID": f"{mig}-{index}",
            "gpuInstanceID": 1,
            "computeInstanceID": 0,
        }
    )


def hostile_mig_annotations() -> st.SearchStrategy[str]:
    """Annotation values a pod's creator may write to hurt the collector.

    Deep nesting (``RecursionError`` in the parser), escapes of lone surrogates, long label
    values, long lists, huge numbers and sizes around the decoder's caps, beside the
    plain near misses of :func:`mig_annotations`.
    """
    nesting = st.builds(
        lambda depth, opener, tail: opener * depth + tail,
        st.integers(1, 200_000),
        st.sampled_from(["[", '[{"a":', '{"a":[']),
        st.sampled_from(["", "]", "1"]),
    )
    escapes = st.builds(
        lambda field, escape: (
            _realised(0).replace('"GPU-a"', f'"{escape}"')
            if field == "gpuUUID"
            else _realised(0).replace('"1g.10gb"', f'"{escape}"')
        ),
        st.sampled_from(["gpuUUID", "profile"]),
        st.sampled_from(["\\ud800", "x\\udfff", "\\ud83d\\ude00", "\\u0000", "\\n\\u001b"]),
    )
    long_fields = st.builds(
        lambda size, field: _realised(0, **{field: "x" * size}),
        st.integers(100, 200_000),
        st.sampled_from(["gpu", "mig", "profile"]),
    )
    long_lists = st.builds(
        lambda count: "[" + ",".join(_realised(i) for i in range(count)) + "]",
        st.integers(120, 400),
    )
    numbers = st.builds(
        lambda digits: _realised(0).replace('"deviceIndex": 0', f'"deviceIndex": {"9" * digits}'),
        st.integers(1, 6000),
    )
    padded = st.builds(lambda size: "[" + " " * size + "]", st.integers(65_000, 66_000))
    return (
        mig_annotations()
        | nesting
        | escapes
        | long_fields
        | long_lists
        | numbers
        | padded
        | hostile_text(40)
    )


# -- hami.io/vgpu-devices-allocated ----------------------------------------------------------

#: One device as (UUID, type, memory MiB, cores percent).
AllocatedTuple = tuple[str, str, int, int]


def encode_allocated(entries: list[list[AllocatedTuple]]) -> str:
    """What HAMi's ``EncodePodSingleDevice`` writes: every device followed by ``:``, every
    container entry followed by ``;``."""
    return "".join(
        "".join(f"{uuid},{kind},{memory},{cores}:" for uuid, kind, memory, cores in entry) + ";"
        for entry in entries
    )


def allocated_entries(max_entries: int = 5) -> st.SearchStrategy[list[list[AllocatedTuple]]]:
    """Per container entry, the devices HAMi's scheduler could have written."""
    separators = set(",:;")
    field = st.text(
        st.characters(exclude_characters=sorted(separators), exclude_categories=["Cs"]),
        min_size=1,
        max_size=12,
    )
    device = st.tuples(
        st.sampled_from(["GPU-aaaa", "GPU-bbbb-1111"]) | field,
        st.sampled_from(["NVIDIA", "NVIDIA-H100"]) | field,
        st.integers(0, (1 << 31) - 1),
        st.integers(0, 100) | st.integers(0, (1 << 31) - 1),
    )
    return st.lists(st.lists(device, max_size=3), max_size=max_entries)


def allocated_annotations() -> st.SearchStrategy[str]:
    """Valid values (as HAMi encodes them), and near misses: cut, spliced or edited ones."""
    valid = allocated_entries().map(encode_allocated)
    edits = st.sampled_from(
        [
            "",
            ";",
            ":",
            ",",
            "GPU-a,NVIDIA,1,2",
            "GPU-a,NVIDIA,1",
            ",NVIDIA,1,2",
            "GPU-a,,1,2",
            "GPU-a,NVIDIA,-1,2",
            "GPU-a,NVIDIA,1,-0",
            "GPU-a,NVIDIA,+7,0",
            "GPU-a,NVIDIA, 1,2",
            "GPU-a,NVIDIA,1_0,2",
            "GPU-a,NVIDIA,\u0661,2",
            "GPU-a,NVIDIA,2147483648,0",
            "GPU-a,NVIDIA,0x10,0",
            "GPU-a,NVIDIA,1,2,extra,fields",
            "GPU-a",
        ]
    )
    spliced = st.builds(
        lambda value, at, edit: value[:at] + edit + value[at:],
        valid,
        st.integers(0, 80),
        edits | hostile_text(6),
    )
    return valid | spliced | st.lists(edits, max_size=6).map(":".join)


def hostile_allocated_annotations() -> st.SearchStrategy[str]:
    """Values a pod's creator may write to hurt the collector: sizes around the caps, huge
    numbers, long fields, lone surrogates, many entries or devices."""
    many_devices = st.builds(
        lambda count: "GPU-a,NVIDIA,1,1:" * count + ";", st.integers(100, 3000)
    )
    many_entries = st.builds(lambda count: ";" * count, st.integers(500, 70_000))
    long_field = st.builds(
        lambda size, where: (
            "x" * size + ",NVIDIA,1,1:;" if where else "GPU-a," + "x" * size + ",1,1:;"
        ),
        st.integers(100, 70_000),
        st.booleans(),
    )
    digits = st.builds(lambda size: f"GPU-a,NVIDIA,{'9' * size},1:;", st.integers(1, 70_000))
    # Lone surrogates (what a JSON escape such as "\\ud800" decodes to), a pair, a NUL.
    surrogates = st.sampled_from([chr(0xD800), chr(0xDFFF), chr(0xD83D) + chr(0xDE00), "\0"]).map(
        lambda text: "GPU-" + text + ",NVIDIA,1,1:;"
    )
    padded = st.builds(lambda size: " " * size, st.integers(65_000, 66_000))
    return (
        allocated_annotations()
        | many_devices
        | many_entries
        | long_field
        | digits
        | surrogates
        | padded
        | hostile_text(40)
    )


def pod_objects() -> st.SearchStrategy[Any]:
    """Pod objects as a list or watch event carries them: plausible, hostile, or not pods."""
    text = hostile_text() | st.sampled_from(["", "main", "hami.io/vgpu-node", "node-a"])
    anything = json_values(3) | text
    string_maps = st.dictionaries(text | st.sampled_from(["hami.io/x"]), text, max_size=3)
    containers = st.lists(
        st.dictionaries(st.sampled_from(["name", "image"]), anything, max_size=2) | anything,
        max_size=3,
    )
    metadata = st.fixed_dictionaries(
        {},
        optional={
            "uid": text | anything,
            "namespace": text | anything,
            "name": text | anything,
            "labels": string_maps | anything,
            "annotations": string_maps | anything,
            "resourceVersion": text | anything,
        },
    )
    spec = st.fixed_dictionaries(
        {}, optional={"containers": containers | anything, "initContainers": containers}
    )
    status = st.fixed_dictionaries({}, optional={"phase": text | anything})
    pods = st.fixed_dictionaries(
        {"metadata": metadata | anything},
        optional={"spec": spec | anything, "status": status | anything},
    )
    return pods | anything


def pod_lists() -> st.SearchStrategy[str]:
    """``PodList`` bodies (JSON text) with hostile items among plausible ones."""
    return st.lists(pod_objects(), max_size=5).map(
        lambda items: json.dumps({"metadata": {"resourceVersion": "9"}, "items": items})
    )
