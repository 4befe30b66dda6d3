"""The response model's promised outputs, as exact values rather than round trips.

test_response.py checks the JSON by round trips and the merge by properties; these tests pin
the documented output itself: ``to_json`` is compact JSON with sorted keys, ``from_dict``
turns absent or ``null`` fields into ``""`` / ``False`` and takes protobuf's camelCase keys
for every object, and each refusal names the field in the words ``hami-trio allocate``
prints.  Every promise the properties draw at random also has an explicit example here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

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

R = ContainerAllocateResponse
LIB = Mount("/usr/local/vgpu/libvgpu.so", "/h/lib", True)
CACHE = Mount("/usr/local/vgpu", "/h/cache", False)
PARENT = Mount("/tmp/vgpulock", "/tmp/vgpulock", False)
BROKER = Mount("/tmp/vgpulock/hostpid", "/var/run/hami/hostpid", True)


def refusal(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        R.from_dict(data)
    return str(info.value)


def test_canonical_mounts_and_reserved_keys() -> None:
    assert lock_parent_mount() == PARENT
    assert broker_mount() == BROKER
    assert lock_parent_mount("/srv/l") == Mount("/tmp/vgpulock", "/srv/l", False)
    assert broker_mount("/srv/b") == Mount("/tmp/vgpulock/hostpid", "/srv/b", True)
    assert frozenset({"LIBVGPU_HOSTPID_BROKER"}) == RESERVED_ENV_KEYS
    assert Mount("/a", "/b").read_only is False
    assert DeviceSpec("/a", "/b").permissions == ""
    assert Mount("tmp//vgpulock/.", "/x").target == "/tmp/vgpulock"


# -- to_json / to_dict: the exact text ---------------------------------------------------------


def test_to_json_is_compact_with_sorted_keys() -> None:
    response = R(
        envs={"B": "2", "A": "1"},
        mounts=(Mount("/c", "/h", True), Mount("/d", "", False)),
        devices=(DeviceSpec("/dev/x", "/dev/y", "rw"), DeviceSpec("/dev/z", "/dev/z")),
        annotations={"z": "1", "a": "2"},
        cdi_devices=("n=1", ""),
    )
    assert response.to_json() == (
        '{"annotations":{"a":"2","z":"1"},'
        '"cdi_devices":[{"name":"n=1"},{}],'
        '"devices":[{"container_path":"/dev/x","host_path":"/dev/y","permissions":"rw"},'
        '{"container_path":"/dev/z","host_path":"/dev/z"}],'
        '"envs":{"A":"1","B":"2"},'
        '"mounts":[{"container_path":"/c","host_path":"/h","read_only":true},'
        '{"container_path":"/d"}]}'
    )
    assert R().to_json() == "{}"


def test_to_dict_writes_go_names_and_omits_empty_values() -> None:
    assert R(mounts=(Mount("", "/h", True),)).to_dict() == {
        "mounts": [{"host_path": "/h", "read_only": True}]
    }
    assert R(devices=(DeviceSpec("", "", ""),)).to_dict() == {"devices": [{}]}
    assert R(devices=(DeviceSpec("/a", "", "r"),)).to_dict() == {
        "devices": [{"container_path": "/a", "permissions": "r"}]
    }
    assert R(cdi_devices=("",)).to_dict() == {"cdi_devices": [{}]}
    assert R(envs={"K": ""}, annotations={"A": ""}).to_dict() == {
        "envs": {"K": ""},
        "annotations": {"A": ""},
    }
    out = R(envs={"K": "v"}).to_dict()
    assert type(out["envs"]) is dict  # a plain dict, not the read-only view


# -- from_dict: absent and null fields, camelCase keys ---------------------------------------------


def test_missing_fields_become_empty() -> None:
    response = R.from_dict({"mounts": [{}], "devices": [{}], "cdi_devices": [{}]})
    assert response.mounts == (Mount("", "", False),)
    assert response.devices == (DeviceSpec("", "", ""),)
    assert response.cdi_devices == ("",)
    assert dict(response.envs) == {}
    assert dict(response.annotations) == {}


def test_null_fields_become_empty() -> None:
    response = R.from_dict(
        {
            "envs": None,
            "annotations": None,
            "mounts": [{"container_path": None, "host_path": None, "read_only": None}],
            "devices": [{"container_path": None, "host_path": None, "permissions": None}],
            "cdi_devices": [{"name": None}],
        }
    )
    assert response == R(
        mounts=(Mount("", "", False),), devices=(DeviceSpec("", "", ""),), cdi_devices=("",)
    )
    assert R.from_dict({"mounts": None, "devices": None, "cdi_devices": None}) == R()


def test_every_field_is_read() -> None:
    response = R.from_dict(
        {
            "envs": {"E": "1"},
            "annotations": {"a": "b"},
            "mounts": [{"container_path": "/c", "host_path": "/h", "read_only": True}],
            "devices": [{"container_path": "/dev/c", "host_path": "/dev/h", "permissions": "rw"}],
            "cdi_devices": [{"name": "vendor.com/gpu=0"}],
        }
    )
    assert response == R(
        envs={"E": "1"},
        annotations={"a": "b"},
        mounts=(Mount("/c", "/h", True),),
        devices=(DeviceSpec("/dev/c", "/dev/h", "rw"),),
        cdi_devices=("vendor.com/gpu=0",),
    )


def test_camel_case_keys_are_accepted_everywhere() -> None:
    response = R.from_dict(
        {
            "mounts": [{"containerPath": "/c", "hostPath": "/h", "readOnly": True}],
            "devices": [{"containerPath": "/dev/c", "hostPath": "/dev/h", "permissions": "r"}],
            "cdiDevices": [{"name": "n"}],
        }
    )
    assert response == R(
        mounts=(Mount("/c", "/h", True),),
        devices=(DeviceSpec("/dev/c", "/dev/h", "r"),),
        cdi_devices=("n",),
    )


def test_from_json_takes_text_and_bytes() -> None:
    text = '{"envs":{"A":"1"},"cdiDevices":[{"name":"n"}]}'
    assert R.from_json(text) == R(envs={"A": "1"}, cdi_devices=("n",))
    assert R.from_json(text.encode()) == R.from_json(text)


# -- refusals, word for word --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "response: expected a JSON object, got list"),
        (
            {"Envs": {}},
            "response: unknown field 'Envs' (known: envs, mounts, devices, annotations, "
            "cdi_devices)",
        ),
        (
            {"mounts": [{"hostpath": "/b"}]},
            "mounts[0]: unknown field 'hostpath' (known: container_path, host_path, read_only)",
        ),
        (
            {"devices": [{}, {"perms": "r"}]},
            "devices[1]: unknown field 'perms' (known: container_path, host_path, permissions)",
        ),
        ({"cdi_devices": [{"id": "x"}]}, "cdi_devices[0]: unknown field 'id' (known: name)"),
        ({"cdi_devices": ["x"]}, "cdi_devices[0]: expected a JSON object, got str"),
        ({"mounts": {"container_path": "/a"}}, "mounts: expected a JSON array, got dict"),
        ({"devices": "x"}, "devices: expected a JSON array, got str"),
        ({"mounts": [{"read_only": "true"}]}, "mounts[0].read_only: expected a boolean, got str"),
        ({"mounts": [{"host_path": 5}]}, "mounts[0].host_path: expected a string, got int"),
        (
            {"mounts": [{}, {"container_path": 5}]},
            "mounts[1].container_path: expected a string, got int",
        ),
        (
            {"devices": [{"container_path": True}]},
            "devices[0].container_path: expected a string, got bool",
        ),
        ({"devices": [{"host_path": []}]}, "devices[0].host_path: expected a string, got list"),
        ({"devices": [{"permissions": 7}]}, "devices[0].permissions: expected a string, got int"),
        ({"cdi_devices": [{"name": 1}]}, "cdi_devices[0].name: expected a string, got int"),
        ({"envs": []}, "response.envs: expected an object, got list"),
        ({"annotations": "a=b"}, "response.annotations: expected an object, got str"),
        ({"envs": {"A": 1}}, "envs['A']: expected a string, got int"),
        ({"annotations": {"A": None}}, "annotations['A']: expected a string, got NoneType"),
        (
            {"mounts": [{"container_path": "/a", "containerPath": "/b"}]},
            "mounts[0]: field 'container_path' given twice",
        ),
        ({"cdi_devices": [], "cdiDevices": []}, "response: field 'cdi_devices' given twice"),
    ],
)
def test_from_dict_refusals(data: Any, message: str) -> None:
    assert refusal(data) == message


def test_from_json_refusals() -> None:
    with pytest.raises(ConfigError) as info:
        R.from_json("{")
    assert str(info.value) == (
        "response: not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1))"
    )
    assert isinstance(info.value.__cause__, json.JSONDecodeError)
    with pytest.raises(ConfigError) as undecodable:
        R.from_json(b"{\xff")
    assert str(undecodable.value).startswith("response: not valid JSON (")
    assert isinstance(undecodable.value.__cause__, UnicodeDecodeError)
    with pytest.raises(ConfigError, match=r"^response: expected a JSON object, got int$"):
        R.from_json("1")


# The refusals below pass wrong types on purpose (what a caller without a type checker
# might): the constructors are called through names the type checker does not check.
LOOSE_R: Any = R
LOOSE_MOUNT: Any = Mount
LOOSE_DEVICE: Any = DeviceSpec


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LOOSE_R(envs=["A"]), "envs: expected a mapping of strings, got list"),
        (lambda: LOOSE_R(annotations="x"), "annotations: expected a mapping of strings, got str"),
        (lambda: LOOSE_R(envs={1: "a"}), "envs key: expected a string, got int"),
        (lambda: LOOSE_R(annotations={"k": 2}), "annotations['k']: expected a string, got int"),
        (lambda: LOOSE_R(annotations={2: "v"}), "annotations key: expected a string, got int"),
        (lambda: LOOSE_R(mounts="abc"), "mounts: expected a sequence of Mount"),
        (lambda: LOOSE_R(mounts=b"abc"), "mounts: expected a sequence of Mount"),
        (lambda: LOOSE_R(devices={"a": 1}), "devices: expected a sequence of DeviceSpec"),
        (lambda: LOOSE_R(cdi_devices="n"), "cdi_devices: expected a sequence of str"),
        (lambda: LOOSE_R(mounts=[LIB, ("/a", "/b", True)]), "mounts[1]: expected Mount, got tuple"),
        (lambda: LOOSE_R(devices=[LIB]), "devices[0]: expected DeviceSpec, got Mount"),
        (lambda: LOOSE_R(cdi_devices=["a", 1]), "cdi_devices[1]: expected str, got int"),
        (lambda: LOOSE_MOUNT(1, "/b"), "mount container_path: expected a string, got int"),
        (lambda: LOOSE_MOUNT("/a", None), "mount host_path: expected a string, got NoneType"),
        (lambda: LOOSE_MOUNT("/a", "/b", 1), "mount read_only: expected a boolean, got int"),
        (lambda: LOOSE_DEVICE(1, "/b"), "device container_path: expected a string, got int"),
        (lambda: LOOSE_DEVICE("/a", 2), "device host_path: expected a string, got int"),
        (lambda: LOOSE_DEVICE("/a", "/b", 3), "device permissions: expected a string, got int"),
    ],
)
def test_model_refusals(build: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value) == message


def test_the_model_copies_and_freezes_its_inputs() -> None:
    mounts = [LIB]
    envs = {"A": "1"}
    # A list and an iterator on purpose: the model copies them into tuples.
    response: R = LOOSE_R(envs=envs, mounts=mounts, devices=iter([DeviceSpec("/a", "/b")]))
    mounts.append(CACHE)
    envs["B"] = "2"
    assert response.mounts == (LIB,)
    assert dict(response.envs) == {"A": "1"}
    assert response.devices == (DeviceSpec("/a", "/b"),)
    assert type(response.mounts) is tuple
    with pytest.raises(TypeError):
        response.annotations["x"] = "y"  # type: ignore[index]


# -- the merge: explicit examples of what the properties draw -------------------------------------


def test_the_switch_is_exactly_1_when_enabled_and_absent_when_disabled() -> None:
    response = R(envs={"LIBVGPU_HOSTPID_BROKER": "true", "OTHER": "x"})
    assert dict(configure_host_pid_broker(response, True).envs) == {
        "OTHER": "x",
        "LIBVGPU_HOSTPID_BROKER": "1",
    }
    assert dict(configure_host_pid_broker(response, False).envs) == {"OTHER": "x"}


@pytest.mark.parametrize(
    ("enabled", "mounts", "expected"),
    [
        (False, [], [PARENT]),
        (True, [], [PARENT, BROKER]),
        (True, [LIB], [LIB, PARENT, BROKER]),
        (False, [LIB, BROKER, CACHE], [LIB, CACHE, PARENT]),
        (True, [BROKER, PARENT], [PARENT, BROKER]),
        (True, [BROKER, LIB, PARENT, CACHE], [PARENT, BROKER, LIB, CACHE]),
        (True, [LIB, BROKER, CACHE], [LIB, PARENT, BROKER, CACHE]),
        (True, [PARENT, LIB, BROKER], [PARENT, LIB, BROKER]),
        (True, [LIB, PARENT, PARENT, CACHE], [LIB, PARENT, CACHE, BROKER]),
        (True, [BROKER, BROKER, LIB], [PARENT, BROKER, LIB]),
        (False, [BROKER, PARENT, LIB, PARENT], [PARENT, LIB]),
        (
            True,
            [Mount("/tmp/vgpulock/", "/tenant", True), Mount("tmp/vgpulock/hostpid", "/t", False)],
            [PARENT, BROKER],
        ),
    ],
)
def test_merge_examples(enabled: bool, mounts: list[Mount], expected: list[Mount]) -> None:
    response = R(mounts=tuple(mounts))
    out = configure_host_pid_broker(response, enabled)
    assert list(out.mounts) == expected
    assert response.mounts == tuple(mounts)


def test_merge_uses_the_given_host_paths_and_keeps_the_rest() -> None:
    response = R(
        envs={"A": "1"},
        mounts=(CACHE,),
        devices=(DeviceSpec("/dev/a", "/dev/a", "rw"),),
        annotations={"k": "v"},
        cdi_devices=("c",),
    )
    out = configure_host_pid_broker(
        response, True, lock_parent_host="/srv/lock", broker_host_dir="/srv/broker"
    )
    assert out == R(
        envs={"A": "1", "LIBVGPU_HOSTPID_BROKER": "1"},
        mounts=(
            CACHE,
            Mount("/tmp/vgpulock", "/srv/lock", False),
            Mount("/tmp/vgpulock/hostpid", "/srv/broker", True),
        ),
        devices=(DeviceSpec("/dev/a", "/dev/a", "rw"),),
        annotations={"k": "v"},
        cdi_devices=("c",),
    )


def test_the_accepted_spellings_are_exactly_the_documented_ones() -> None:
    # from_dict's docstring lists them: Go's snake_case names, and protobuf's camelCase where
    # it differs.  Any other key is refused, so the tables are the whole accepted set.
    from hami_trio.allocation import response as module

    accepted = {
        name: set(keys) | set(keys.values())
        for name, keys in (
            ("response", module._RESPONSE_KEYS),
            ("mount", module._MOUNT_KEYS),
            ("device", module._DEVICE_KEYS),
            ("cdi", module._CDI_KEYS),
        )
    }
    assert accepted == {
        "response": {"envs", "mounts", "devices", "annotations", "cdi_devices", "cdiDevices"},
        "mount": {
            "container_path",
            "containerPath",
            "host_path",
            "hostPath",
            "read_only",
            "readOnly",
        },
        "device": {"container_path", "containerPath", "host_path", "hostPath", "permissions"},
        "cdi": {"name"},
    }
