"""RegionHandle.read_probed: the size checked in the first pread, no stat when unchanged."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import LAYOUTS, Format, RejectReason
from hami_trio.monitor.region import PROBE_SLACK, RegionHandle
from hami_trio.monitor.snapshot import TickSnapshot
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, write_region
from tests.strategies.watch import probe_sizes

V1 = LAYOUTS[Format.V1]


def open_rw(path: Path) -> RegionHandle:
    return RegionHandle.open_at(None, os.fspath(path), display="x.cache")


class Fstats:
    """Counts ``os.fstat`` calls (the fallback of a probe that saw a size change)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real: Callable[[int], os.stat_result] = os.fstat

        def fstat(fd: int) -> os.stat_result:
            self.calls += 1
            return real(fd)

        monkeypatch.setattr(os, "fstat", fstat)


def outcome(read: Callable[[], TickSnapshot]) -> TickSnapshot | tuple[str, str]:
    try:
        return read()
    except CacheFileRejected as exc:
        return (exc.reason, str(exc))


def test_an_unchanged_file_is_read_without_a_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.cache"
    write_region(path, RegionSpec(priority=3, uuids=["GPU-0"]))
    handle = open_rw(path)
    try:
        first = handle.read_probed()  # no size known yet: one fstat
        fstats = Fstats(monkeypatch)
        SimulatedWorkload(path).set_priority(5)
        again = handle.read_probed()
        assert fstats.calls == 0
        assert again.priority == 5
        assert again.file_size == first.file_size == V1.sizeof + 1
        # the probe is charged as read: the tail through one byte past the end, and nothing
        # else (the static head is kept between its refreshes)
        assert handle.read_bytes == V1.sizeof + 1 - V1.tail_offset + 1
    finally:
        handle.close()


@pytest.mark.parametrize(
    ("size", "expect"),
    [
        (V1.sizeof + 2, None),  # grown by one byte: still v1, new size
        (V1.sizeof, None),  # shrunk by one byte: still v1
        (64, RejectReason.UNKNOWN_VERSION),  # no layout fits: the header names it
        (10, RejectReason.TOO_SMALL),
        (V1.sizeof + 1 + PROBE_SLACK + 100, None),  # grown far past the probe
    ],
)
def test_a_changed_size_is_seen_and_read_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, expect: RejectReason | None
) -> None:
    path = tmp_path / "x.cache"
    write_region(path, RegionSpec(uuids=["GPU-0"]))
    handle = open_rw(path)
    try:
        handle.read_probed()
        fstats = Fstats(monkeypatch)
        os.truncate(path, size)
        got = outcome(handle.read_probed)
        assert fstats.calls == 1  # the probe saw the change and asked the size once
        if expect is None:
            assert isinstance(got, TickSnapshot)
            assert got.file_size == size
        else:
            assert isinstance(got, tuple)
            assert got[0] == expect
    finally:
        handle.close()


def test_a_file_far_larger_than_its_layout_is_sized_with_fstat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.cache"
    write_region(path, RegionSpec(uuids=["GPU-0"]))
    os.truncate(path, 8 << 20)  # v1 still, but the tail is 6 MB before the end
    handle = open_rw(path)
    try:
        handle.read_probed()
        fstats = Fstats(monkeypatch)
        assert handle.read_probed().file_size == 8 << 20
        assert fstats.calls == 1  # no probe can span that: read() as before
    finally:
        handle.close()


def test_an_explicit_size_is_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    write_region(path, RegionSpec(uuids=["GPU-0"]))
    handle = open_rw(path)
    try:
        handle.read()
        os.truncate(path, V1.tail_offset)
        with pytest.raises(CacheFileRejected) as info:
            handle.read(V1.sizeof + 1)  # a stale size from the caller: truncated, as before
        assert info.value.reason == RejectReason.TRUNCATED
    finally:
        handle.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from([Format.V0, Format.V1]),
    sizes=st.lists(st.one_of(st.none(), probe_sizes()), min_size=1, max_size=6),
)
def test_probed_reads_agree_with_reads_at_the_stat_size(
    tmp_path_factory: pytest.TempPathFactory, fmt: Format, sizes: list[int | None]
) -> None:
    """Whatever sizes the file goes through (None: unchanged), a probed read returns what a
    read at the size ``stat`` reports returns, snapshot or rejection."""
    path = tmp_path_factory.mktemp("probe") / "x.cache"
    write_region(path, RegionSpec(format=fmt, uuids=["GPU-0"], priority=4))
    probed, told = open_rw(path), open_rw(path)
    try:
        for size in [None, *sizes]:
            if size is not None:
                os.truncate(path, size)
            expected = outcome(lambda: told.read(os.stat(path).st_size))
            assert outcome(probed.read_probed) == expected
    finally:
        probed.close()
        told.close()
