"""Hypothesis strategies for the allocation integration (mount/env merge, path cleaning).

The interesting inputs are container paths that *look* different but target the lock parent
or the broker directory (extra slashes, ``.``, ``x/..``, no leading slash, leading ``..``),
near misses that must stay unrelated (``/tmp/vgpulockx``, ``/tmp/vgpulock/hostpid/sock``),
and env maps that carry a stale value of the reserved switch.  ``responses()`` mixes them.
"""

from __future__ import annotations

from hypothesis import strategies as st

from hami_trio.allocation.constants import BROKER_CONTAINER_DIR, LOCK_PARENT, container_target
from hami_trio.allocation.response import ContainerAllocateResponse, DeviceSpec, Mount
from hami_trio.goparse import BROKER_SWITCH_ENV

__all__ = [
    "broker_paths",
    "canonical_paths",
    "env_maps",
    "equivalent_paths",
    "json_documents",
    "mounts",
    "parent_paths",
    "raw_paths",
    "responses",
    "unrelated_paths",
]

# Elements that make paths near the canonical ones likely.
_ELEMENTS = ["tmp", "vgpulock", "hostpid", "x", ".", "..", "", "vgpulockx", "broker.sock"]


def raw_paths() -> st.SearchStrategy[str]:
    """Arbitrary slash-separated paths, absolute or relative, including odd elements."""
    words = st.sampled_from(_ELEMENTS) | st.text(alphabet="ab./", max_size=4)
    return st.builds(
        lambda lead, parts, tail: lead + "/".join(parts) + tail,
        st.sampled_from(["", "/", "//", "///"]),
        st.lists(words, max_size=6),
        st.sampled_from(["", "/", "/.", "//"]),
    )


@st.composite
def equivalent_paths(draw: st.DrawFn, canonical: str) -> str:
    """A spelling of the absolute ``canonical`` path that cleans to it.

    Adds any mix of: no or several leading slashes, leading ``..`` (cleared at the root),
    ``./`` and ``name/../`` detours before an element, doubled separators and a trailing
    ``/`` or ``/.``.
    """
    parts = [part for part in canonical.split("/") if part]
    out = draw(st.sampled_from(["", "/", "//", "///"]))
    out += "../" * draw(st.integers(0, 2))
    for index, part in enumerate(parts):
        detours = draw(st.lists(st.sampled_from(["./", "x/../", "tmp/./../", "a/b/../../"])))
        out += "".join(detours) + part
        if index < len(parts) - 1:
            out += draw(st.sampled_from(["/", "//", "/./", "///"]))
    out += draw(st.sampled_from(["", "/", "/.", "//", "/./"]))
    return out


def parent_paths() -> st.SearchStrategy[str]:
    """Spellings of ``/tmp/vgpulock``."""
    return equivalent_paths(LOCK_PARENT)


def broker_paths() -> st.SearchStrategy[str]:
    """Spellings of ``/tmp/vgpulock/hostpid``."""
    return equivalent_paths(BROKER_CONTAINER_DIR)


def canonical_paths() -> st.SearchStrategy[str]:
    """Spellings of either canonical target."""
    return parent_paths() | broker_paths()


def unrelated_paths() -> st.SearchStrategy[str]:
    """Container paths that target neither canonical path (often near misses)."""
    near = st.sampled_from(
        [
            "/tmp",
            "/tmp/vgpulockx",
            "/tmp/vgpulock/hostpid/broker.sock",
            "/tmp/vgpulock/x",
            "/var/run/hami/hostpid",
            "/usr/local/vgpu/libvgpu.so",
            "/etc/ld.so.preload",
        ]
    )
    return (near | raw_paths()).filter(
        lambda path: container_target(path) not in (LOCK_PARENT, BROKER_CONTAINER_DIR)
    )


def mounts(container_paths: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Mount]:
    """Mounts with the given container paths (default: any mix), random host paths and flags."""
    paths = container_paths if container_paths is not None else canonical_paths() | raw_paths()
    return st.builds(
        Mount,
        container_path=paths,
        host_path=st.sampled_from(["/tmp/vgpulock", "/var/run/hami/hostpid", "/evil", "", "/x"]),
        read_only=st.booleans(),
    )


def env_maps() -> st.SearchStrategy[dict[str, str]]:
    """Env maps, often with a stale or hostile value of the reserved broker switch."""
    values = st.sampled_from(["1", "0", "true", " 1", "", "01"]) | st.text(max_size=4)
    keys = st.sampled_from([BROKER_SWITCH_ENV, "CUDA_DEVICE_MEMORY_LIMIT_0", "LD_PRELOAD"]) | (
        st.text(alphabet="ABCDEFGHIJ_0123456789", min_size=1, max_size=8)
    )
    return st.dictionaries(keys, values, max_size=6)


def responses() -> st.SearchStrategy[ContainerAllocateResponse]:
    """Whole responses: mixed mounts (canonical spellings, near misses), env, devices, ..."""
    mixed = mounts(canonical_paths()) | mounts(unrelated_paths())
    devices = st.builds(
        DeviceSpec,
        container_path=st.sampled_from(["/dev/nvidia0", "/dev/nvidiactl"]),
        host_path=st.sampled_from(["/dev/nvidia0", "/dev/nvidiactl"]),
        permissions=st.sampled_from(["rw", "rwm", ""]),
    )
    return st.builds(
        ContainerAllocateResponse,
        envs=env_maps(),
        mounts=st.lists(mixed, max_size=8).map(tuple),
        devices=st.lists(devices, max_size=2).map(tuple),
        annotations=st.dictionaries(st.sampled_from(["a", "hami.io/x"]), st.text(max_size=3)),
        cdi_devices=st.lists(st.sampled_from(["nvidia.com/gpu=0", "x=y"]), max_size=2).map(tuple),
    )


# Field names of the Go JSON (snake_case and protobuf camelCase) and near misses.
_JSON_KEYS = [
    "envs",
    "mounts",
    "devices",
    "annotations",
    "cdi_devices",
    "cdiDevices",
    "container_path",
    "containerPath",
    "host_path",
    "hostPath",
    "read_only",
    "readOnly",
    "permissions",
    "name",
    "Mounts",
    "",
]


def json_values() -> st.SearchStrategy[object]:
    """Any JSON value, with objects keyed mostly by the response's own field names."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
    keys = st.sampled_from(_JSON_KEYS) | st.text(max_size=4)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=16,
    )


@st.composite
def json_documents(draw: st.DrawFn) -> object:
    """Decoded JSON a device plugin might hand over: any value, or a valid response's
    document with one field (at any depth) replaced by any JSON value."""
    if draw(st.booleans()):
        return draw(json_values())
    doc: object = draw(responses()).to_dict()
    node = doc
    # Walk down a random path and replace what is there.
    while isinstance(node, dict | list) and node and draw(st.booleans()):
        if isinstance(node, dict):
            key = draw(st.sampled_from(sorted(node)))
            child = node[key]
            if not isinstance(child, dict | list) or not child or draw(st.booleans()):
                node[key] = draw(json_values())
                return doc
            node = child
        else:
            index = draw(st.integers(0, len(node) - 1))
            child = node[index]
            if not isinstance(child, dict | list) or not child or draw(st.booleans()):
                node[index] = draw(json_values())
                return doc
            node = child
    if isinstance(node, dict):
        node[draw(st.sampled_from(_JSON_KEYS))] = draw(json_values())
    return doc
