"""Immutable usage snapshots of one shared region, parsed from bytes (pure).

How this works: a :class:`RegionDecoder` (one per open file) says which byte ranges to read -
the 16/24-byte tail, then the head up to ``clamp(proc_num, 0, 1024)`` live slots -
:mod:`hami_trio.monitor.region` ``pread``s them, and the decoder turns them into a frozen
:class:`UsageSnapshot`, the same object again when no byte it depends on changed.  Per-device
memory and SM utilisation are uint64 sums (wrapping, as HAMi does) over the live slots whose
``status != 0``; all 16 UUIDs are kept for the feedback step.  :func:`parse_region` feeds a
fresh decoder from a whole file in memory (fuzzing, tests).  A :class:`TickDecoder` does the
tick's part: the tail, and the static head now and then.

Every value is read by name: the tail's words through the layout table's ``TAIL_INDEX``,
the slots' through :data:`DEVICE_SUMS` and the plan of columns derived from it
(``_slot_plan``).  The plain reference decoder the tests compare these with is
tests/monitor/reference.py.  docs/monitor.md (Usage snapshot, How one region is read).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import operator
import struct
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, NoReturn

from hami_trio.monitor.layout import (
    HEADER,
    HEADER_SIZE,
    LAYOUTS,
    MAX_DEVICES,
    TAIL_INDEX,
    TAIL_MEMBERS,
    USED_FIELDS,
    UTIL_FIELDS,
    UUID_SIZE,
    Format,
    Layout,
    clamp_proc_num,
    classify,
    layout_for_size,
)

__all__ = [
    "DEVICE_SUMS",
    "STATIC_REFRESH_TICKS",
    "DeviceUUID",
    "DeviceUsage",
    "RegionDecoder",
    "SlotTotals",
    "StaticInfo",
    "TailValues",
    "TickDecoder",
    "TickSnapshot",
    "UUIDState",
    "UsageSnapshot",
    "parse_region",
    "parse_static",
    "read_tail",
    "sum_slots_without",
]

_U64 = struct.Struct("<Q")
_LIMITS = struct.Struct(f"<{MAX_DEVICES}Q")
#: A decoded tail (:func:`read_tail`): the value of each of ``TAIL_MEMBERS``, at its
#: ``TAIL_INDEX``.  A plain tuple, read through the named positions (``_PROC_NUM``), not a
#: ``NamedTuple``: making one per container per tick costs the tick's decode about a fifth.
TailValues = tuple[int, ...]
_PROC_NUM = TAIL_INDEX["proc_num"]
_tuple_new = tuple.__new__
_MASK64 = (1 << 64) - 1
#: The magic's bytes: all the decoder compares of a v0 region's first bytes, whose next words
#: are the lock's (``sm_init_flag``, ``owner_pid``); v1 adds major and minor (HEADER_SIZE).
_MAGIC_SIZE = 4
_LABEL_BYTES = 40  # HAMi's metrics label uses the first 40 bytes of the UUID


class UUIDState(enum.Enum):
    """What a 96-byte UUID slot holds."""

    UNUSED = "unused"  # first byte is 0: no device in this slot
    VALID = "valid"  # text before the first NUL is valid UTF-8
    INVALID_UTF8 = "invalid_utf8"  # set, but not UTF-8 (corrupt or hostile); never crashes


@dataclass(frozen=True, slots=True, repr=False)
class DeviceUUID:
    """One ``uuids[i]`` slot: the raw 96 bytes and what they decode to.

    ``raw`` is the identity HAMi's feedback uses (two containers share a GPU when their raw
    slots are equal).  ``text`` is the UTF-8 text before the first NUL, or None when the slot
    is unused or not UTF-8.
    """

    raw: bytes
    state: UUIDState
    text: str | None

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def from_raw(raw: bytes) -> DeviceUUID:
        """Decode a 96-byte slot (memoised: the same GPUs appear in many containers).

        Raises:
            ValueError: ``raw`` is not exactly 96 bytes.
        """
        if len(raw) != UUID_SIZE:
            raise ValueError(f"a UUID slot is {UUID_SIZE} bytes, got {len(raw)}")
        if raw[0] == 0:
            return DeviceUUID(raw, UUIDState.UNUSED, None)
        try:
            text = raw.split(b"\0", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            return DeviceUUID(raw, UUIDState.INVALID_UTF8, None)
        return DeviceUUID(raw, UUIDState.VALID, text)

    def __repr__(self) -> str:
        shown = self.raw.rstrip(b"\0")
        return f"DeviceUUID({shown!r}, {self.state.value})"

    @property
    def valid(self) -> bool:
        """HAMi's ``IsValidUUID``: the first byte is not NUL (UTF-8 validity not required)."""
        return self.state is not UUIDState.UNUSED

    @property
    def label(self) -> str | None:
        """HAMi's metrics label: the first 40 bytes with NULs removed, if UTF-8, else None."""
        if self.state is UUIDState.UNUSED:
            return None
        try:
            return self.raw[:_LABEL_BYTES].replace(b"\0", b"").decode("utf-8")
        except UnicodeDecodeError:
            return None


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device of a container: its limits and the sums over the live process slots."""

    index: int
    uuid: DeviceUUID
    memory_limit: int
    sm_limit: int
    memory_total: int
    context_size: int
    module_size: int
    buffer_size: int
    offset: int
    sm_util: int


@dataclass(frozen=True, slots=True)
class StaticInfo:
    """The part of a region that changes rarely: device count, UUIDs and limits."""

    num: int
    device_count: int
    uuids: tuple[DeviceUUID, ...]
    limits: tuple[int, ...]
    sm_limits: tuple[int, ...]
    device_keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """Everything the monitor knows about one region at one instant.

    ``devices`` has ``device_count`` entries; ``uuids`` always has 16 (every UUID slot, as
    the feedback step needs) and ``device_keys`` holds the raw bytes of those that are valid
    (first byte not NUL), in slot order - HAMi's device identity for Observe.
    ``major``/``minor`` are None for v0 (it has no version words).
    ``proc_num`` is the raw value from the file; ``active_slots`` counts the slots that were
    summed (index below the clamped ``proc_num`` and ``status != 0``).  ``pids`` and
    ``host_pids`` are those live slots' ``pid`` (the process's own PID namespace) and
    ``hostpid`` (0: HAMi-core never learned it), in slot order; ``device_processes[d]``
    counts the live slots using device ``d`` (its memory total or SM utilisation not 0).
    """

    format: Format
    major: int | None
    minor: int | None
    file_size: int
    device_count: int
    proc_num: int
    active_slots: int
    priority: int
    recent_kernel: int
    utilization_switch: int
    last_kernel_time: int
    devices: tuple[DeviceUsage, ...]
    uuids: tuple[DeviceUUID, ...]
    device_keys: tuple[bytes, ...]
    pids: tuple[int, ...] = ()
    host_pids: tuple[int, ...] = ()
    device_processes: tuple[int, ...] = ()


def _constructor(cls: type[Any], *, tail: bool = False) -> Callable[..., Any]:
    """A faster equivalent of ``cls(*fields)`` for a frozen, slotted dataclass with no
    ``__post_init__`` (the decoder builds a few per container per tick).  With ``tail``, the
    fields named as the tail's members come from one argument, a :data:`TailValues`, in the
    place of the first of them: each is stored from the ``TAIL_INDEX`` of its own name.

    A frozen class refuses plain attribute stores, and its ``__init__`` goes through
    ``object.__setattr__`` by name for every field.  Instead, the object is made as an
    instance of a private twin class with the very same ``__slots__`` (the same memory
    layout, no ``__setattr__`` of its own), its fields are stored as ordinary slot stores,
    and its class is then switched to ``cls`` (Python allows that between classes of
    identical layout): a third of the time of setting each slot through its descriptor.
    Generated like dataclasses' own ``__init__``; a test checks it against the class."""
    names = [f.name for f in dataclasses.fields(cls)]
    slots = cls.__dict__["__slots__"]
    if list(slots) != names:  # pragma: no cover - dataclass(slots=True) lays them out so
        raise TypeError(f"{cls.__name__}: slots {slots} are not its fields {names}")
    # The same bases (a generic class's Generic too): only then may an object switch class.
    twin = types.new_class(
        f"_{cls.__name__}Twin",
        cls.__dict__.get("__orig_bases__", ()),
        exec_body=lambda ns: ns.update({"__slots__": tuple(slots)}),
    )
    scope: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    spread = set(TAIL_MEMBERS) if tail else set()
    if not spread <= set(names):  # pragma: no cover - the snapshots have every tail member
        raise TypeError(f"{cls.__name__} lacks tail fields {spread - set(names)}")
    params = [name for name in names if name not in spread]
    if spread:
        params.insert(min(names.index(name) for name in spread), "_tail")
    stores = {name: f"_tail[{TAIL_INDEX[name]}]" for name in spread}
    lines = [f"def make({', '.join(params)}):", "    self = _new(_twin)"]
    lines += [f"    self.{name} = {stores.get(name, name)}" for name in names]
    lines += ["    self.__class__ = _cls", "    return self"]
    exec("\n".join(lines), scope)  # our own field names only
    make: Callable[..., Any] = scope["make"]
    return make


_new_device_usage: Callable[..., DeviceUsage] = _constructor(DeviceUsage)
# The snapshots take their tail fields from a TailValues: (format, major, minor, file_size,
# device_count, tail, ...) - see _constructor.
_new_usage_snapshot: Callable[..., UsageSnapshot] = _constructor(UsageSnapshot, tail=True)


def read_tail(layout: Layout, tail: bytes | bytearray | memoryview) -> TailValues:
    """Decode the tail range of ``layout`` (``layout.tail_size`` bytes at its
    ``tail_offset``): the value of each of ``TAIL_MEMBERS`` at its ``TAIL_INDEX``;
    ``last_kernel_time`` is 0 for v0.

    Raises:
        ValueError: ``tail`` is shorter than ``layout.tail_size``.
    """
    if len(tail) < layout.tail_size:
        raise ValueError(f"tail needs {layout.tail_size} bytes, got {len(tail)}")
    # a tuple plus () is the tuple itself (v1: no member absent)
    values: TailValues = layout.tail_struct.unpack_from(tail) + layout.tail_absent
    return values


def parse_static(layout: Layout, head: bytes | bytearray | memoryview) -> StaticInfo:
    """Decode ``num``, the 16 UUIDs and the limits from a head buffer.

    Raises:
        ValueError: ``head`` does not reach the process slots.
    """
    if len(head) < layout.procs:
        raise ValueError(f"head needs at least {layout.procs} bytes, got {len(head)}")
    (num,) = _U64.unpack_from(head, layout.num)
    data = bytes(head[layout.uuids : layout.uuids + MAX_DEVICES * UUID_SIZE])
    uuids = tuple(
        DeviceUUID.from_raw(data[i * UUID_SIZE : (i + 1) * UUID_SIZE]) for i in range(MAX_DEVICES)
    )
    return StaticInfo(
        num=num,
        device_count=min(num, MAX_DEVICES),
        uuids=uuids,
        limits=_LIMITS.unpack_from(head, layout.limit),
        sm_limits=_LIMITS.unpack_from(head, layout.sm_limit),
        device_keys=tuple(uuid.raw for uuid in uuids if uuid.valid),
    )


@dataclass(frozen=True, slots=True)
class SlotTotals:
    """The per-device sums over the live slots of one head buffer, and how many were live.

    ``pids``/``host_pids``: the live slots' PIDs in slot order; ``device_processes``: per
    device, the live slots using it (memory total or SM utilisation not 0).
    """

    devices: tuple[DeviceUsage, ...]
    active_slots: int
    pids: tuple[int, ...] = ()
    host_pids: tuple[int, ...] = ()
    device_processes: tuple[int, ...] = ()


#: Each per-device sum of :class:`DeviceUsage` and the process-slot member it adds up over
#: the live slots: a member of ``used[]`` (``USED_FIELDS``) or of ``device_util[]``
#: (``UTIL_FIELDS``).  The slots are read for these members (and ``pid``, ``hostpid``,
#: ``status``) only; ``total`` and ``sm_util`` also say which devices a slot uses.
DEVICE_SUMS: Mapping[str, str] = MappingProxyType(
    {
        "memory_total": "total",
        "context_size": "context_size",
        "module_size": "module_size",
        "buffer_size": "data_size",
        "offset": "offset",
        "sm_util": "sm_util",
    }
)
#: The summed fields in :class:`DeviceUsage`'s order (they follow its first four fields).
_SUMMED = tuple(f.name for f in dataclasses.fields(DeviceUsage))[4:]
if set(_SUMMED) != set(DEVICE_SUMS) or not {"total", "sm_util"} <= set(DEVICE_SUMS.values()):
    raise AssertionError(f"DEVICE_SUMS {dict(DEVICE_SUMS)} does not fit DeviceUsage {_SUMMED}")


@dataclass(frozen=True, slots=True)
class _SlotPlan:
    """Where each slot member the monitor reads lands, by name, for one format and device
    count: :func:`_slot_fields` unpacks the slots into two flat tuples, slot after slot -
    ``memory`` (the ``used[]`` members of :data:`DEVICE_SUMS`, device after device) and
    ``other`` (``pid``, ``hostpid``, the ``device_util[]`` members of every device,
    ``status``) - and :func:`_flat_totals` sums their columns into ``sums`` (every memory
    column, then ``util_columns``).  Built from one list of named picks per part (in offset
    order), so the ``struct`` formats and the columns cannot disagree."""

    formats: tuple[str, str]  # one slot's struct formats: memory, other
    devices: range  # range(device count)
    memory_width: int  # memory fields per slot
    other_width: int  # other fields per slot
    pid: int  # columns of the other part
    hostpid: int
    status: int
    util_columns: tuple[int, ...]  # the other part's summed columns
    total: tuple[int, ...]  # per device: its ``total`` column in the memory part
    sm_util: tuple[int, ...]  # per device: its ``sm_util`` column in the other part
    # (sums, uuids, limits, sm_limits) -> every device's DeviceUsage (_device_builder)
    build_devices: Callable[..., tuple[DeviceUsage, ...]]
    zero_sums: tuple[int, ...]  # ``sums`` of no live slot
    zero_busy: tuple[int, ...]


@functools.lru_cache(maxsize=2 * (MAX_DEVICES + 1))
def _slot_plan(fmt: Format, device_count: int) -> _SlotPlan:
    layout = LAYOUTS[fmt]
    devices = range(device_count)
    summed = set(DEVICE_SUMS.values())
    used = sorted(summed & USED_FIELDS.keys(), key=USED_FIELDS.__getitem__)
    util = sorted(summed & UTIL_FIELDS.keys(), key=UTIL_FIELDS.__getitem__)
    # (offset in the slot, struct code, (member, device)), in ascending offset order
    Pick = tuple[int, str, tuple[str, int]]
    memory: list[Pick] = [
        (layout.slot_used + d * layout.used_stride + USED_FIELDS[m], "Q", (m, d))
        for d in devices
        for m in used
    ]
    utils: list[Pick] = [
        (layout.slot_util + d * layout.util_stride + UTIL_FIELDS[m], "Q", (m, d))
        for d in devices
        for m in util
    ]
    whole = -1  # the "device" of a member of the whole slot
    other: list[Pick] = [
        (layout.slot_pid, "i", ("pid", whole)),
        (layout.slot_hostpid, "i", ("hostpid", whole)),
        *utils,
        (layout.slot_status, "i", ("status", whole)),
    ]
    memory_at = {key: i for i, (_, _, key) in enumerate(memory)}
    other_at = {key: i for i, (_, _, key) in enumerate(other)}
    util_columns = tuple(other_at[key] for _, _, key in utils)
    in_sums = {**memory_at, **{key: len(memory) + i for i, (_, _, key) in enumerate(utils)}}
    return _SlotPlan(
        formats=(
            _slot_format(layout, [(offset, code) for offset, code, _ in memory]),
            _slot_format(layout, [(offset, code) for offset, code, _ in other]),
        ),
        devices=devices,
        memory_width=len(memory),
        other_width=len(other),
        pid=other_at[("pid", whole)],
        hostpid=other_at[("hostpid", whole)],
        status=other_at[("status", whole)],
        util_columns=util_columns,
        total=tuple(memory_at[("total", d)] for d in devices),
        sm_util=tuple(other_at[("sm_util", d)] for d in devices),
        build_devices=_device_builder(device_count, in_sums),
        zero_sums=(0,) * (len(memory) + len(utils)),
        zero_busy=(0,) * device_count,
    )


def _device_builder(
    device_count: int, in_sums: dict[tuple[str, int], int]
) -> Callable[..., tuple[DeviceUsage, ...]]:
    """``build(sums, uuids, limits, sm_limits)``: every device's :class:`DeviceUsage`, each
    sum taken from the place ``in_sums`` gives its (member, device), the member the one
    :data:`DEVICE_SUMS` names for the field.  Generated, like :func:`_constructor`, with
    those places written in: no loop or tuple per device at run time."""
    lines = ["def build(sums, uuids, limits, sm_limits):", "    return ("]
    for d in range(device_count):
        picks = ", ".join(f"sums[{in_sums[(DEVICE_SUMS[name], d)]}]" for name in _SUMMED)
        # positional: index, uuid, memory_limit, sm_limit, then the sums in the class's order
        lines.append(f"        _new({d}, uuids[{d}], limits[{d}], sm_limits[{d}], {picks}),")
    lines.append("    )")
    scope: dict[str, Any] = {"_new": _new_device_usage}
    exec("\n".join(lines), scope)  # our own field names and integers only
    build: Callable[..., tuple[DeviceUsage, ...]] = scope["build"]
    return build


def _slot_format(layout: Layout, picks: list[tuple[int, str]]) -> str:
    """A ``struct`` format (no byte-order prefix) spanning exactly one slot that reads the
    ``(offset, code)`` picks, which must be in ascending order, and skips the rest."""
    fmt, pos = "", 0
    for offset, code in picks:
        if offset < pos:  # pragma: no cover - the layouts put these in ascending order
            raise AssertionError(f"{layout.name} slot fields out of order at {offset}")
        fmt += f"{offset - pos}x{code}" if offset > pos else code
        pos = offset + struct.calcsize(code)
    return fmt + f"{layout.slot_size - pos}x"


def _version(layout: Layout, head: bytes | bytearray | memoryview) -> tuple[int | None, int | None]:
    if not layout.has_version:
        return (None, None)
    _, major, minor = HEADER.unpack_from(head)
    return (major, minor)


def _new_snapshot(
    layout: Layout,
    file_size: int,
    version: tuple[int | None, int | None],
    values: TailValues,
    static: StaticInfo,
    devices: tuple[DeviceUsage, ...],
    totals: _Totals,
) -> UsageSnapshot:
    # positional, in field order (see UsageSnapshot), the tail's fields from the tail
    return _new_usage_snapshot(
        layout.format,
        version[0],
        version[1],
        file_size,
        static.device_count,
        values,
        totals.active_slots,
        devices,
        static.uuids,
        static.device_keys,
        totals.pids,
        totals.host_pids,
        totals.device_processes,
    )


class _Totals(NamedTuple):
    """What the live slots add up to (:class:`SlotTotals` without the device objects).
    Made with ``_tuple_new(_Totals, values)``: no Python ``__new__`` per decode."""

    sums: tuple[int, ...]  # uint64, wrapping; where each is: _SlotPlan
    active_slots: int
    pids: tuple[int, ...]
    host_pids: tuple[int, ...]
    device_processes: tuple[int, ...]  # per device, the live slots using it


#: The slots of a region are unpacked with one ``struct`` call when they hold at most this
#: many fields in all (8 slots on 2 devices: 120); more go through ``iter_unpack`` and a
#: transposition.  Bounds what one cached ``struct`` costs (about 32 bytes a field).
FLAT_FIELDS = 512
#: How many of those ``struct`` s are kept (least recently used first out): a tenant
#: cycling ``proc_num`` and ``num`` through every value costs a rebuild, not memory.
FLAT_STRUCTS = 64


@functools.lru_cache(maxsize=FLAT_STRUCTS)
def _flat_structs(fmt: Format, device_count: int, slots: int) -> tuple[struct.Struct, ...]:
    """The two ``struct`` s of :func:`_slot_fields` over ``slots`` consecutive slots (one
    slot's picks repeated ``slots`` times), so one ``unpack_from`` each gives them all."""
    return tuple(struct.Struct("<" + one * slots) for one in _slot_plan(fmt, device_count).formats)


_Fields = tuple[tuple[int, ...], tuple[int, ...]]


def _slot_fields(
    layout: Layout, head: bytes | bytearray | memoryview, slots: int, plan: _SlotPlan
) -> _Fields:
    """The fields the monitor uses from slots ``[0, slots)`` of ``head``, in two flat tuples,
    slot after slot, as ``plan`` (of this layout) lays them out: the memory words and the
    rest.  Apart because memory moves far less often than utilisation: unchanged memory
    words keep their sums.  One ``struct`` call each for a few slots (the usual case),
    ``iter_unpack`` for many."""
    count = len(plan.total)
    if slots * (plan.memory_width + plan.other_width) <= FLAT_FIELDS:
        memory, other = _flat_structs(layout.format, count, slots)
        return memory.unpack_from(head, layout.procs), other.unpack_from(head, layout.procs)
    body = memoryview(head)[layout.procs : layout.body_size(slots)]
    chain = itertools.chain.from_iterable
    memory, other = _flat_structs(layout.format, count, 1)  # one slot each
    return tuple(chain(memory.iter_unpack(body))), tuple(chain(other.iter_unpack(body)))


def _slots_key(flat: tuple[int, ...]) -> tuple[int, int]:
    """What the decoder keeps of some slot fields to tell a change: their tuple hash and
    their plain sum.  An int hashes to itself modulo 2**61 - 1, so two u64 values that far
    apart hash alike; the sum tells them apart, so a change the key misses must move two
    fields by multiples of 2**61 - 1 that cancel out - a tenant's own doing (it can write any
    values into its own slots anyway), never an accident of real counters."""
    return hash(flat), sum(flat)


#: The memory part of a region's totals: the memory sums (5 per device) and, per device,
#: whether some live slot has no memory on it.  Reused while the memory words are unchanged
#: and every slot is live.
_MemoryTotals = tuple[tuple[int, ...], tuple[bool, ...]]


def _column_sums(flat: tuple[int, ...], starts: Iterable[int], width: int) -> tuple[int, ...]:
    """The sums (uint64, wrapping) of the columns at ``starts`` of slots laid out flat,
    ``width`` fields each: a slice per column, summed in C."""
    sums = tuple([sum(flat[k::width]) for k in starts])
    if max(sums, default=0) > _MASK64:
        sums = tuple([value & _MASK64 for value in sums])
    return sums


def _only(fields: _Fields, plan: _SlotPlan, slots: list[int]) -> _Fields:
    """The fields of ``slots`` (indices, ascending) alone."""
    memory, other = fields
    words, width = plan.memory_width, plan.other_width
    chain = itertools.chain.from_iterable
    return (
        tuple(chain([memory[i * words : (i + 1) * words] for i in slots])),
        tuple(chain([other[i * width : (i + 1) * width] for i in slots])),
    )


def _flat_totals(
    fields: _Fields, plan: _SlotPlan, memory_totals: _MemoryTotals | None = None
) -> tuple[_Totals, _MemoryTotals | None]:
    """What the slots of :func:`_slot_fields` add up to: each column is a slice of a flat
    tuple, summed in C; no tuple per slot.

    ``memory_totals`` are those of the same memory words when the caller knows them
    unchanged (used only while every slot is live).  Returns the totals and the memory part
    to keep (None when some slot is not live: it depends on which)."""
    width, words = plan.other_width, plan.memory_width
    status = fields[1][plan.status :: width]
    every_slot_live = 0 not in status
    if not every_slot_live:  # exited slots between live ones: leave them out
        fields = _only(fields, plan, [i for i, word in enumerate(status) if word])
        memory_totals = None
    memory, other = fields
    live = len(other) // width
    if not live:
        return _tuple_new(_Totals, (plan.zero_sums, 0, (), (), plan.zero_busy)), None
    if memory_totals is None:
        sums = _column_sums(memory, range(words), words)
        # a device every live slot has memory on is used by all of them (the usual case)
        idle = tuple([0 in memory[total::words] for total in plan.total])
        memory_totals = (sums, idle)
    sums, idle = memory_totals
    util = _column_sums(other, plan.util_columns, width)
    total, sm_util = plan.total, plan.sm_util
    busy = tuple(
        [
            live
            if not idle[d]
            else live
            - list(map(operator.or_, memory[total[d] :: words], other[sm_util[d] :: width])).count(
                0
            )
            for d in plan.devices
        ]
    )
    pids, host_pids = other[plan.pid :: width], other[plan.hostpid :: width]
    totals = _tuple_new(_Totals, (sums + util, live, pids, host_pids, busy))
    return totals, memory_totals if every_slot_live else None


def _devices(sums: tuple[int, ...], static: StaticInfo, plan: _SlotPlan) -> tuple[DeviceUsage, ...]:
    return plan.build_devices(sums, static.uuids, static.limits, static.sm_limits)


def sum_slots_without(
    layout: Layout,
    head: bytes | bytearray | memoryview,
    slots: int,
    host_pids: frozenset[int],
) -> SlotTotals:
    """The sums of the snapshot's slots leaving out those whose host PID is in
    ``host_pids`` (the exited processes, for ``--exclude-exited-processes``): what
    :class:`RegionDecoder` would sum from ``head`` without them.

    Args:
        layout: the file's layout.
        head: bytes from offset 0 through at least ``layout.body_size(slots)``; the device
            count, UUIDs and limits are decoded from it too.
        slots: the clamped ``proc_num``.
        host_pids: the host PIDs whose slots are left out.

    Raises:
        ValueError: ``head`` is too short for ``slots`` slots.
    """
    end = layout.body_size(slots)
    if len(head) < end:
        raise ValueError(f"head needs {end} bytes for {slots} slots, got {len(head)}")
    static = parse_static(layout, head)
    plan = _slot_plan(layout.format, static.device_count)
    fields = _slot_fields(layout, head, slots, plan)
    slot_host_pids = fields[1][plan.hostpid :: plan.other_width]
    kept = [i for i, pid in enumerate(slot_host_pids) if pid not in host_pids]
    totals, _ = _flat_totals(_only(fields, plan, kept), plan)
    return SlotTotals(
        _devices(totals.sums, static, plan),
        totals.active_slots,
        totals.pids,
        totals.host_pids,
        totals.device_processes,
    )


def _wrong_length(want: int, data: bytes) -> NoReturn:
    """A decoder was fed other than the range it asked for."""
    if want < 0:
        raise ValueError("no range was asked for: call start() first")
    raise ValueError(f"asked for {want} bytes, got {len(data)}")


def _refuse_header(size: int, header: bytes) -> NoReturn:
    """A size no layout fits: the loader rule's rejection, naming what the header holds."""
    classify(size, header)  # raises
    raise AssertionError("classify accepted a size layout_for_size refused")


class _Decoded:
    """What the last snapshot was derived from, to tell whether anything changed."""

    __slots__ = (
        "devices",
        "head_size",
        "header",
        "layout",
        "memory_key",
        "memory_totals",
        "other_key",
        "plan",
        "size",
        "snapshot",
        "static",
        "static_bytes",
        "tail",
        "totals",
        "values",
        "version",
    )

    def __init__(
        self,
        size: int,
        header: bytes,
        static_bytes: bytes,
        tail: bytes,
        values: TailValues,
        head_size: int,
        layout: Layout,
        static: StaticInfo,
        plan: _SlotPlan,
        keys: tuple[tuple[int, int], tuple[int, int]],
        memory_totals: _MemoryTotals | None,
        totals: _Totals,
        devices: tuple[DeviceUsage, ...],
        snapshot: UsageSnapshot,
    ) -> None:
        self.size = size
        self.header = header
        self.static_bytes = static_bytes
        self.tail = tail
        self.values = values
        self.head_size = head_size
        self.layout = layout
        self.static = static
        self.plan = plan
        self.memory_key, self.other_key = keys
        self.memory_totals = memory_totals
        self.totals = totals
        self.devices = devices
        self.snapshot = snapshot
        self.version = (snapshot.major, snapshot.minor)


class RegionDecoder:
    """Decodes one region, read after read, from the byte ranges it asks for (pure).

    One decode is a short conversation; the caller does the reading::

        step = decoder.start(size)              # (offset, length) to read first
        while isinstance(step, tuple):
            step = decoder.feed(read(*step))    # the next range, or the snapshot

    For a file size that has a layout the decoder asks for the tail, then for the head up to
    the live slots the tail's ``proc_num`` names (clamped to 1024): two ranges inside a file
    of that size.  For a size no layout fits it asks for the 12-byte header only to name what
    it holds in the rejection (below 12 bytes it asks for nothing).  A range the caller
    cannot read in full ends that decode (the caller raises); the next :meth:`start` begins
    afresh.

    Change detection is inside: the decoder keeps the magic, the version and the static part
    of the head (``num``, UUIDs, limits: ~1.8 KB; not the lock words HAMi-core's processes
    rewrite all the time), the tail, and a key of the live slots' fields with what they
    added up to (sums, PIDs, processes per device) - not the slots or the head.  While the
    size, header and static part are unchanged only the slots are unpacked again (for a few
    slots, one ``struct`` call per part) and summed where their key changed, memory apart
    from the rest; equal totals keep the snapshot's slot part, equal sums the device
    objects.  The snapshot is the same object as last time when nothing it holds changed,
    and only the tail is decoded anew when only the tail moved.
    """

    __slots__ = ("_decoded", "_layout", "_pending", "_size", "_tail", "_values", "_want")

    def __init__(self) -> None:
        self._decoded: _Decoded | None = None
        self._layout: Layout | None = None
        # The decode in progress: the length of the range asked for (-1: none), the size and
        # candidate layout (None: no layout fits, the header comes next), and once the tail
        # was fed, the tail and its decoded values.
        self._want = -1
        self._size = 0
        self._pending: Layout | None = None
        self._tail: bytes | None = None
        self._values: TailValues | None = None

    @property
    def layout(self) -> Layout | None:
        """The layout of the latest decode if it succeeded, else None (also mid-decode)."""
        return self._layout

    @property
    def size(self) -> int | None:
        """The file size of the latest successful decode (None before the first one)."""
        decoded = self._decoded
        return None if decoded is None else decoded.size

    def start(self, size: int) -> tuple[int, int]:
        """Begin decoding a file of ``size`` bytes: the first ``(offset, length)`` to read.

        Raises:
            CacheFileRejected: ``too_small`` (no layout fits and there is no header to read).
        """
        self._layout = None
        self._size = size
        self._tail = None  # _values is only read once a tail was fed
        decoded = self._decoded
        if decoded is not None and decoded.size == size:
            candidate: Layout | None = decoded.layout  # the layout is a function of the size
        else:
            candidate = layout_for_size(size)
        self._pending = candidate
        if candidate is None:
            self._want = -1
            if size < HEADER_SIZE:
                classify(size, b"")  # raises too_small
                raise AssertionError("classify accepted a size layout_for_size refused")
            self._want = HEADER_SIZE
            return (0, HEADER_SIZE)
        self._want = candidate.tail_size
        return (candidate.tail_offset, candidate.tail_size)

    def feed(self, data: bytes) -> tuple[int, int] | UsageSnapshot:
        """Take the bytes of the range last asked for: the next range, or the snapshot.

        Raises:
            CacheFileRejected: the loader rule rejects the file (the message names the size
                and what the header holds).
            ValueError: ``data`` is not as long as the range asked for, or nothing was.
        """
        if len(data) != self._want:
            _wrong_length(self._want, data)
        layout = self._pending
        if layout is None:
            self._want = -1
            _refuse_header(self._size, data)
        tail = self._tail
        if tail is None:
            self._tail = data
            decoded = self._decoded
            if decoded is not None and decoded.layout is layout and decoded.tail == data:
                self._values = decoded.values
                self._want = length = decoded.head_size
            else:
                fed = self._values = read_tail(layout, data)
                self._want = length = layout.body_size(clamp_proc_num(fed[_PROC_NUM]))
            return (0, length)
        # the head: decode it (one method, not several: this runs per container per tick)
        values = self._values
        assert values is not None
        self._want = -1
        self._tail = None
        head, size, decoded = data, self._size, self._decoded
        if (
            decoded is not None
            and decoded.size == size
            and head.startswith(decoded.header)
            and head.startswith(decoded.static_bytes, layout.num)
        ):
            # The magic, the version and the static part are the bytes the kept snapshot
            # came from (the lock HAMi-core's processes take in between - sem, owner_pid -
            # may have moved: nothing is read from it); head is exactly the live slots long.
            static, plan = decoded.static, decoded.plan
            fields = _slot_fields(layout, head, clamp_proc_num(values[_PROC_NUM]), plan)
            memory_key, other_key = _slots_key(fields[0]), _slots_key(fields[1])
            renew = tail != decoded.tail
            if memory_key != decoded.memory_key or other_key != decoded.other_key:
                kept = decoded.memory_totals if memory_key == decoded.memory_key else None
                decoded.memory_key, decoded.other_key = memory_key, other_key
                totals, decoded.memory_totals = _flat_totals(fields, plan, kept)
                if totals != decoded.totals:
                    if totals.sums != decoded.totals.sums:
                        decoded.devices = _devices(totals.sums, static, plan)
                    decoded.totals = totals
                    renew = True
            if renew:
                decoded.tail = tail
                decoded.values = values
                decoded.head_size = len(head)
                decoded.snapshot = _new_snapshot(
                    layout, size, decoded.version, values, static, decoded.devices, decoded.totals
                )
            self._layout = layout
            return decoded.snapshot
        layout = classify(size, head)
        slots = clamp_proc_num(values[_PROC_NUM])
        static = parse_static(layout, head)
        if decoded is not None and decoded.static == static:
            static = decoded.static  # keep the objects (and identities) the view already has
        plan = _slot_plan(layout.format, static.device_count)
        fields = _slot_fields(layout, head, slots, plan)
        totals, memory_totals = _flat_totals(fields, plan)
        devices = _devices(totals.sums, static, plan)
        version = _version(layout, head)
        snapshot = _new_snapshot(layout, size, version, values, static, devices, totals)
        self._decoded = _Decoded(
            size,
            head[: HEADER_SIZE if layout.has_version else _MAGIC_SIZE],
            head[layout.num : layout.procs],
            tail,
            values,
            len(head),
            layout,
            static,
            plan,
            (_slots_key(fields[0]), _slots_key(fields[1])),
            memory_totals,
            totals,
            devices,
            snapshot,
        )
        self._layout = layout
        return snapshot


def parse_region(
    data: bytes | bytearray | memoryview, file_size: int | None = None
) -> UsageSnapshot:
    """Parse a whole ``.cache`` file held in memory: a fresh :class:`RegionDecoder` fed the
    ranges it asks for from ``data`` (the loader rule, then the snapshot).

    Args:
        data: the file's bytes (a real file is ``sizeof + 1``).
        file_size: the size to classify by; defaults to ``len(data)``.

    Raises:
        CacheFileRejected: the loader rule rejects the file.
        ValueError: ``data`` ends before a range the decoder asks for at ``file_size``.
    """
    size = len(data) if file_size is None else file_size
    decoder = RegionDecoder()
    step: tuple[int, int] | UsageSnapshot = decoder.start(size)
    while isinstance(step, tuple):
        offset, length = step
        if offset + length > len(data):
            raise ValueError(f"data needs {offset + length} bytes, got {len(data)}")
        step = decoder.feed(bytes(data[offset : offset + length]))
    return step


#: Ticks after which the tick re-reads a region's static head (device count, UUIDs, limits)
#: even when nothing else says it changed: a tenant that rewrites its own UUIDs is seen within
#: this many ticks (a minute at the default 5 s interval).  Each decoder starts at its own
#: phase, so about one in this many regions re-reads its head on any one tick.
STATIC_REFRESH_TICKS = 12


@dataclass(frozen=True, slots=True)
class TickSnapshot:
    """What the monitor's tick reads of one region: the tail's words and the static head.

    The feedback needs nothing else (``priority``, ``recent_kernel``,
    ``utilization_switch`` and the device UUIDs).  Memory, utilisation and the process
    slots are the usage read's (:class:`UsageSnapshot`).  ``device_keys`` are the raw bytes
    of the valid UUID slots, in slot order (HAMi's device identity for Observe); ``uuids``
    has all 16 slots.  ``major``/``minor`` are None for v0.
    """

    format: Format
    major: int | None
    minor: int | None
    file_size: int
    device_count: int
    proc_num: int
    priority: int
    recent_kernel: int
    utilization_switch: int
    last_kernel_time: int
    uuids: tuple[DeviceUUID, ...]
    device_keys: tuple[bytes, ...]


_new_tick_snapshot: Callable[..., TickSnapshot] = _constructor(TickSnapshot, tail=True)


class TickDecoder:
    """Decodes the tick's part of one region, tick after tick (pure).

    The conversation is :class:`RegionDecoder`'s: :meth:`start` names the tail range,
    :meth:`feed` takes its bytes and returns the snapshot, or asks for the static head
    (``[0, layout.procs)``: magic, version, device count, UUIDs, limits) first.  The head is
    asked for, and the loader rule applied to it, when there is no decoded head for this
    size yet (the first read, a changed size, a failed decode), when ``proc_num`` went from 0
    to more or back (HAMi-core (re-)initialises a region with no process attached), and at
    least every :data:`STATIC_REFRESH_TICKS` ticks otherwise.  In between, one tail read is
    the whole read: a tenant that rewrites its own head meanwhile changes only its own
    feedback, for at most that many ticks.  The same snapshot object comes back while the
    tail and the head are unchanged.

    Args:
        phase: where in the refresh cycle this decoder starts (spreads the head re-reads of
            many regions over the ticks); taken modulo :data:`STATIC_REFRESH_TICKS`.
        refresh_every: ticks between two head reads at most (>= 1).
    """

    __slots__ = (
        "_age",
        "_every",
        "_kept_head",
        "_kept_static",
        "_last",
        "_layout",
        "_pending",
        "_published",
        "_size",
        "_snapshot",
        "_static",
        "_tail",
        "_values",
        "_version",
        "_want",
    )

    def __init__(self, phase: int = 0, refresh_every: int = STATIC_REFRESH_TICKS) -> None:
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1 tick, got {refresh_every}")
        self._every = refresh_every
        self._age = phase % refresh_every
        self._layout: Layout | None = None  # set while the latest decode succeeded
        self._size = -1  # the size the kept head was decoded at (-1: none kept)
        self._static: StaticInfo | None = None
        # The head bytes last decoded at this size and what they gave: a refresh that finds
        # the same bytes (the usual case) decodes nothing.
        self._kept_head: tuple[bytes] | None = None
        self._kept_static: StaticInfo | None = None
        self._version: tuple[int | None, int | None] = (None, None)
        # The tail bytes last read and what they decoded to; the tail the kept snapshot has.
        self._tail = b""
        self._last: TailValues | None = None
        self._published: TailValues | None = None
        self._snapshot: TickSnapshot | None = None
        self._pending: Layout | None = None
        self._values: TailValues | None = None
        self._want = -1

    @property
    def layout(self) -> Layout | None:
        """The layout of the latest decode if it succeeded, else None (also mid-decode)."""
        return self._layout

    @property
    def size(self) -> int | None:
        """The file size of the latest successful decode (None before the first one)."""
        return None if self._layout is None else self._size

    def start(self, size: int) -> tuple[int, int]:
        """Begin a decode of a file of ``size`` bytes: the tail range ``(offset, length)``.

        Raises:
            CacheFileRejected: ``too_small`` (no layout fits and there is no header).
        """
        self._layout = None
        if size != self._size:
            self._static = None  # another size: the head is decoded afresh
            self._kept_head = self._kept_static = None
            self._size = size
            self._pending = layout_for_size(size)
        layout = self._pending
        if layout is None:
            self._static = None
            if size < HEADER_SIZE:
                self._want = -1
                classify(size, b"")  # raises too_small
                raise AssertionError("classify accepted a size layout_for_size refused")
            self._want = HEADER_SIZE
            return (0, HEADER_SIZE)
        self._values = None
        self._want = layout.tail_size
        return (layout.tail_offset, layout.tail_size)

    def feed(self, data: bytes) -> tuple[int, int] | TickSnapshot:
        """Take the bytes of the range last asked for: the head range, or the snapshot.

        Raises:
            CacheFileRejected: the loader rule rejects the file (at a head read).
            ValueError: ``data`` is not as long as the range asked for, or nothing was.
        """
        if len(data) != self._want:
            _wrong_length(self._want, data)
        layout = self._pending
        if layout is None:
            self._want = -1
            _refuse_header(self._size, data)
        values = self._values
        if values is None:  # the tail
            # the refresh cycle runs on, whatever else made the head be read
            age = self._age = (self._age + 1) % self._every
            if data == self._tail and self._static is not None and age:
                self._want = -1
                self._layout = layout
                snapshot = self._snapshot
                assert snapshot is not None
                return snapshot
            values = self._values = read_tail(layout, data)
            last = self._last
            self._tail, self._last = data, values
            if (
                self._static is None
                or not age
                or (last is not None and (values[_PROC_NUM] == 0) != (last[_PROC_NUM] == 0))
            ):
                self._static = None
                self._want = layout.procs
                return (0, layout.procs)
            return self._publish(layout, values)
        # the static head
        self._want = -1
        kept_head = self._kept_head
        if kept_head is not None and data == kept_head[0] and self._kept_static is not None:
            # The very bytes the kept head came from (their loader-rule verdict too).
            self._static = self._kept_static
            return self._publish(layout, values)
        layout = classify(self._size, data)
        static = parse_static(layout, data)
        kept = self._snapshot
        if kept is not None and kept.uuids == static.uuids:
            static = dataclasses.replace(static, uuids=kept.uuids, device_keys=kept.device_keys)
        self._static = self._kept_static = static
        self._kept_head = (data,)
        self._version = _version(layout, data)
        return self._publish(layout, values)

    def _publish(self, layout: Layout, values: TailValues) -> TickSnapshot:
        static = self._static
        assert static is not None
        self._values = None
        self._layout = layout
        kept = self._snapshot
        if (
            kept is not None
            and self._published == values
            and kept.file_size == self._size
            and kept.device_keys is static.device_keys
            and kept.device_count == static.device_count
            and (kept.major, kept.minor) == self._version
            and kept.format is layout.format
        ):
            return kept
        major, minor = self._version
        self._published = values
        # positional, in field order (see TickSnapshot), the tail's fields from the tail
        snapshot = self._snapshot = _new_tick_snapshot(
            layout.format,
            major,
            minor,
            self._size,
            static.device_count,
            values,
            static.uuids,
            static.device_keys,
        )
        return snapshot
