from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hami_trio.allocation import (
    ContainerAllocateResponse,
    Mount,
    allocate,
    configure_host_pid_broker,
)
from hami_trio.errors import LockDirError
from hami_trio.goparse import BROKER_SWITCH_ENV, broker_switch_from_env

ME = os.geteuid()
LIB = Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True)


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp").chmod(0o1777)
    return tmp_path / "tmp" / "vgpulock"


@pytest.mark.parametrize("enabled", [True, False])
def test_allocate_prepares_then_merges(lock: Path, enabled: bool) -> None:
    response = ContainerAllocateResponse(
        envs={BROKER_SWITCH_ENV: "0"}, mounts=(Mount("/tmp/vgpulock/hostpid", "/x"), LIB)
    )
    out = allocate(
        response,
        broker_enabled=enabled,
        lock_parent=str(lock) + "/",
        owner=ME,
        broker_host_dir="/run/hostpid",
    )
    # Prepared even with the broker off: HAMi-core's fallback locks live there.
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o1777
    assert out == configure_host_pid_broker(
        response, enabled, lock_parent_host=str(lock), broker_host_dir="/run/hostpid"
    )
    assert Mount("/tmp/vgpulock", str(lock), False) in out.mounts


def test_allocate_fails_when_the_lock_parent_is_unsafe(lock: Path, tmp_path: Path) -> None:
    lock.symlink_to(tmp_path)
    with pytest.raises(LockDirError, match="is a symlink"):
        allocate(ContainerAllocateResponse(), broker_enabled=True, lock_parent=str(lock), owner=ME)


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", False), (None, False)])
def test_switch_for_allocate_comes_from_the_exact_env_value(
    lock: Path, value: str | None, expected: bool
) -> None:
    env = {} if value is None else {BROKER_SWITCH_ENV: value}
    out = allocate(
        ContainerAllocateResponse(),
        broker_enabled=broker_switch_from_env(env),
        lock_parent=str(lock),
        owner=ME,
    )
    assert (BROKER_SWITCH_ENV in out.envs) is expected
    assert len(out.mounts) == (2 if expected else 1)


def test_allocation_namespace_exports_exist() -> None:
    import hami_trio.allocation as allocation

    for name in allocation.__all__:
        assert hasattr(allocation, name), name
