"""Decoding of the ``hami.io/vgpu-mig-allocations`` pod annotation (pure).

How this works: HAMi's scheduler writes a JSON list of MIG allocations on a pod and the
device plugin fills in each one's runtime identity; the metrics collector turns every
complete allocation into one ``hami_mig_device_info`` row.  :func:`decode_mig_allocations`
accepts exactly what HAMi's Go decoder accepts (same annotation, same rows), and because
whoever creates a pod writes this annotation it also bounds what one pod can add
(:data:`MAX_ANNOTATION_BYTES`, :data:`MAX_ALLOCATIONS`, :data:`MAX_FIELD_CHARS`, nesting,
lone surrogates).  Any error rejects the whole annotation with :class:`MigAnnotationError`,
never another exception; the collector then skips that pod's MIG rows with one warning.
The rules and the limits: docs/metrics.md (hami_mig_device_info).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_ALLOCATIONS",
    "MAX_ANNOTATION_BYTES",
    "MAX_FIELD_CHARS",
    "MIG_ALLOCATIONS_ANNOTATION",
    "MigAllocation",
    "MigAnnotationError",
    "decode_mig_allocations",
    "mig_container_name",
]

#: The pod annotation HAMi's scheduler and device plugin write.
MIG_ALLOCATIONS_ANNOTATION: Final = "hami.io/vgpu-mig-allocations"

#: The longest annotation value decoded, in UTF-8 bytes (longer ones are refused unparsed).
MAX_ANNOTATION_BYTES: Final = 64 * 1024
#: The most allocations one pod's annotation may list.
MAX_ALLOCATIONS: Final = 128
#: The longest ``gpuUUID``, ``profile`` or ``migUUID`` accepted (they become label values).
MAX_FIELD_CHARS: Final = 128

_INT64: Final = (-(1 << 63), (1 << 63) - 1)
_UINT32: Final = (0, (1 << 32) - 1)


class MigAnnotationError(ValueError):
    """The annotation is not a valid list of MIG allocations (the message says where)."""


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One MIG device reserved for one container (runtime fields None until realised)."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement_start: int
    placement_size: int
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def realised(self) -> bool:
        """Whether the device plugin filled in the runtime identity (a metrics row exists)."""
        return (
            bool(self.mig_uuid)
            and self.gpu_instance_id is not None
            and self.compute_instance_id is not None
        )


def _reject_constant(name: str) -> float:
    raise MigAnnotationError(f"invalid JSON value {name}")  # NaN/Infinity: Go rejects them


class _Object(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs in order (duplicates kept, as Go sees them)."""


def _fields(
    obj: _Object, names: Sequence[str], pointers: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Map JSON keys onto field names like encoding/json.

    A key matches a field exactly or, failing that, case-insensitively; the last matching
    key wins.  ``null`` resets a pointer field (in ``pointers``) to nil and leaves any other
    field as it was.
    """
    folded = {name.lower(): name for name in names}
    values: dict[str, Any] = {}
    for key, value in obj:
        name = key if key in names else folded.get(key.lower())
        if name is None:
            continue
        if value is None:
            if name in pointers:
                values.pop(name, None)
            continue
        values[name] = value
    return values


def _show(value: Any) -> str:
    """A short description of a JSON value for an error message (never the whole value)."""
    if isinstance(value, _Object):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:40] + "..."
        return json.dumps(text)  # escapes control characters and lone surrogates
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = repr(value)  # int or float; a long integer is cut
    return text if len(text) <= 40 else f"a number of {len(text)} digits"


def _integer(value: Any, bounds: tuple[int, int], where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MigAnnotationError(f"{where}: expected an integer, got {_show(value)}")
    if not bounds[0] <= value <= bounds[1]:
        raise MigAnnotationError(f"{where}: {_show(value)} is out of range")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MigAnnotationError(f"{where}: expected a string, got {_show(value)}")
    if len(value) > MAX_FIELD_CHARS:
        raise MigAnnotationError(
            f"{where}: {len(value)} characters, more than the {MAX_FIELD_CHARS} allowed"
        )
    if not _encodable(value):
        raise MigAnnotationError(
            f"{where}: {_show(value)} holds a lone UTF-16 surrogate (not valid Unicode)"
        )
    return value


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _placement(value: Any, where: str) -> tuple[int, int]:
    if value is None:
        return 0, 0
    if not isinstance(value, _Object):
        raise MigAnnotationError(f"{where}: expected an object")
    fields = _fields(value, ("start", "size"))
    start = fields.get("start")
    size = fields.get("size")
    return (
        0 if start is None else _integer(start, _UINT32, f"{where}.start"),
        0 if size is None else _integer(size, _UINT32, f"{where}.size"),
    )


_POINTERS: Final = frozenset({"gpuInstanceID", "computeInstanceID"})
_NAMES: Final = (
    "containerIndex",
    "deviceIndex",
    "gpuUUID",
    "profile",
    "placement",
    "migUUID",
    "gpuInstanceID",
    "computeInstanceID",
)


def _allocation(value: Any, index: int) -> MigAllocation:
    where = f"allocation {index}"
    if value is None:
        value = _Object()  # Go leaves a null element at its zero value (rejected below)
    if not isinstance(value, _Object):
        raise MigAnnotationError(f"{where}: expected an object")
    fields = _fields(value, _NAMES, _POINTERS)
    start, size = _placement(fields.get("placement"), f"{where}.placement")
    allocation = MigAllocation(
        container_index=_integer(
            fields.get("containerIndex", 0), _INT64, f"{where}.containerIndex"
        ),
        device_index=_integer(fields.get("deviceIndex", 0), _INT64, f"{where}.deviceIndex"),
        gpu_uuid=_string(fields.get("gpuUUID", ""), f"{where}.gpuUUID"),
        profile=_string(fields.get("profile", ""), f"{where}.profile"),
        placement_start=start,
        placement_size=size,
        mig_uuid=_string(fields.get("migUUID", ""), f"{where}.migUUID"),
        gpu_instance_id=(
            None
            if "gpuInstanceID" not in fields
            else _integer(fields["gpuInstanceID"], _UINT32, f"{where}.gpuInstanceID")
        ),
        compute_instance_id=(
            None
            if "computeInstanceID" not in fields
            else _integer(fields["computeInstanceID"], _UINT32, f"{where}.computeInstanceID")
        ),
    )
    if (
        allocation.container_index < 0
        or allocation.device_index < 0
        or not allocation.gpu_uuid
        or not allocation.profile
        or allocation.placement_size == 0
    ):
        raise MigAnnotationError(f"MIG allocation {index} is incomplete")
    runtime = (
        bool(allocation.mig_uuid)
        + (allocation.gpu_instance_id is not None)
        + (allocation.compute_instance_id is not None)
    )
    if runtime not in (0, 3):
        raise MigAnnotationError(f"MIG allocation {index} has partial runtime identity")
    return allocation


def decode_mig_allocations(raw: str | None) -> tuple[MigAllocation, ...]:
    """Decode the annotation value (see the module docstring for the rules).

    Args:
        raw: the annotation value; None or ``""`` means no allocations.

    Returns:
        Every allocation, realised or not, in annotation order.

    Raises:
        MigAnnotationError: the value is not a valid allocation list.
    """
    if raw is None:
        return ()
    if not isinstance(raw, str):
        raise MigAnnotationError(f"expected a string value, got {type(raw).__name__}")
    if not raw:
        return ()
    # Characters first: the byte count is at least that, and counting bytes encodes.
    if len(raw) > MAX_ANNOTATION_BYTES or (
        len(raw.encode("utf-8", "surrogatepass")) > MAX_ANNOTATION_BYTES
    ):
        raise MigAnnotationError(
            f"{len(raw)} characters, longer than the {MAX_ANNOTATION_BYTES} bytes allowed"
        )
    try:
        doc = json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_Object)
    except MigAnnotationError:
        raise
    except RecursionError as exc:
        raise MigAnnotationError("not JSON: nested too deeply") from exc
    except ValueError as exc:
        raise MigAnnotationError(f"not JSON: {exc}") from exc
    if doc is None:
        return ()
    if not isinstance(doc, list) or isinstance(doc, _Object):
        raise MigAnnotationError("expected a JSON array of allocations")
    if len(doc) > MAX_ALLOCATIONS:
        raise MigAnnotationError(
            f"{len(doc)} allocations, more than the {MAX_ALLOCATIONS} one pod may have"
        )
    allocations = tuple(_allocation(value, index) for index, value in enumerate(doc))
    seen: set[tuple[int, int]] = set()
    for allocation in allocations:
        key = (allocation.container_index, allocation.device_index)
        if key in seen:
            raise MigAnnotationError(
                f"duplicate MIG allocation for container {key[0]} device {key[1]}"
            )
        seen.add(key)
    return allocations


def mig_container_name(
    init_containers: Sequence[str], containers: Sequence[str], index: int
) -> str | None:
    """The container a ``containerIndex`` names: init containers first, then containers.

    Returns:
        The name, or None when the index is negative or past the last container.
    """
    if index < 0:
        return None
    if index < len(init_containers):
        return init_containers[index]
    index -= len(init_containers)
    if index >= len(containers):
        return None
    return containers[index]
