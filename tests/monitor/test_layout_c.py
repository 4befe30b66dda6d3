"""Cross-checks against C: our own struct declarations (tests/monitor/c/region.c), gcc.

1. Every offset and size in ``hami_trio.monitor.layout`` equals ``offsetof``/``sizeof``.
2. Fixture files written by the C program are byte-identical to the Python builder's output
   for the same pattern, and the monitor reads from them exactly the sums the C program
   computed (uint64, over ``[0, clamp(proc_num))`` with status != 0): stale slots beyond
   ``proc_num`` ignored, status 0 excluded, ``proc_num`` -5 -> 0 and 2000 -> 1024,
   ``num`` 9999 -> 16 devices.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hami_trio.monitor.layout import (
    LAYOUTS,
    MAX_DEVICES,
    REGION_TABLE,
    SLOT_TABLE,
    USED_FIELDS,
    UTIL_FIELDS,
    Format,
)
from hami_trio.monitor.region import RegionHandle
from hami_trio.monitor.snapshot import UUIDState, parse_region
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    UtilUse,
    build_region,
    write_region,
)

SOURCE = Path(__file__).parent / "c" / "region.c"
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture(scope="module")
def region_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("c") / "region"
    subprocess.run(
        ["gcc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", binary, SOURCE],
        check=True,
        capture_output=True,
    )
    return binary


def test_offsets_and_sizes_match_gcc(region_tool: Path) -> None:
    out = subprocess.run([region_tool, "offsets"], check=True, capture_output=True, text=True)
    c_rows: dict[tuple[str, str, str], tuple[int, int]] = {}
    for line in out.stdout.splitlines():
        c_fmt, c_table, c_member, c_offset, c_size = line.split()
        c_rows[(c_fmt, c_table, c_member)] = (int(c_offset), int(c_size))

    py_rows: dict[tuple[str, str, str], tuple[int, int]] = {}
    for table_name, table in (("region", REGION_TABLE), ("slot", SLOT_TABLE)):
        for member, off0, size0, off1, size1 in table:
            for fmt, off, size in (("v0", off0, size0), ("v1", off1, size1)):
                if size is not None:
                    py_rows[(fmt, table_name, member)] = (off or 0, size)
    for fmt in ("v0", "v1"):
        layout = LAYOUTS[Format(fmt)]
        for member, off in USED_FIELDS.items():
            py_rows[(fmt, "used", member)] = (off, 8)
        for member, off in UTIL_FIELDS.items():
            py_rows[(fmt, "util", member)] = (off, 8)
        # the derived fast-path layout agrees with the table too
        assert c_rows[(fmt, "region", "sizeof")][1] == layout.sizeof
        assert c_rows[(fmt, "slot", "sizeof")][1] == layout.slot_size
        assert c_rows[(fmt, "region", "procs")][0] == layout.procs
        assert c_rows[(fmt, "slot", "status")][0] == layout.slot_status
        assert c_rows[(fmt, "slot", "used")][1] == layout.used_stride * MAX_DEVICES
        assert c_rows[(fmt, "slot", "device_util")][1] == layout.util_stride * MAX_DEVICES
        assert c_rows[(fmt, "region", "recent_kernel")][0] == layout.recent_kernel
        assert c_rows[(fmt, "region", "utilization_switch")][0] == layout.utilization_switch
    assert py_rows == c_rows


def pattern_spec(fmt: Format, num: int, proc_num: int, nslots: int) -> RegionSpec:
    """The fixture pattern of region.c, built with the Python builder."""
    devices = min(num, MAX_DEVICES)
    uuids: list[str | bytes] = [
        b"\xff\xfex" if d == 3 else f"GPU-fixture-{d:02d}-0000-4000-8000-00000000{d:04d}"
        for d in range(devices)
    ]
    slots = []
    for s in range(nslots):
        used = [
            MemoryUse(
                context_size=s * 1000 + d * 10 + 1,
                module_size=s * 1000 + d * 10 + 2,
                data_size=s * 1000 + d * 10 + 3,
                offset=s * 1000 + d * 10 + 4,
                total=(2**64 - 1 - 2) if (s, d) == (0, 0) else s * 1_000_000 + d * 1000 + 5,
            )
            for d in range(MAX_DEVICES)
        ]
        slots.append(
            ProcSlot(
                pid=100 + s,
                hostpid=1000 + s,
                status=0 if s % 4 == 3 else (2 if s % 4 == 2 else 1),
                used=used,
                util=[
                    UtilUse(dec_util=s, enc_util=d, sm_util=(s * 7 + d) % 101)
                    for d in range(MAX_DEVICES)
                ],
                monitorused=[s + d for d in range(MAX_DEVICES)],
                seqlock=2 * s if fmt is Format.V1 else 0,
            )
        )
    return RegionSpec(
        format=fmt,
        major=1,
        minor=2,
        sm_init_flag=1,
        owner_pid=4242,
        num=num,
        uuids=uuids,
        limits=[(d + 1) << 30 for d in range(devices)],
        sm_limits=[5 * (d + 1) for d in range(devices)],
        procs=slots,
        proc_num=proc_num,
        utilization_switch=1,
        recent_kernel=2,
        priority=7,
        last_kernel_time=1_700_000_000 if fmt is Format.V1 else 0,
    )


CASES = [
    pytest.param(Format.V1, 2, 5, 8, id="v1-stale-slots-beyond-proc_num"),
    pytest.param(Format.V1, 2, -5, 8, id="v1-proc_num-negative"),
    pytest.param(Format.V1, 3, 2000, 12, id="v1-proc_num-2000"),
    pytest.param(Format.V1, 9999, 6, 6, id="v1-num-9999"),
    pytest.param(Format.V0, 4, 7, 10, id="v0-stale-slots"),
    pytest.param(Format.V0, 9999, 2000, 12, id="v0-num-9999-proc_num-2000"),
]


@pytest.mark.parametrize(("fmt", "num", "proc_num", "nslots"), CASES)
def test_c_fixture_equals_python_builder_and_sums_match(
    region_tool: Path, tmp_path: Path, fmt: Format, num: int, proc_num: int, nslots: int
) -> None:
    c_file = tmp_path / "c.cache"
    out = subprocess.run(
        [region_tool, "write", fmt.value, c_file, str(num), str(proc_num), str(nslots)],
        check=True,
        capture_output=True,
        text=True,
    )
    spec = pattern_spec(fmt, num, proc_num, nslots)
    c_bytes = c_file.read_bytes()
    assert len(c_bytes) == LAYOUTS[fmt].sizeof + 1
    assert c_bytes == bytes(build_region(spec))
    sparse = tmp_path / "py.cache"
    write_region(sparse, spec)
    assert sparse.read_bytes() == c_bytes

    expected_active = 0
    expected: list[tuple[int, ...]] = []
    for line in out.stdout.splitlines():
        words = line.split()
        if words[0] == "active":
            expected_active = int(words[1])
        else:
            expected.append(tuple(int(w) for w in words[1:]))

    handle = RegionHandle.open_path(c_file, writable=False)
    try:
        snapshot = handle.read_usage()
    finally:
        handle.close()
    assert snapshot == parse_region(c_bytes)
    assert snapshot.format is fmt
    assert snapshot.proc_num == proc_num
    assert snapshot.active_slots == expected_active
    assert snapshot.device_count == min(num, MAX_DEVICES)
    got = [
        (d.index, d.memory_total, d.context_size, d.module_size, d.buffer_size, d.offset, d.sm_util)
        for d in snapshot.devices
    ]
    assert got == expected
    assert snapshot.priority == 7
    assert snapshot.recent_kernel == 2
    assert snapshot.utilization_switch == 1
    assert snapshot.last_kernel_time == (1_700_000_000 if fmt is Format.V1 else 0)
    assert [d.memory_limit for d in snapshot.devices] == [(d + 1) << 30 for d in range(len(got))]
    if snapshot.device_count > 3:
        assert snapshot.devices[3].uuid.state is UUIDState.INVALID_UTF8
        assert snapshot.devices[3].uuid.text is None
    assert snapshot.devices[0].uuid.text == "GPU-fixture-00-0000-4000-8000-000000000000"


def test_stale_slots_and_exited_slots_are_not_summed(region_tool: Path, tmp_path: Path) -> None:
    # proc_num 5 of 8 written slots: slots 5..7 are stale; slot 3 has status 0.
    path = tmp_path / "x.cache"
    subprocess.run(
        [region_tool, "write", "v1", path, "1", "5", "8"], check=True, capture_output=True
    )
    snapshot = parse_region(path.read_bytes())
    live = [0, 1, 2, 4]
    assert snapshot.active_slots == len(live)
    assert snapshot.devices[0].sm_util == sum((s * 7) % 101 for s in live)
    assert snapshot.devices[0].context_size == sum(s * 1000 + 1 for s in live)
    # slot 0's huge total wraps the uint64 sum, as in C
    assert (
        snapshot.devices[0].memory_total
        == (2**64 - 3 + sum(s * 1_000_000 + 5 for s in live[1:])) % 2**64
    )
