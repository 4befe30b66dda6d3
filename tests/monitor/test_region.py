"""RegionHandle: safe open, bounded reads, guarded single-word writes; usage snapshot fields."""

from __future__ import annotations

import os
import stat
import struct
import tracemalloc
from pathlib import Path

import pytest

from hami_trio._fs import file_kind
from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import LAYOUTS, ControlField, Format, RejectReason
from hami_trio.monitor.region import RegionHandle, read_region_file
from hami_trio.monitor.snapshot import DeviceUUID, UUIDState, parse_region
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    build_region,
    write_region,
)

V1 = LAYOUTS[Format.V1]
V0 = LAYOUTS[Format.V0]


def spec(**changes: object) -> RegionSpec:
    base: dict[str, object] = {
        "num": 2,
        "uuids": ["GPU-aaaa", "GPU-bbbb"],
        "limits": [1 << 30, 2 << 30],
        "sm_limits": [30, 40],
        "procs": [
            ProcSlot(
                pid=1,
                used=[MemoryUse(total=10, context_size=1), MemoryUse(total=20)],
                util=[UtilUse(sm_util=5), UtilUse(sm_util=6)],
            ),
            ProcSlot(pid=2, used=[MemoryUse(total=100)], util=[UtilUse(sm_util=7)]),
        ],
        "priority": 3,
        "recent_kernel": 2,
        "last_kernel_time": 1_700_000_123,
    }
    base.update(changes)
    return RegionSpec(**base)  # type: ignore[arg-type]


def open_rw(path: Path) -> RegionHandle:
    return RegionHandle.open_at(None, os.fspath(path), display=os.fspath(path))


def rejection(path: Path, *, writable: bool = True) -> CacheFileRejected:
    with pytest.raises(CacheFileRejected) as info:
        RegionHandle.open_at(None, os.fspath(path), display="x.cache", writable=writable)
    return info.value


# -- snapshot content ------------------------------------------------------------------------


def test_snapshot_fields(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    snapshot = read_region_file(path)
    assert snapshot.format is Format.V1
    assert (snapshot.major, snapshot.minor) == (1, 2)
    assert snapshot.file_size == V1.sizeof + 1
    assert (snapshot.device_count, snapshot.proc_num, snapshot.active_slots) == (2, 2, 2)
    assert (snapshot.priority, snapshot.recent_kernel, snapshot.utilization_switch) == (3, 2, 0)
    assert snapshot.last_kernel_time == 1_700_000_123
    d0, d1 = snapshot.devices
    assert (d0.memory_total, d0.context_size, d0.sm_util, d0.memory_limit, d0.sm_limit) == (
        110,
        1,
        12,
        1 << 30,
        30,
    )
    assert (d1.memory_total, d1.sm_util, d1.memory_limit) == (20, 6, 2 << 30)
    assert d0.uuid.text == "GPU-aaaa"
    assert d0.uuid.label == "GPU-aaaa"


@pytest.mark.parametrize(
    ("raw", "state", "text", "label"),
    [
        (b"", UUIDState.UNUSED, None, None),
        (b"\0GPU-hidden", UUIDState.UNUSED, None, None),
        (b"GPU-1\0garbage", UUIDState.VALID, "GPU-1", "GPU-1garbage"),
        (b"\xff\xfe", UUIDState.INVALID_UTF8, None, None),
        ("GPU-\u00e9".encode(), UUIDState.VALID, "GPU-\u00e9", "GPU-\u00e9"),
        (b"G" * 39 + "\u00e9".encode(), UUIDState.VALID, "G" * 39 + "\u00e9", None),
    ],
)
def test_uuid_decoding(raw: bytes, state: UUIDState, text: str | None, label: str | None) -> None:
    uuid = DeviceUUID.from_raw(raw.ljust(96, b"\0"))
    assert uuid.state is state
    assert uuid.text == text
    assert uuid.label == label  # upstream label: first 40 bytes, NULs removed, UTF-8 or None
    assert uuid.valid is (state is not UUIDState.UNUSED)
    assert "DeviceUUID(" in repr(uuid)
    with pytest.raises(ValueError, match="96 bytes"):
        DeviceUUID.from_raw(raw[:10])


def test_num_clamped_and_uuid_slots_beyond_num_kept_for_feedback() -> None:
    snapshot = parse_region(build_region(spec(num=9999, uuids=["a"] * 16)))
    assert snapshot.device_count == 16
    small = parse_region(build_region(spec(num=1, uuids=["GPU-a", "GPU-b"])))
    assert small.device_count == 1
    assert len(small.uuids) == 16
    assert small.device_keys == (b"GPU-a".ljust(96, b"\0"), b"GPU-b".ljust(96, b"\0"))


def test_v0_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec(format=Format.V0, last_kernel_time=0))
    snapshot = read_region_file(path)
    assert snapshot.format is Format.V0
    assert (snapshot.major, snapshot.minor, snapshot.last_kernel_time) == (None, None, 0)
    assert snapshot.devices[0].memory_total == 110


# -- opening: only a regular file, never followed, never opened if it is anything else ----


def test_symlink_is_refused_even_to_a_valid_file(tmp_path: Path) -> None:
    target = tmp_path / "other.cache"
    write_region(target, spec())
    (tmp_path / "x.cache").symlink_to(target)
    error = rejection(tmp_path / "x.cache")
    assert error.reason == RejectReason.NOT_REGULAR_FILE
    assert "a symlink" in str(error)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x.cache")
    error = rejection(tmp_path / "x.cache")
    assert error.reason == RejectReason.NOT_REGULAR_FILE
    assert "FIFO" in str(error)


def test_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.cache").mkdir()
    assert rejection(tmp_path / "x.cache").reason == RejectReason.NOT_REGULAR_FILE


@pytest.mark.root
def test_device_node_is_refused(tmp_path: Path) -> None:
    # /dev/null's numbers; the inode is pinned with O_PATH, the driver is never opened.
    os.mknod(tmp_path / "x.cache", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    error = rejection(tmp_path / "x.cache")
    assert error.reason == RejectReason.NOT_REGULAR_FILE
    assert "character device" in str(error)


def test_hard_link_is_refused_for_writing_but_readable_for_inspect(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    os.link(path, tmp_path / "elsewhere")
    assert rejection(path).reason == RejectReason.HARD_LINK
    assert read_region_file(path).priority == 3


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_rw(tmp_path / "nothing.cache")
    with pytest.raises(CacheFileRejected, match="no such file") as info:
        read_region_file(tmp_path / "nothing.cache")
    assert info.value.reason == RejectReason.IO_ERROR


def test_file_kind() -> None:
    assert file_kind(stat.S_IFSOCK) == "socket"
    assert file_kind(stat.S_IFBLK) == "block device"
    assert file_kind(stat.S_IFREG) == "regular file"


# -- reading: bounded, never faults, the loader rule each time ------------------------------


def test_shrinking_file_is_a_short_read_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    handle = open_rw(path)
    try:
        os.truncate(path, V1.tail_offset)  # the tail is gone, the size we pass is stale
        with pytest.raises(CacheFileRejected) as info:
            handle.read(V1.sizeof + 1)
        assert info.value.reason == RejectReason.TRUNCATED
        assert "shrank" in str(info.value)
        os.truncate(path, 5)
        with pytest.raises(CacheFileRejected) as info:
            handle.read()
        assert info.value.reason == RejectReason.TOO_SMALL
        assert str(info.value).startswith(str(path))
    finally:
        handle.close()


def test_a_region_with_every_slot_live_keeps_little_memory(tmp_path: Path) -> None:
    # proc_num 1024 on 16 devices: ~100,000 slot fields.  Keeping them as Python ints for
    # change detection cost ~1.3 MB per region here (a tenant's 64 such containers: +105 MB
    # of agent RSS, and every full garbage collection walked them); such a region is
    # re-summed each tick instead, with the same answers and the same snapshot object while
    # unchanged.
    path = tmp_path / "x.cache"
    slot = ProcSlot(
        pid=1,
        used=[MemoryUse(total=(d + 1) << 20, context_size=d) for d in range(16)],
        util=[UtilUse(sm_util=d) for d in range(16)],
    )
    write_region(
        path,
        RegionSpec(num=16, uuids=[f"GPU-{d}" for d in range(16)], procs=[slot] * 1024),
    )
    handle = open_rw(path)
    try:
        tracemalloc.start()
        try:
            first = handle.read_usage()
            kept, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert kept < 512 << 10, kept
        assert first.active_slots == 1024
        assert first.devices[15].memory_total == 1024 * (16 << 20)
        assert handle.read_usage() is first
        SimulatedWorkload(path).set_priority(0)
        assert handle.read_usage().priority == 0
        SimulatedWorkload(path).set_slot(7, ProcSlot(status=0))
        changed = handle.read_usage()
        assert changed.active_slots == 1023
        assert changed.devices[0].memory_total == 1023 * (1 << 20)
        assert handle.read_usage() is changed
    finally:
        handle.close()


def test_same_bytes_same_snapshot_object_and_changes_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    handle = open_rw(path)
    try:
        first = handle.read_usage()
        assert handle.read_usage() is first
        SimulatedWorkload(path).set_priority(0)  # tail-only change: slot sums reused
        second = handle.read_usage()
        assert second.priority == 0
        assert second.devices is first.devices
        SimulatedWorkload(path).set_slot(0, ProcSlot(used=[MemoryUse(total=1)]))
        third = handle.read_usage()
        assert third.devices[0].memory_total == 101
        SimulatedWorkload(path).set_proc_num(2000)
        assert handle.read_usage().active_slots == 2  # slots 2..1023 are zero: status 0
    finally:
        handle.close()


def test_rewritten_to_bad_magic_then_valid_again(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    handle = open_rw(path)
    try:
        handle.read_usage()
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b"\0\0\0\0", 0)
        with pytest.raises(CacheFileRejected) as info:
            handle.read_usage()
        assert info.value.reason == RejectReason.MAGIC
        os.pwrite(fd, struct.pack("<i", 19920718), 0)
        os.close(fd)
        assert handle.read_usage().priority == 3
    finally:
        handle.close()


# -- writing: one aligned word at the field's offset, only if the size is unchanged --------


def test_control_writes_land_at_their_offsets_and_nowhere_else(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    for fmt in (Format.V0, Format.V1):
        write_region(path, spec(format=fmt, last_kernel_time=0))
        before = path.read_bytes()
        handle = open_rw(path)
        try:
            handle.read()
            handle.write_controls(
                [(ControlField.RECENT_KERNEL, -1), (ControlField.UTILIZATION_SWITCH, 1)]
            )
        finally:
            handle.close()
        after = path.read_bytes()
        layout = LAYOUTS[fmt]
        changed = [i for i in range(len(before)) if before[i] != after[i]]
        assert set(changed) <= set(range(layout.recent_kernel, layout.recent_kernel + 4)) | set(
            range(layout.utilization_switch, layout.utilization_switch + 4)
        )
        assert SimulatedWorkload(path, fmt).read_control() == (-1, 1)
        assert len(after) == len(before)


def test_no_write_before_a_read_or_after_the_size_changed(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    handle = open_rw(path)
    try:
        with pytest.raises(CacheFileRejected, match="no successful read"):
            handle.write_controls([(ControlField.RECENT_KERNEL, -1)])
        handle.read()
        os.truncate(path, 100)
        with pytest.raises(CacheFileRejected) as info:
            handle.write_controls([(ControlField.RECENT_KERNEL, -1)])
        assert info.value.reason == RejectReason.TRUNCATED
        assert path.stat().st_size == 100  # pwrite did not grow the file back
        with pytest.raises(ValueError, match="does not fit"):
            handle.write_controls([(ControlField.RECENT_KERNEL, 2**31)])
    finally:
        handle.close()
    assert handle.closed
    handle.close()  # idempotent


def test_read_only_handle_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, spec())
    handle = RegionHandle.open_path(path)
    try:
        handle.read()
        with pytest.raises(CacheFileRejected, match="read-only"):
            handle.write_controls([(ControlField.RECENT_KERNEL, -1)])
    finally:
        handle.close()


def test_totals_without_rereads_the_slots_and_refuses_a_changed_size(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    slots = [
        ProcSlot(pid=1, hostpid=10, used=[MemoryUse(total=100)], util=[UtilUse(sm_util=5)]),
        ProcSlot(pid=2, hostpid=20, used=[MemoryUse(total=200)], util=[UtilUse(sm_util=7)]),
    ]
    write_region(path, RegionSpec(uuids=["GPU-0"], procs=slots))
    handle = RegionHandle.open_path(path)
    try:
        snapshot = handle.read_usage()
        assert snapshot.devices[0].memory_total == 300
        without = handle.totals_without(snapshot, frozenset({20}))
        assert (without.devices[0].memory_total, without.devices[0].sm_util) == (100, 5)
        # The re-read sees the file as it is now (slot 0 grew since the snapshot).
        SimulatedWorkload(path).set_slot(
            0, ProcSlot(pid=1, hostpid=10, used=[MemoryUse(total=150)])
        )
        assert handle.totals_without(snapshot, frozenset({20})).devices[0].memory_total == 150
        os.truncate(path, V1.sizeof + 8)
        with pytest.raises(CacheFileRejected) as caught:
            handle.totals_without(snapshot, frozenset({20}))
        assert caught.value.reason is RejectReason.TRUNCATED
    finally:
        handle.close()
