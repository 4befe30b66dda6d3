"""A root workload tries to move the broker's mount point ``hostpid``; the immutable flag holds.

The nested mount point ``/tmp/vgpulock/hostpid`` lives in the shared, workload-writable lock
parent.  A container running as uid 0 without a user namespace and holding only the parent
mount (the broker off for it, or a pod from before) could rename it away and put a symlink to
``/etc`` in its place: the runtime resolves the name inside the *next* container's root on
every start, so that container got the broker's directory mounted over its own ``/etc``.

Every attack here runs as such a workload (``tests/allocation/workload.py``: forked, a private
mount namespace, the host directory bind-mounted at ``/tmp/vgpulock``, exactly the runtime's
default capabilities - no CAP_LINUX_IMMUTABLE, no CAP_SYS_ADMIN).  Before the preparation
flags ``hostpid``, every swap succeeds; afterwards each fails with EPERM - on the test's
``tmp_path`` (ext4 on the development machine) and on a private tmpfs.  On ramfs, which has
no inode flags, the preparation succeeds, says why the flag is missing (result, counter,
one log line) and its checks still refuse what the workload plants.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY

from hami_trio.agent.config import AgentConfig, resolve_config
from hami_trio.agent.service import AgentHandle, serve_agent
from hami_trio.allocation import lockdir
from hami_trio.allocation.lockdir import (
    FS_IMMUTABLE_FL,
    LockParentRefused,
    flag_problem,
    inspect_lock_parent,
    prepare_lock_dir,
    prepare_lock_parent,
)
from hami_trio.cli.main import build_parser
from hami_trio.demo.sandbox import _mount as mount
from tests.agent.agent import http_get
from tests.allocation.immutable import clear_immutable, is_immutable
from tests.allocation.workload import WORKLOAD_LOCK, as_workload
from tests.sandbox import run_in_child

ME = os.geteuid()
ATTEMPTS = (
    "rename",
    "rmdir",
    "rename-over",
    "symlink-at-name",
    "create-inside",
    "chmod",
    "chown",
    "clear-flag",
)


def make_tree(base: Path) -> Path:
    """The host's ``/tmp`` (root, 01777) under ``base``; returns ``/tmp/vgpulock``'s path."""
    tmp = base / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    return tmp / "vgpulock"


# -- the workload's side ----------------------------------------------------------------------


def _clear_flag(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        lockdir._set_flags(fd, lockdir._get_flags(fd) & ~FS_IMMUTABLE_FL)
    finally:
        os.close(fd)


def try_every_swap(restore: bool) -> dict[str, str]:
    """Each way a root workload can move or replace ``hostpid`` through its parent mount.

    Returns attempt -> ``ok`` or the errno name.  With ``restore`` (the mount point is not
    protected) the workload puts a plain directory back after each success, so that every
    attempt starts from the same state.
    """
    mount_point = WORKLOAD_LOCK / "hostpid"
    decoy = WORKLOAD_LOCK / "decoy"

    def rename_over() -> None:
        decoy.mkdir()
        try:
            os.rename(decoy, mount_point)  # an empty directory replaces an empty directory
        finally:
            if decoy.is_dir():
                decoy.rmdir()

    def symlink_at_name() -> None:
        os.rename(mount_point, WORKLOAD_LOCK / "moved-again")
        os.symlink("/etc", mount_point)

    actions: dict[str, Callable[[], None]] = {
        "rename": lambda: os.rename(mount_point, WORKLOAD_LOCK / "moved"),
        "rmdir": lambda: os.rmdir(mount_point),
        "rename-over": rename_over,
        "symlink-at-name": symlink_at_name,
        "create-inside": lambda: os.mkdir(mount_point / "planted"),
        "chmod": lambda: os.chmod(mount_point, 0o777),
        "chown": lambda: os.chown(mount_point, 1000, 1000),
        "clear-flag": lambda: _clear_flag(mount_point),
    }
    results: dict[str, str] = {}
    for name in ATTEMPTS:
        try:
            actions[name]()
        except OSError as exc:
            results[name] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        else:
            results[name] = "ok"
        if restore:
            for leftover in ("moved", "moved-again", "decoy"):
                if (WORKLOAD_LOCK / leftover).is_dir():
                    os.rmdir(WORKLOAD_LOCK / leftover)
            if mount_point.is_symlink():
                mount_point.unlink()
            if (mount_point / "planted").is_dir():
                os.rmdir(mount_point / "planted")
            if not mount_point.exists():
                mount_point.mkdir(0o755)
            os.chown(mount_point, 0, 0)
            os.chmod(mount_point, 0o755)
    return results


def plant_symlink_to_etc() -> str:
    mount_point = WORKLOAD_LOCK / "hostpid"
    if mount_point.exists():
        os.rename(mount_point, WORKLOAD_LOCK / "moved")
    os.symlink("/etc", mount_point)
    return os.readlink(mount_point)


# -- the host's side, on a filesystem of the test's choice --------------------------------------


def runtime_made_mount_point(lock: Path) -> None:
    """What the container runtime leaves when it creates the mount point itself."""
    prepare_lock_parent(str(lock), 0)  # the lock parent as the allocation made it, broker off
    (lock / "hostpid").mkdir(0o755)


def swaps_before_and_after(lock: Path) -> dict[str, Any]:
    runtime_made_mount_point(lock)
    before = as_workload(lock, try_every_swap, True)
    prepared = prepare_lock_dir(str(lock), 0, broker=True)
    after = as_workload(lock, try_every_swap, False)
    st = os.lstat(lock / "hostpid")
    return {
        "before": before,
        "prepared": prepared.mount_point,
        "after": after,
        "immutable": is_immutable(lock / "hostpid"),
        "entries": sorted(os.listdir(lock)),
        "hostpid": (stat.S_ISDIR(st.st_mode), st.st_uid, stat.S_IMODE(st.st_mode)),
        "inspected": inspect_lock_parent(str(lock), 0, broker=True).mount_point,
    }


def in_private_filesystem(base: Path, fstype: str, func: Callable[[Path], Any]) -> Any:
    """``func(lock)`` in a child with a fresh ``fstype`` at ``base/fs`` (its own namespace)."""

    def main() -> Any:
        fs = base / "fs"
        fs.mkdir()
        mount(fstype, str(fs), fstype, 0, "mode=0755")
        return func(make_tree(fs))

    return run_in_child(main, mount_namespace=True, timeout=60).value


pytestmark = pytest.mark.root


@pytest.mark.parametrize("fstype", ["tmp_path", "tmpfs"])
def test_every_swap_of_the_mount_point_fails_once_it_is_prepared(
    tmp_path: Path, fstype: str
) -> None:
    if fstype == "tmp_path":  # the machine's /tmp: ext4 here, tmpfs on some machines
        found = swaps_before_and_after(make_tree(tmp_path))
    else:
        found = in_private_filesystem(tmp_path, "tmpfs", swaps_before_and_after)
    # Before (what the runtime leaves): a root workload with the default capabilities moves,
    # removes and replaces the mount point at will.
    assert found["before"] == dict.fromkeys(ATTEMPTS, "ok")
    # After: the same workload gets EPERM for every one of them.
    assert found["prepared"] == "immutable"
    assert found["after"] == dict.fromkeys(ATTEMPTS, "EPERM")
    assert found["immutable"]
    assert found["entries"] == ["hostpid"]
    assert found["hostpid"] == (True, 0, 0o755)
    assert found["inspected"] == "immutable"


def test_the_swap_lands_without_the_flag_and_the_preparation_refuses_it(tmp_path: Path) -> None:
    """The attack itself (before the fix this was the end state after every allocation)."""
    lock = make_tree(tmp_path)
    runtime_made_mount_point(lock)
    assert as_workload(lock, plant_symlink_to_etc) == "/etc"
    assert (lock / "hostpid").is_symlink()
    with pytest.raises(LockParentRefused, match=r"nested mount point .*/hostpid is a symlink"):
        prepare_lock_dir(str(lock), 0, broker=True)
    prepared = prepare_lock_dir(str(lock), 0, broker=True, repair=True)
    assert prepared.mount_point == "immutable"
    assert not (lock / "hostpid").is_symlink()
    with pytest.raises(Exception, match="Operation not permitted"):
        as_workload(lock, plant_symlink_to_etc)
    assert stat.S_ISDIR(os.lstat(lock / "hostpid").st_mode)


def ramfs_preparation(lock: Path) -> dict[str, Any]:
    counter = "hami_trio_lock_mount_point_not_immutable_total"
    before = REGISTRY.get_sample_value(counter, {"reason": "unsupported"}) or 0.0
    lockdir._logged.clear()
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep(logging.WARNING)
    lockdir.logger.addHandler(handler)
    try:
        first = prepare_lock_dir(str(lock), 0, broker=True)
        second = prepare_lock_dir(str(lock), 0, broker=True)
    finally:
        lockdir.logger.removeHandler(handler)
    swapped = as_workload(lock, plant_symlink_to_etc)
    refused = "accepted"
    try:
        prepare_lock_dir(str(lock), 0, broker=True)
    except LockParentRefused as exc:
        refused = exc.reason
    return {
        "states": (first.mount_point, second.mount_point),
        "problem": first.problem,
        "counted": (REGISTRY.get_sample_value(counter, {"reason": "unsupported"}) or 0) - before,
        "logged": records,
        "swapped": swapped,
        "refused": refused,
    }


def test_a_filesystem_without_inode_flags_is_prepared_and_said_so_loudly(tmp_path: Path) -> None:
    found = in_private_filesystem(tmp_path, "ramfs", ramfs_preparation)
    assert found["states"] == ("unsupported", "unsupported")
    assert "could not be made immutable" in found["problem"]
    assert "Inappropriate ioctl for device" in found["problem"]
    assert "/hostpid" in found["problem"]
    assert found["counted"] == 2  # every preparation
    assert found["logged"] == [found["problem"]]  # one log line for a lasting state
    assert found["swapped"] == "/etc"  # the exposure the message names is real
    assert found["refused"] == "mount-point"  # and today's checks still hold


# -- the flag's errors, injected ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        (errno.ENOTTY, "unsupported"),
        (errno.EOPNOTSUPP, "unsupported"),
        (errno.EINVAL, "unsupported"),
        (errno.EPERM, "denied"),
        (errno.EACCES, "denied"),
        (errno.EROFS, "read-only"),
        (errno.EIO, "error"),
    ],
)
def test_flag_problem_names_each_errno(code: int, problem: str) -> None:
    assert flag_problem(OSError(code, os.strerror(code))) == problem


def failing_setflags(code: int) -> Callable[[int, int, bytes], bytes]:
    real = lockdir._ioctl

    def ioctl(fd: int, request: int, arg: bytes) -> bytes:
        if request == lockdir._FS_IOC_SETFLAGS:
            raise OSError(code, os.strerror(code))
        return real(fd, request, arg)

    return ioctl


def test_a_flag_that_cannot_be_set_is_counted_logged_once_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lock = make_tree(tmp_path)
    path = str(lock)
    caplog.set_level(logging.INFO, logger=lockdir.__name__)
    counter = "hami_trio_lock_mount_point_not_immutable_total"
    before = REGISTRY.get_sample_value(counter, {"reason": "denied"}) or 0.0
    with monkeypatch.context() as patch:
        patch.setattr(lockdir, "_ioctl", failing_setflags(errno.EPERM))
        for _ in range(3):
            prepared = prepare_lock_dir(path, 0, broker=True)
            assert prepared.mount_point == "denied"
    assert "lacks CAP_LINUX_IMMUTABLE" in prepared.problem
    assert REGISTRY.get_sample_value(counter, {"reason": "denied"}) == before + 3
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [prepared.problem]
    assert stat.S_IMODE(os.lstat(lock / "hostpid").st_mode) == 0o755  # the rest was done
    assert prepare_lock_dir(path, 0, broker=True).mount_point == "immutable"
    again = f"nested mount point {path}/hostpid is immutable again"
    assert caplog.records[-1].getMessage() == again
    assert prepare_lock_parent(path, 0, broker=True) == path  # the old call, unchanged


def test_the_broker_off_leaves_the_mount_point_alone(tmp_path: Path) -> None:
    lock = make_tree(tmp_path)
    assert prepare_lock_dir(str(lock), 0).mount_point == "off"
    assert not (lock / "hostpid").exists()


# -- repair and races ---------------------------------------------------------------------------


def test_an_immutable_mount_point_with_the_wrong_mode_is_refused_then_repaired(
    tmp_path: Path,
) -> None:
    lock = make_tree(tmp_path)
    prepare_lock_dir(str(lock), 0, broker=True)
    clear_immutable(lock)  # what only the node's root can do: chattr -i, chmod, chattr +i
    (lock / "hostpid").chmod(0o777)
    prepare_lock_dir(str(lock), 0)  # broker off: not looked at
    fd = os.open(lock / "hostpid", os.O_RDONLY | os.O_DIRECTORY)
    try:
        lockdir._set_flags(fd, lockdir._get_flags(fd) | FS_IMMUTABLE_FL)
    finally:
        os.close(fd)
    with pytest.raises(LockParentRefused, match="is immutable but owned by UID 0 with mode 0777"):
        prepare_lock_dir(str(lock), 0, broker=True)
    assert prepare_lock_dir(str(lock), 0, broker=True, repair=True).mount_point == "immutable"
    assert stat.S_IMODE(os.lstat(lock / "hostpid").st_mode) == 0o755
    assert is_immutable(lock / "hostpid")


def test_a_swap_between_open_and_flag_is_refused(tmp_path: Path) -> None:
    lock = make_tree(tmp_path)
    prepare_lock_parent(str(lock), 0)

    def swap(step: str) -> None:
        if step == "mount-point-opened":
            (lock / "hostpid").rename(lock / "aside")
            (lock / "hostpid").symlink_to("/etc")

    with pytest.raises(LockParentRefused, match="was replaced or changed") as info:
        prepare_lock_dir(str(lock), 0, broker=True, step_hook=swap)
    assert info.value.reason == "mount-point"
    assert (lock / "hostpid").is_symlink()  # refused: the allocation fails, nothing mounted


def test_the_read_only_check_reports_the_flag(tmp_path: Path) -> None:
    lock = make_tree(tmp_path)
    prepare_lock_parent(str(lock), 0)
    assert inspect_lock_parent(str(lock), 0, broker=True).mount_point == "missing"
    assert inspect_lock_parent(str(lock), 0).mount_point == "off"
    (lock / "hostpid").mkdir(0o755)
    assert inspect_lock_parent(str(lock), 0, broker=True).mount_point == "not-set"
    prepare_lock_parent(str(lock), 0, broker=True)
    state = inspect_lock_parent(str(lock), 0, broker=True)
    assert (state.state, state.mount_point) == ("ok", "immutable")
    assert not os.path.exists(lock / "hostpid" / "x")


# -- the agent's start --------------------------------------------------------------------------


def agent_config(base: Path, lock: Path) -> AgentConfig:
    (base / "hook" / "containers").mkdir(parents=True)
    argv = [
        "run",
        f"--hook-path={base / 'hook'}",
        f"--mig-lock-path={base / 'mig' / 'lock'}",
        f"--lock-parent-path={lock}",
        "--prepare-lock-parent",
        f"--broker-socket-path={base / 'b' / 'broker.sock'}",
        "--metrics-bind-address=127.0.0.1:0",
        "--debug-bind-address=off",
        "--interval=0.05",
        "--no-kubernetes",
    ]
    return resolve_config(build_parser().parse_args(argv), {"LIBVGPU_HOSTPID_BROKER": "1"})


async def agent_view(config: AgentConfig) -> tuple[str, str]:
    """``/readyz?verbose`` and the lock gauges of an agent just started with ``config``."""
    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(serve_agent, config)
        port = handle.metrics_address.port
        _, ready = await trio.to_thread.run_sync(http_get, port, "/readyz?verbose")
        _, text = await trio.to_thread.run_sync(http_get, port, "/metrics")
        handle.request_stop()
    return ready, "\n".join(line for line in text.splitlines() if line.startswith("hami_trio_lock"))


async def test_the_agent_makes_the_mount_point_immutable_before_any_tenant_runs(
    base_dir: Path,
) -> None:
    lock = make_tree(base_dir)
    lock.mkdir(0o755)  # what the chart's DirectoryOrCreate leaves on a fresh node
    try:
        ready, gauges = await agent_view(agent_config(base_dir, lock))
        assert "[+]lock-mount-point ok" in ready
        assert "hami_trio_lock_mount_point_immutable 1.0" in gauges
        assert "hami_trio_lock_parent_ok 1.0" in gauges
        assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o1777
        assert is_immutable(lock / "hostpid")
        assert as_workload(lock, try_every_swap, False) == dict.fromkeys(ATTEMPTS, "EPERM")
    finally:
        clear_immutable(base_dir)


async def test_an_agent_that_cannot_set_the_flag_says_so_and_stays_ready(
    base_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lock = make_tree(base_dir)
    monkeypatch.setattr(lockdir, "_ioctl", failing_setflags(errno.EOPNOTSUPP))
    caplog.set_level(logging.WARNING, logger="hami_trio.allocation")
    ready, gauges = await agent_view(agent_config(base_dir, lock))
    assert "readyz check passed" in ready  # informational: the metrics stay in the Service
    line = next(row for row in ready.splitlines() if "lock-mount-point" in row)
    assert line.startswith("[-]lock-mount-point failed: nested mount point")
    assert "could not be made immutable" in line
    assert "hami_trio_lock_mount_point_immutable 0.0" in gauges
    warned = [
        r.getMessage() for r in caplog.records if "could not be made immutable" in r.getMessage()
    ]
    assert len(warned) == 1
    assert not is_immutable(lock / "hostpid")


def test_prepare_lock_dir_says_on_stderr_when_the_flag_cannot_be_set(tmp_path: Path) -> None:
    """The command a Go plugin execs: exit 0 (the checks held) and the one line on stderr."""
    fs = tmp_path / "fs"
    fs.mkdir()
    script = (
        'mount --make-rprivate / && mount -t ramfs ramfs "$1" && mkdir -m 1777 "$1/tmp" && '
        'exec "$2" prepare-lock-dir --broker "$1/tmp/vgpulock"'
    )
    hami_trio = str(Path(sys.executable).with_name("hami-trio"))
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(fs), hami_trio],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"nested mount point {fs}/tmp/vgpulock/hostpid could not be made immutable "
        "(Inappropriate ioctl for device: the filesystem does not support inode flags); a root "
        "workload holding only the parent mount can still rename or replace it and break the "
        "broker mount of the next containers started on this node (every preparation still "
        "refuses what it finds planted there)"
    ]
