"""Hypothesis strategies for HAMi-core shared regions (``.cache`` files).

Used by ``tests/monitor`` and the fuzz campaign.  Three families:

- :func:`sizes_and_headers`: any file size with any 12-byte header, biased towards the
  boundaries of the loader rule (v0/v1 sizes, +-1, the mis-layout, tiny files) and the
  interesting magic/major values;
- :func:`region_specs`: whole regions for :mod:`hami_trio.testing.regions`, valid in shape
  but with hostile values (``proc_num`` far outside 0..1024, ``num`` up to 2**64-1, priority
  extremes, random UUID bytes, random slot statuses);
- :func:`region_bytes`: the bytes of such a region, optionally with random byte flips, so a
  parser sees both plausible and corrupted files;
- :func:`region_files`: whole file contents: such a region cut or zero-extended to a size
  around the loader's boundaries, sometimes under a random header.
"""

from __future__ import annotations

from hypothesis import strategies as st

from hami_trio.monitor.layout import (
    LAYOUTS,
    MAGIC,
    MAX_DEVICES,
    MISLAYOUT_SIZES,
    UUID_SIZE,
    Format,
)
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, build_region

__all__ = [
    "INT32",
    "UINT64",
    "boundary_sizes",
    "proc_slots",
    "region_bytes",
    "region_files",
    "region_specs",
    "sizes_and_headers",
    "uuid_values",
]

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)

_V0 = LAYOUTS[Format.V0].sizeof
_V1 = LAYOUTS[Format.V1].sizeof


def boundary_sizes() -> st.SearchStrategy[int]:
    """File sizes around every edge of the loader rule, plus anything up to 4 MiB."""
    edges = [0, 1, 11, 12, 13, 64, _V0 - 1, _V0, _V0 + 1, _V1 - 1, _V1, _V1 + 1]
    edges += [*sorted(MISLAYOUT_SIZES), min(MISLAYOUT_SIZES) - 1, max(MISLAYOUT_SIZES) + 1]
    return st.one_of(st.sampled_from(edges), st.integers(min_value=0, max_value=4 << 20))


def sizes_and_headers() -> st.SearchStrategy[tuple[int, bytes]]:
    """``(size, header)`` where header is 12 bytes (or fewer when ``size < 12``)."""
    magic = st.one_of(st.just(MAGIC), INT32)
    major = st.one_of(st.sampled_from([0, 1, 2, -1]), INT32)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[int, bytes]:
        size = draw(boundary_sizes())
        header = (
            draw(magic).to_bytes(4, "little", signed=True)
            + draw(major).to_bytes(4, "little", signed=True)
            + draw(INT32).to_bytes(4, "little", signed=True)
        )
        return size, header[: min(size, 12)]

    return build()


def uuid_values() -> st.SearchStrategy[bytes]:
    """A UUID slot: a real-looking GPU UUID, empty, or arbitrary bytes (NULs and non-UTF-8)."""
    return st.one_of(
        st.builds(lambda i: f"GPU-{i:08x}-0000-4000-8000-000000000000".encode(), st.integers(0, 7)),
        st.just(b""),
        st.binary(max_size=UUID_SIZE),
    )


def proc_slots(devices: int = MAX_DEVICES) -> st.SearchStrategy[ProcSlot]:
    """A process slot with random usage on its first ``devices`` devices and any status."""
    return st.builds(
        ProcSlot,
        pid=INT32,
        hostpid=INT32,
        status=st.one_of(st.sampled_from([0, 1, 2]), INT32),
        used=st.lists(
            st.builds(
                MemoryUse,
                context_size=UINT64,
                module_size=UINT64,
                data_size=UINT64,
                offset=UINT64,
                total=UINT64,
            ),
            max_size=devices,
        ),
        util=st.lists(
            st.builds(UtilUse, dec_util=UINT64, enc_util=UINT64, sm_util=UINT64),
            max_size=devices,
        ),
    )


@st.composite
def region_specs(draw: st.DrawFn, fmt: Format | None = None) -> RegionSpec:
    """A whole region with hostile-but-typed values (see the module docstring)."""
    chosen = draw(st.sampled_from(list(Format))) if fmt is None else fmt
    slots = draw(st.lists(proc_slots(devices=3), max_size=12))
    return RegionSpec(
        format=chosen,
        major=1,
        minor=draw(st.sampled_from([1, 2])),
        num=draw(st.one_of(st.integers(0, 20), UINT64)),
        uuids=draw(st.lists(uuid_values(), max_size=MAX_DEVICES)),
        limits=draw(st.lists(UINT64, max_size=MAX_DEVICES)),
        sm_limits=draw(st.lists(UINT64, max_size=MAX_DEVICES)),
        procs=slots,
        proc_num=draw(
            st.one_of(st.none(), st.integers(-5, 16), st.sampled_from([1024, 1025, 2000]), INT32)
        ),
        utilization_switch=draw(st.one_of(st.sampled_from([0, 1]), INT32)),
        recent_kernel=draw(st.one_of(st.integers(-2, 3), INT32)),
        priority=draw(st.one_of(st.integers(-7, 5), st.just(2**31 - 1), INT32)),
        last_kernel_time=draw(UINT64) if chosen is Format.V1 else 0,
        trailing_nul=draw(st.booleans()),
    )


@st.composite
def region_bytes(draw: st.DrawFn) -> bytes:
    """The bytes of a :func:`region_specs` region, sometimes with a few random byte flips."""
    data = build_region(draw(region_specs()))
    for _ in range(draw(st.integers(0, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@st.composite
def region_files(draw: st.DrawFn) -> bytes:
    """A whole ``.cache`` file: a :func:`region_bytes` region resized to its own length or to
    a :func:`boundary_sizes` size (cut, or extended with zeros), and in half the cases with
    the header of :func:`sizes_and_headers` written over its first 12 bytes."""
    data = bytearray(draw(region_bytes()))
    size = draw(st.one_of(st.just(len(data)), boundary_sizes()))
    if size <= len(data):
        del data[size:]
    else:
        data.extend(bytes(size - len(data)))
    if size >= 12 and draw(st.booleans()):
        _, header = draw(sizes_and_headers().filter(lambda case: len(case[1]) == 12))
        data[:12] = header
    return bytes(data)
