"""LockParentWatch: gauges follow the directory; warnings are rate-limited; recovery is logged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry
from trio.testing import MockClock

from hami_trio.allocation.lockdir import prepare_lock_parent
from hami_trio.allocation.watch import LockParentWatch, serve_lock_parent_watch

ME = os.geteuid()


async def test_gauges_warnings_and_recovery(
    autojump_clock: MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    lock = parent / "vgpulock"
    registry = CollectorRegistry()
    watch = LockParentWatch(str(lock), owner=ME, broker=False, registry=registry, warn_interval=60)

    def gauge(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    caplog.set_level(logging.INFO, logger="hami_trio.allocation.watch")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_lock_parent_watch, watch, 5.0)
        assert watch.state.state == "missing"  # not prepared yet: fine
        assert gauge("hami_trio_lock_parent_ok") == 1
        prepare_lock_parent(str(lock), ME)
        lock.chmod(0o777)
        await trio.sleep(6)
        assert gauge("hami_trio_lock_parent_ok") == 0
        assert gauge("hami_trio_lock_parent_unsafe", reason="mode") == 1
        assert gauge("hami_trio_lock_parent_unsafe", reason="owner") == 0
        await trio.sleep(50)  # ten more checks, one warning
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1
        assert f"{lock}: has mode 0777, not 1777" in warned[0].getMessage()
        assert "prepare-lock-dir --repair" in warned[0].getMessage()
        await trio.sleep(15)  # past the interval: warned again
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
        lock.rmdir()
        lock.symlink_to(tmp_path)  # a new reason: warned at once
        await trio.sleep(5)
        assert gauge("hami_trio_lock_parent_unsafe", reason="symlink") == 1
        assert gauge("hami_trio_lock_parent_unsafe", reason="mode") == 0
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3
        lock.unlink()
        prepare_lock_parent(str(lock), ME)
        await trio.sleep(5)
        assert gauge("hami_trio_lock_parent_ok") == 1
        assert any("is safe again" in r.getMessage() for r in caplog.records)
        nursery.cancel_scope.cancel()


@pytest.mark.root
async def test_the_mount_point_flag_is_a_gauge_and_one_warning(
    autojump_clock: MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    lock = parent / "vgpulock"
    prepare_lock_parent(str(lock), 0)
    registry = CollectorRegistry()
    watch = LockParentWatch(str(lock), owner=0, broker=True, registry=registry)
    caplog.set_level(logging.WARNING, logger="hami_trio.allocation.watch")

    def immutable() -> float | None:
        return registry.get_sample_value("hami_trio_lock_mount_point_immutable")

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_lock_parent_watch, watch, 5.0)
        assert immutable() == 0  # missing: the next preparation makes it; no warning
        (lock / "hostpid").mkdir(0o755)  # what the runtime creates: no flag
        await trio.sleep(21)
        assert immutable() == 0
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1  # four checks, one line
        assert f"nested mount point {lock}/hostpid is not immutable (not-set)" in warned[0]
        assert f"hami-trio prepare-lock-dir --broker {lock}" in warned[0]
        prepare_lock_parent(str(lock), 0, broker=True)
        await trio.sleep(6)  # past the next check (the checks run at multiples of 5 s)
        assert immutable() == 1
        assert watch.state.mount_point == "immutable"
        nursery.cancel_scope.cancel()
    assert registry.get_sample_value("hami_trio_lock_parent_ok") == 1


async def test_no_mount_point_gauge_with_the_broker_off(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    LockParentWatch(str(tmp_path / "vgpulock"), owner=ME, broker=False, registry=registry).check()
    assert registry.get_sample_value("hami_trio_lock_mount_point_immutable") is None
