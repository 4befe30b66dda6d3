"""The kubelet's ContainerAllocateResponse as a value, and the pure broker mount/env merge.

How this works: :class:`ContainerAllocateResponse` models the device plugin API's
``v1beta1`` message (env, mounts, devices, annotations, CDI devices) as a frozen value that
converts to and from the JSON Go's ``encoding/json`` writes for it, so a Go device plugin can
hand its response to ``hami-trio allocate``.  :func:`configure_host_pid_broker` is the merge
applied to every HAMi-core container's response: it returns a new response with the broker
env switch set exactly, exactly one writable ``/tmp/vgpulock`` mount and (broker on) one
read-only broker mount below it, in an order the runtime can apply, every other mount kept.
Targets are compared the way Go cleans paths; the merge is idempotent and never mutates its
input.  The rules and an example: docs/allocation.md (The merge).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from hami_trio.allocation.constants import (
    BROKER_CONTAINER_DIR,
    BROKER_HOST_DIR,
    LOCK_PARENT,
    container_target,
)
from hami_trio.errors import ConfigError
from hami_trio.goparse import BROKER_SWITCH_ENV

__all__ = [
    "RESERVED_ENV_KEYS",
    "ContainerAllocateResponse",
    "DeviceSpec",
    "Mount",
    "broker_mount",
    "configure_host_pid_broker",
    "lock_parent_mount",
]

#: Env keys the broker integration owns: cleared from every response before the switch is
#: applied, so no value from an older configuration or another component survives.
RESERVED_ENV_KEYS: frozenset[str] = frozenset({BROKER_SWITCH_ENV})


@dataclass(frozen=True, slots=True)
class Mount:
    """One bind mount of a response (kubelet ``Mount``)."""

    container_path: str
    host_path: str
    read_only: bool = False

    def __post_init__(self) -> None:
        _check_str(self.container_path, "mount container_path")
        _check_str(self.host_path, "mount host_path")
        _check_bool(self.read_only, "mount read_only")

    @property
    def target(self) -> str:
        """The canonical container path this mount targets (see ``container_target``)."""
        return container_target(self.container_path)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One device node of a response (kubelet ``DeviceSpec``); ``permissions`` like ``rwm``."""

    container_path: str
    host_path: str
    permissions: str = ""

    def __post_init__(self) -> None:
        _check_str(self.container_path, "device container_path")
        _check_str(self.host_path, "device host_path")
        _check_str(self.permissions, "device permissions")


def _frozen_map(mapping: Mapping[str, str], what: str) -> Mapping[str, str]:
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{what}: expected a mapping of strings, got {type(mapping).__name__}")
    for key, value in mapping.items():
        _check_str(key, f"{what} key")
        _check_str(value, f"{what}[{key!r}]")
    # A private copy: a caller mutating its dict later cannot change a published response.
    return MappingProxyType(dict(mapping))


def _frozen_seq(items: Iterable[Any], kind: type[Any], what: str) -> tuple[Any, ...]:
    if isinstance(items, str | bytes | Mapping):
        raise ConfigError(f"{what}: expected a sequence of {kind.__name__}")
    result = tuple(items)
    for index, item in enumerate(result):
        if not isinstance(item, kind):
            raise ConfigError(
                f"{what}[{index}]: expected {kind.__name__}, got {type(item).__name__}"
            )
    return result


@dataclass(frozen=True, slots=True)
class ContainerAllocateResponse:
    """The kubelet's per-container answer to ``Allocate`` (device plugin API v1beta1).

    Immutable: ``envs`` and ``annotations`` are read-only mappings, the lists are tuples.  Build
    a changed copy with :func:`dataclasses.replace`.  The constructor accepts any mapping and
    any iterable and copies them; wrong types raise :class:`~hami_trio.errors.ConfigError`.
    """

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "envs", _frozen_map(self.envs, "envs"))
        object.__setattr__(self, "mounts", _frozen_seq(self.mounts, Mount, "mounts"))
        object.__setattr__(self, "devices", _frozen_seq(self.devices, DeviceSpec, "devices"))
        object.__setattr__(self, "annotations", _frozen_map(self.annotations, "annotations"))
        object.__setattr__(self, "cdi_devices", _frozen_seq(self.cdi_devices, str, "cdi_devices"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContainerAllocateResponse:
        """Build a response from the JSON object Go writes for a ContainerAllocateResponse.

        Keys are Go ``encoding/json``'s snake_case names (``container_path``, ``host_path``,
        ``read_only``, ``cdi_devices``); protobuf JSON's camelCase spellings (``containerPath``,
        ``hostPath``, ``readOnly``, ``cdiDevices``) are accepted too.  Absent or ``null``
        fields are empty, as in Go.  Unknown keys are refused rather than dropped, so a field a
        newer kubelet API adds cannot silently disappear from the answer.

        Args:
            data: the decoded JSON object.

        Returns:
            The response.

        Raises:
            ConfigError: not an object, an unknown key, or a value of the wrong type; the
                message names the field.
        """
        top = _fields(data, "response", _RESPONSE_KEYS)
        mounts = [
            Mount(
                container_path=_get(m, "container_path", str, "", f"mounts[{i}]"),
                host_path=_get(m, "host_path", str, "", f"mounts[{i}]"),
                read_only=_get(m, "read_only", bool, False, f"mounts[{i}]"),
            )
            for i, m in enumerate(_list(top, "mounts", _MOUNT_KEYS))
        ]
        devices = [
            DeviceSpec(
                container_path=_get(d, "container_path", str, "", f"devices[{i}]"),
                host_path=_get(d, "host_path", str, "", f"devices[{i}]"),
                permissions=_get(d, "permissions", str, "", f"devices[{i}]"),
            )
            for i, d in enumerate(_list(top, "devices", _DEVICE_KEYS))
        ]
        cdi = [
            _get(c, "name", str, "", f"cdi_devices[{i}]")
            for i, c in enumerate(_list(top, "cdi_devices", _CDI_KEYS))
        ]
        return cls(
            envs=_get(top, "envs", dict, {}, "response"),
            mounts=tuple(mounts),
            devices=tuple(devices),
            annotations=_get(top, "annotations", dict, {}, "response"),
            cdi_devices=tuple(cdi),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object Go's ``encoding/json`` writes: snake_case, empty fields omitted."""
        out: dict[str, Any] = {}
        if self.envs:
            out["envs"] = dict(self.envs)
        if self.mounts:
            out["mounts"] = [
                _omit_empty(
                    {
                        "container_path": m.container_path,
                        "host_path": m.host_path,
                        "read_only": m.read_only,
                    }
                )
                for m in self.mounts
            ]
        if self.devices:
            out["devices"] = [
                _omit_empty(
                    {
                        "container_path": d.container_path,
                        "host_path": d.host_path,
                        "permissions": d.permissions,
                    }
                )
                for d in self.devices
            ]
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.cdi_devices:
            out["cdi_devices"] = [_omit_empty({"name": name}) for name in self.cdi_devices]
        return out

    @classmethod
    def from_json(cls, text: str | bytes) -> ContainerAllocateResponse:
        """:meth:`from_dict` of a JSON document.

        Raises:
            ConfigError: the text is not JSON, or :meth:`from_dict` refuses it.
        """
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"response: not valid JSON ({exc})") from exc
        return cls.from_dict(data)

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON with sorted keys (stable output for diffs)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


# Accepted keys per JSON object: snake_case (Go encoding/json) -> also its protobuf camelCase.
_RESPONSE_KEYS = {
    "envs": "envs",
    "mounts": "mounts",
    "devices": "devices",
    "annotations": "annotations",
    "cdi_devices": "cdiDevices",
}
_MOUNT_KEYS = {
    "container_path": "containerPath",
    "host_path": "hostPath",
    "read_only": "readOnly",
}
_DEVICE_KEYS = {
    "container_path": "containerPath",
    "host_path": "hostPath",
    "permissions": "permissions",
}
_CDI_KEYS = {"name": "name"}


def _fields(data: Any, what: str, keys: Mapping[str, str]) -> dict[str, Any]:
    """Normalise one JSON object to snake_case keys, refusing unknown or repeated fields."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: expected a JSON object, got {type(data).__name__}")
    by_alias = {alias: name for name, alias in keys.items()} | {name: name for name in keys}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = by_alias.get(key)
        if name is None:
            raise ConfigError(f"{what}: unknown field {key!r} (known: {', '.join(keys)})")
        if name in out:
            raise ConfigError(f"{what}: field {name!r} given twice")
        out[name] = value
    return out


def _list(top: Mapping[str, Any], name: str, keys: Mapping[str, str]) -> list[dict[str, Any]]:
    value = top.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{name}: expected a JSON array, got {type(value).__name__}")
    return [_fields(item, f"{name}[{i}]", keys) for i, item in enumerate(value)]


def _get(obj: Mapping[str, Any], name: str, kind: type[Any], default: Any, where: str) -> Any:
    value = obj.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ConfigError(
            f"{where}.{name}: expected {_JSON_TYPE[kind]}, got {type(value).__name__}"
        )
    return value


_JSON_TYPE: dict[type[Any], str] = {str: "a string", bool: "a boolean", dict: "an object"}


def _omit_empty(obj: dict[str, Any]) -> dict[str, Any]:
    # Go's `omitempty`: "" and false are left out.
    return {key: value for key, value in obj.items() if value not in ("", False)}


def _check_str(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{what}: expected a string, got {type(value).__name__}")


def _check_bool(value: object, what: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{what}: expected a boolean, got {type(value).__name__}")


def lock_parent_mount(host_path: str = LOCK_PARENT) -> Mount:
    """The canonical writable mount of the lock parent at ``/tmp/vgpulock``."""
    return Mount(container_path=LOCK_PARENT, host_path=host_path, read_only=False)


def broker_mount(host_path: str = BROKER_HOST_DIR) -> Mount:
    """The canonical read-only mount of the broker directory at ``/tmp/vgpulock/hostpid``."""
    return Mount(container_path=BROKER_CONTAINER_DIR, host_path=host_path, read_only=True)


def configure_host_pid_broker(
    response: ContainerAllocateResponse,
    enabled: bool,
    *,
    lock_parent_host: str = LOCK_PARENT,
    broker_host_dir: str = BROKER_HOST_DIR,
) -> ContainerAllocateResponse:
    """Apply the broker switch and the two canonical mounts to one container's response.

    The rules are in this module's docstring.  Pure: ``response`` is not
    changed; devices, annotations and CDI devices are carried over untouched.

    Args:
        response: the response the device plugin built for the container.
        enabled: the broker switch (``broker_switch_from_env(os.environ)``: on only for
            ``LIBVGPU_HOSTPID_BROKER=1``).
        lock_parent_host: host path of the writable parent mount (the directory
            ``prepare_lock_parent`` prepared).
        broker_host_dir: host path of the broker's socket directory.

    Returns:
        A new response with the env switch and the canonical mounts applied.
    """
    envs = {key: value for key, value in response.envs.items() if key not in RESERVED_ENV_KEYS}
    if enabled:
        envs[BROKER_SWITCH_ENV] = "1"

    parent = lock_parent_mount(lock_parent_host)
    broker = broker_mount(broker_host_dir)
    mounts: list[Mount] = []
    parent_at = broker_at = -1
    for mount in response.mounts:
        target = mount.target
        if target == LOCK_PARENT:
            # The canonical mount takes the place of the first equivalent entry; later
            # duplicates are dropped, so the runtime sees the parent exactly once.
            if parent_at < 0:
                parent_at = len(mounts)
                mounts.append(parent)
        elif target == BROKER_CONTAINER_DIR:
            if enabled and broker_at < 0:
                broker_at = len(mounts)
                mounts.append(broker)
        else:
            mounts.append(mount)
    if parent_at < 0:
        parent_at = len(mounts)
        mounts.append(parent)
    if enabled and broker_at < 0:
        broker_at = len(mounts)
        mounts.append(broker)
    if 0 <= broker_at < parent_at:
        # Mounted after its nested child, the parent would hide the broker mount: move the
        # parent to just before the broker; everything else keeps its relative order.
        del mounts[parent_at]
        mounts.insert(broker_at, parent)

    return replace(response, envs=envs, mounts=tuple(mounts))
