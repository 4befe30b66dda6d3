"""Decoding of the ``hami.io/vgpu-devices-allocated`` pod annotation (pure).

How this works: HAMi's scheduler records what it gave each container of a pod in this
annotation, before the pod runs; the pod collector turns it into
``hami_trio_container_allocated_*`` rows.  The value is one entry per container (init
containers, then containers), separated by ``;``; inside an entry the devices are separated
by ``:``, each ``UUID,Type,memory MiB,cores percent``, e.g.
``GPU-aaaa,NVIDIA,4096,30:GPU-bbbb,NVIDIA,2048,0:;;``.  :func:`decode_allocated` accepts
what HAMi's ``DecodePodDevices`` accepts (fields base-10 ``int32`` as Go's ``ParseInt``
reads them) and, because whoever creates a pod writes this annotation, bounds what one pod
can add (:data:`MAX_ANNOTATION_BYTES`, :data:`MAX_ENTRIES`, :data:`MAX_DEVICES`,
:data:`MAX_FIELD_CHARS`, valid Unicode).  Any error raises
:class:`AllocatedAnnotationError`, never another exception; the collector then leaves that
pod's allocation rows out with one warning.  The rules: docs/metrics.md (allocated).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ALLOCATED_ANNOTATION",
    "MAX_ANNOTATION_BYTES",
    "MAX_DEVICES",
    "MAX_ENTRIES",
    "MAX_FIELD_CHARS",
    "MIB",
    "AllocatedAnnotationError",
    "AllocatedDevice",
    "ContainerAllocation",
    "allocated_containers",
    "decode_allocated",
    "named_allocations",
]

#: The pod annotation HAMi's scheduler writes for NVIDIA vGPUs (its ``SupportDevices`` key).
ALLOCATED_ANNOTATION: Final = "hami.io/vgpu-devices-allocated"

#: The longest annotation value decoded, in UTF-8 bytes (longer ones are refused unparsed).
MAX_ANNOTATION_BYTES: Final = 64 * 1024
#: The most ``;``-separated entries (containers, plus the trailing empty one) accepted.
MAX_ENTRIES: Final = 512
#: The most devices one pod's annotation may list, all containers together.
MAX_DEVICES: Final = 128
#: The longest UUID or type accepted (the UUID becomes a label value).
MAX_FIELD_CHARS: Final = 128
#: Bytes in one MiB: HAMi passes the memory figure to HAMi-core as ``<n>m`` (MiB).
MIB: Final = 1 << 20

_CONTAINER_SEP: Final = ";"
_DEVICE_SEP: Final = ":"
_INT32_MAX: Final = (1 << 31) - 1
# strconv.ParseInt(s, 10, 32): an optional sign, then ASCII digits only.
_GO_INT: Final = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)


class AllocatedAnnotationError(ValueError):
    """The annotation is not a valid device allocation (the message says where)."""


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device the scheduler gave one container."""

    uuid: str
    type: str
    memory_mib: int
    cores: int

    @property
    def memory_bytes(self) -> int:
        """The memory limit in bytes (``memory_mib`` MiB)."""
        return self.memory_mib * MIB


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """One device of one named container: ``vdevice_index`` is its place in that container's
    list, the index HAMi-core (``CUDA_DEVICE_MEMORY_LIMIT_<i>``) and the monitor use."""

    container: str
    vdevice_index: int
    device: AllocatedDevice


def _show(text: str) -> str:
    """A short, printable rendering of tenant text for an error message."""
    shown = text if len(text) <= 40 else text[:40] + "..."
    return ascii(shown)


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _number(text: str, what: str, where: str) -> int:
    if _GO_INT.match(text) is None:
        raise AllocatedAnnotationError(f"{where}: {what} {_show(text)} is not an integer")
    # At most 12 characters reach int(): a longer digit string is out of range anyway.
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 10:
        raise AllocatedAnnotationError(f"{where}: {what} {_show(text)} is out of range")
    value = int(text, 10)
    if value > _INT32_MAX or value < -_INT32_MAX - 1:
        raise AllocatedAnnotationError(f"{where}: {what} {_show(text)} is out of range")
    if value < 0:
        raise AllocatedAnnotationError(f"{where}: {what} {value} is negative")
    return value


def _text_field(text: str, what: str, where: str) -> str:
    if not text:
        raise AllocatedAnnotationError(f"{where}: missing device {what}")
    if len(text) > MAX_FIELD_CHARS:
        raise AllocatedAnnotationError(
            f"{where}: device {what} of {len(text)} characters, more than the "
            f"{MAX_FIELD_CHARS} allowed"
        )
    if not _encodable(text):
        raise AllocatedAnnotationError(
            f"{where}: device {what} {_show(text)} holds a lone UTF-16 surrogate"
        )
    return text


def _device(segment: str, where: str) -> AllocatedDevice:
    if "," not in segment:
        raise AllocatedAnnotationError(f"{where}: {_show(segment)} is not UUID,Type,MiB,cores")
    fields = segment.split(",", 4)  # fields after the fourth are ignored, as upstream does
    if len(fields) < 4:
        raise AllocatedAnnotationError(
            f"{where}: {len(fields)} fields, want UUID,Type,memory MiB,cores"
        )
    return AllocatedDevice(
        uuid=_text_field(fields[0], "UUID", where),
        type=_text_field(fields[1], "type", where),
        memory_mib=_number(fields[2], "memory", where),
        cores=_number(fields[3], "cores", where),
    )


def decode_allocated(raw: str | None) -> tuple[tuple[AllocatedDevice, ...], ...]:
    """Decode the annotation value (see the module docstring for the rules).

    Args:
        raw: the annotation value; None or ``""`` means no allocation.

    Returns:
        One tuple of devices per ``;``-separated entry, in annotation order (init containers
        first, then containers), empty entries included.

    Raises:
        AllocatedAnnotationError: the value is not a valid allocation or is over a limit.
    """
    if raw is None:
        return ()
    if not isinstance(raw, str):
        raise AllocatedAnnotationError(f"expected a string value, got {type(raw).__name__}")
    if not raw:
        return ()
    # Characters first: the byte count is at least that, and counting bytes encodes.
    if len(raw) > MAX_ANNOTATION_BYTES or (
        len(raw.encode("utf-8", "surrogatepass")) > MAX_ANNOTATION_BYTES
    ):
        raise AllocatedAnnotationError(
            f"{len(raw)} characters, longer than the {MAX_ANNOTATION_BYTES} bytes allowed"
        )
    if raw.count(_CONTAINER_SEP) >= MAX_ENTRIES:
        raise AllocatedAnnotationError(
            f"{raw.count(_CONTAINER_SEP) + 1} container entries, more than the "
            f"{MAX_ENTRIES} allowed"
        )
    entries: list[tuple[AllocatedDevice, ...]] = []
    devices = 0
    for index, entry in enumerate(raw.split(_CONTAINER_SEP)):
        found: list[AllocatedDevice] = []
        for position, segment in enumerate(entry.split(_DEVICE_SEP)):
            if not segment:
                continue
            devices += 1
            if devices > MAX_DEVICES:
                raise AllocatedAnnotationError(
                    f"more than the {MAX_DEVICES} devices one pod may have"
                )
            found.append(_device(segment, f"container entry {index}, device {position}"))
        entries.append(tuple(found))
    return tuple(entries)


def allocated_containers(
    init_containers: Sequence[str],
    containers: Sequence[str],
    entries: Sequence[Sequence[AllocatedDevice]],
) -> tuple[tuple[ContainerAllocation, ...], tuple[int, ...]]:
    """Name the devices of :func:`decode_allocated`'s entries: init containers first.

    Returns:
        The devices of every entry that names a container, in annotation order, and the
        indexes of entries that list devices but name no container (the pod has fewer
        containers than the annotation entries: a mismatch worth a warning, not an error).
    """
    names = (*init_containers, *containers)
    named: list[ContainerAllocation] = []
    orphans: list[int] = []
    for index, devices in enumerate(entries):
        if not devices:
            continue
        if index >= len(names):
            orphans.append(index)
            continue
        named.extend(
            ContainerAllocation(names[index], position, device)
            for position, device in enumerate(devices)
        )
    return tuple(named), tuple(orphans)


def named_allocations(
    annotations: Mapping[str, str],
    init_containers: Sequence[str],
    containers: Sequence[str],
) -> tuple[ContainerAllocation, ...] | None:
    """The named devices of a pod's allocation annotation in ``annotations``
    (:func:`decode_allocated`, then :func:`allocated_containers`); None when the pod has no
    such annotation or it is refused (whoever reports refusals does so elsewhere)."""
    raw = annotations.get(ALLOCATED_ANNOTATION)
    if not raw:
        return None
    try:
        entries = decode_allocated(raw)
    except AllocatedAnnotationError:
        return None
    named, _ = allocated_containers(init_containers, containers, entries)
    return named
