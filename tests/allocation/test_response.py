from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_trio.allocation.constants import BROKER_CONTAINER_DIR, LOCK_PARENT
from hami_trio.allocation.response import (
    RESERVED_ENV_KEYS,
    ContainerAllocateResponse,
    DeviceSpec,
    Mount,
    broker_mount,
    configure_host_pid_broker,
    lock_parent_mount,
)
from hami_trio.errors import ConfigError
from hami_trio.goparse import BROKER_SWITCH_ENV
from tests.strategies import allocation as st_alloc

PARENT = lock_parent_mount()
BROKER = broker_mount()
LIB = Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True)
CACHE = Mount("/usr/local/vgpu", "/usr/local/vgpu/containers/uid_ctr", False)
PRELOAD = Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True)


@dataclass
class Case:
    name: str
    enabled: bool
    mounts: list[Mount]
    expected_mounts: list[Mount]
    envs: dict[str, str] = field(default_factory=dict)
    expected_envs: dict[str, str] = field(default_factory=dict)


# Upstream's test names (UPSTREAM.md, allocation tests), as tables.
CASES = [
    Case("disabled", False, [LIB, CACHE], [LIB, CACHE, PARENT], {"A": "1"}, {"A": "1"}),
    Case(
        "disabled removes stale configuration",
        False,
        [BROKER, LIB, Mount("/tmp/vgpulock/hostpid/", "/old", False), PARENT, CACHE],
        [LIB, PARENT, CACHE],
        {BROKER_SWITCH_ENV: "1", "A": "x"},
        {"A": "x"},
    ),
    Case(
        "disabled keeps the writable parent where it was",
        False,
        [LIB, Mount("/tmp/vgpulock", "/tmp/vgpulock", False), CACHE],
        [LIB, PARENT, CACHE],
    ),
    Case("enabled", True, [LIB], [LIB, PARENT, BROKER], {}, {BROKER_SWITCH_ENV: "1"}),
    Case(
        "enabled overrides a stale switch value",
        True,
        [],
        [PARENT, BROKER],
        {BROKER_SWITCH_ENV: "0", "B": "2"},
        {BROKER_SWITCH_ENV: "1", "B": "2"},
    ),
    Case(
        "disabled clears a hostile switch value",
        False,
        [],
        [PARENT],
        {BROKER_SWITCH_ENV: "true"},
        {},
    ),
    Case(
        "replaces conflicting mount",
        True,
        [
            LIB,
            Mount(BROKER_CONTAINER_DIR, "/home/tenant/fake", False),
            Mount(LOCK_PARENT, "/home/tenant/lock", True),
        ],
        # The conflicting parent came after the broker: moved before it.
        [LIB, PARENT, BROKER],
        {},
        {BROKER_SWITCH_ENV: "1"},
    ),
    Case(
        "canonicalises duplicate mounts",
        True,
        [
            Mount("/tmp//vgpulock/", "/a", False),
            LIB,
            Mount("/tmp/./vgpulock", "/b", True),
            Mount("tmp/vgpulock", "/c", False),
            Mount("/tmp/x/../vgpulock", "/d", False),
            Mount("tmp/vgpulock//hostpid/", "/e", False),
            CACHE,
            Mount("/tmp/vgpulock/./hostpid", "/f", True),
        ],
        [PARENT, LIB, BROKER, CACHE],
        {},
        {BROKER_SWITCH_ENV: "1"},
    ),
    Case(
        "orders parent before nested",
        True,
        [BROKER, LIB, CACHE, PARENT, PRELOAD],
        [PARENT, BROKER, LIB, CACHE, PRELOAD],
        {},
        {BROKER_SWITCH_ENV: "1"},
    ),
    Case(
        "near misses are unrelated",
        True,
        [
            Mount("/tmp/vgpulockx", "/x", False),
            Mount("/tmp/vgpulock/hostpid/broker.sock", "/y", True),
            Mount("/tmp", "/tmp", False),
        ],
        [
            Mount("/tmp/vgpulockx", "/x", False),
            Mount("/tmp/vgpulock/hostpid/broker.sock", "/y", True),
            Mount("/tmp", "/tmp", False),
            PARENT,
            BROKER,
        ],
        {},
        {BROKER_SWITCH_ENV: "1"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_configure_table(case: Case) -> None:
    devices = (DeviceSpec("/dev/nvidia0", "/dev/nvidia0", "rw"),)
    response = ContainerAllocateResponse(
        envs=case.envs,
        mounts=tuple(case.mounts),
        devices=devices,
        annotations={"k": "v"},
        cdi_devices=("nvidia.com/gpu=0",),
    )
    out = configure_host_pid_broker(response, case.enabled)
    assert list(out.mounts) == case.expected_mounts
    assert dict(out.envs) == case.expected_envs
    assert out.devices == devices
    assert dict(out.annotations) == {"k": "v"}
    assert out.cdi_devices == ("nvidia.com/gpu=0",)
    # Idempotent (upstream "idempotent" case) for every row.
    assert configure_host_pid_broker(out, case.enabled) == out


def test_canonical_mounts_use_the_given_host_paths() -> None:
    out = configure_host_pid_broker(
        ContainerAllocateResponse(),
        True,
        lock_parent_host="/srv/lock",
        broker_host_dir="/run/b",
    )
    assert list(out.mounts) == [
        Mount("/tmp/vgpulock", "/srv/lock", False),
        Mount("/tmp/vgpulock/hostpid", "/run/b", True),
    ]


def test_input_is_never_mutated_and_response_is_immutable() -> None:
    envs = {BROKER_SWITCH_ENV: "0"}
    response = ContainerAllocateResponse(envs=envs, mounts=(BROKER,))
    envs["LATER"] = "x"  # the response owns a copy
    assert dict(response.envs) == {BROKER_SWITCH_ENV: "0"}
    out = configure_host_pid_broker(response, True)
    assert out is not response
    assert dict(response.envs) == {BROKER_SWITCH_ENV: "0"}
    assert response.mounts == (BROKER,)
    with pytest.raises(TypeError):
        response.envs["X"] = "1"  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"envs": {"A": 1}}, "envs['A']: expected a string"),
        ({"envs": ["A"]}, "envs: expected a mapping"),
        ({"mounts": [("/a", "/b", True)]}, "mounts[0]: expected Mount"),
        ({"mounts": "abc"}, "mounts: expected a sequence"),
        ({"cdi_devices": [1]}, "cdi_devices[0]: expected str"),
    ],
)
def test_model_rejects_wrong_types(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ContainerAllocateResponse(**kwargs)


def test_mount_rejects_non_bool_read_only() -> None:
    with pytest.raises(ConfigError, match="mount read_only"):
        Mount("/a", "/b", 1)  # type: ignore[arg-type]


# --- JSON as Go's encoding/json writes the kubelet type --------------------------------------

GO_JSON = {
    "envs": {"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", BROKER_SWITCH_ENV: "0"},
    "mounts": [
        {"container_path": "/usr/local/vgpu/libvgpu.so", "host_path": "/h/lib", "read_only": True},
        {"container_path": "/tmp/vgpulock", "host_path": "/tmp/vgpulock"},
    ],
    "devices": [
        {"container_path": "/dev/nvidia0", "host_path": "/dev/nvidia0", "permissions": "rw"}
    ],
    "annotations": {"hami.io/x": "y"},
    "cdi_devices": [{"name": "nvidia.com/gpu=0"}],
}


def test_from_dict_reads_go_json_and_round_trips() -> None:
    response = ContainerAllocateResponse.from_dict(GO_JSON)
    assert response.mounts[0] == Mount("/usr/local/vgpu/libvgpu.so", "/h/lib", True)
    assert response.mounts[1] == PARENT
    assert response.devices == (DeviceSpec("/dev/nvidia0", "/dev/nvidia0", "rw"),)
    assert response.cdi_devices == ("nvidia.com/gpu=0",)
    assert response.to_dict() == GO_JSON
    assert ContainerAllocateResponse.from_json(response.to_json()) == response


def test_from_dict_accepts_protobuf_camel_case_and_nulls() -> None:
    response = ContainerAllocateResponse.from_dict(
        {
            "envs": None,
            "mounts": [{"containerPath": "/a", "hostPath": "/b", "readOnly": True}],
            "cdiDevices": [{"name": "n"}],
            "devices": None,
        }
    )
    assert response == ContainerAllocateResponse(
        mounts=(Mount("/a", "/b", True),), cdi_devices=("n",)
    )


def test_to_dict_omits_empty_like_go() -> None:
    assert ContainerAllocateResponse().to_dict() == {}
    assert ContainerAllocateResponse(mounts=(Mount("", "", False),)).to_dict() == {"mounts": [{}]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "response: expected a JSON object"),
        ({"Envs": {}}, "response: unknown field 'Envs'"),
        ({"mounts": [{"container_path": "/a", "hostpath": "/b"}]}, "mounts[0]: unknown field"),
        ({"mounts": {"container_path": "/a"}}, "mounts: expected a JSON array"),
        ({"mounts": [{"read_only": "true"}]}, "mounts[0].read_only: expected a boolean"),
        ({"mounts": [{"container_path": 5}]}, "mounts[0].container_path: expected a string"),
        ({"devices": [{"permissions": 7}]}, "devices[0].permissions: expected a string"),
        ({"envs": {"A": 1}}, "envs['A']: expected a string"),
        ({"envs": []}, "response.envs: expected an object"),
        (
            {"mounts": [{"container_path": "/a", "containerPath": "/b"}]},
            "mounts[0]: field 'container_path' given twice",
        ),
    ],
)
def test_from_dict_refuses_malformed_input_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ContainerAllocateResponse.from_dict(data)
    assert message in str(info.value)


def test_from_json_refuses_non_json() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        ContainerAllocateResponse.from_json(b"{\xff")


@given(st_alloc.responses())
def test_json_round_trip(response: ContainerAllocateResponse) -> None:
    assert ContainerAllocateResponse.from_dict(json.loads(response.to_json())) == response


# --- properties of the merge -----------------------------------------------------------------


def _related(mount: Mount) -> bool:
    return mount.target in (LOCK_PARENT, BROKER_CONTAINER_DIR)


@given(st_alloc.responses(), st.booleans())
def test_merge_properties(response: ContainerAllocateResponse, enabled: bool) -> None:
    before = copy.deepcopy(response.to_dict())
    out = configure_host_pid_broker(response, enabled)

    # Pure: the input is unchanged.
    assert response.to_dict() == before
    # Idempotent.
    assert configure_host_pid_broker(out, enabled) == out

    # The canonical mounts are present exactly once (broker only when enabled) and are the
    # canonical values, whatever conflicting entries the input had.
    parents = [i for i, m in enumerate(out.mounts) if m.target == LOCK_PARENT]
    brokers = [i for i, m in enumerate(out.mounts) if m.target == BROKER_CONTAINER_DIR]
    assert len(parents) == 1
    assert out.mounts[parents[0]] == PARENT
    if enabled:
        assert len(brokers) == 1
        assert out.mounts[brokers[0]] == BROKER
        assert parents[0] < brokers[0]
    else:
        assert brokers == []

    # Unrelated mounts are all kept, in their relative order.
    assert [m for m in out.mounts if not _related(m)] == [
        m for m in response.mounts if not _related(m)
    ]

    # No reserved env key survives except the switch we set; other keys are untouched.
    assert {k for k in out.envs if k in RESERVED_ENV_KEYS} == (
        {BROKER_SWITCH_ENV} if enabled else set()
    )
    if enabled:
        assert out.envs[BROKER_SWITCH_ENV] == "1"
    assert {k: v for k, v in out.envs.items() if k not in RESERVED_ENV_KEYS} == {
        k: v for k, v in response.envs.items() if k not in RESERVED_ENV_KEYS
    }

    # Everything else is carried over untouched.
    assert (out.devices, dict(out.annotations), out.cdi_devices) == (
        response.devices,
        dict(response.annotations),
        response.cdi_devices,
    )


@given(st_alloc.responses(), st.booleans())
def test_merge_keeps_the_parent_at_the_first_equivalent_entry(
    response: ContainerAllocateResponse, enabled: bool
) -> None:
    # Where no broker entry comes first, the parent takes the place of the first equivalent
    # entry (or goes last): the output is the unrelated mounts with the parent spliced in.
    out = configure_host_pid_broker(response, enabled)
    first_parent = next((i for i, m in enumerate(response.mounts) if m.target == LOCK_PARENT), None)
    first_broker = next(
        (i for i, m in enumerate(response.mounts) if m.target == BROKER_CONTAINER_DIR), None
    )
    if (
        enabled
        and first_broker is not None
        and (first_parent is None or first_broker < first_parent)
    ):
        return  # the parent was moved before the broker; covered by the ordering property
    unrelated_before = (
        len([m for m in response.mounts[:first_parent] if not _related(m)])
        if first_parent is not None
        else len([m for m in response.mounts if not _related(m)])
    )
    assert out.mounts.index(PARENT) == unrelated_before
