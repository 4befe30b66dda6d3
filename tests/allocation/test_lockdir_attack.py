"""Root workloads attack the shared lock parent through their real mount; then we recover.

Every attack runs in a forked child that has the host-side lock parent bind-mounted at
``/tmp/vgpulock`` in a private mount namespace and the container runtime's default
capabilities (``tests/allocation/workload.py``).  The checks afterwards use the real code: the
library's preparation, the ``hami-trio prepare-lock-dir`` console script, and the agent's
read-only check scraped over HTTP from a running agent.

Before the fix (recorded for the issue): the chowned directory was refused with
``is owned by UID 1000, not the trusted UID 0; refusing to chmod or mount a directory someone
else controls`` and nothing more, no metric counted it, ``--repair`` did not exist (exit 2,
"unrecognized arguments"), and a symlink planted at ``hostpid`` was accepted silently.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from prometheus_client import REGISTRY

from hami_trio.agent.config import resolve_config
from hami_trio.agent.service import AgentHandle, serve_agent
from hami_trio.allocation.lockdir import (
    LockParentRefused,
    inspect_lock_parent,
    prepare_lock_parent,
)
from hami_trio.cli.main import build_parser
from tests.agent.agent import http_get
from tests.allocation.workload import DEFAULT_CAPS, WORKLOAD_LOCK, as_workload

pytestmark = pytest.mark.root

HAMI_TRIO = str(Path(sys.executable).with_name("hami-trio"))
INTRUDER = 1000


@dataclass
class Node:
    tmp: Path  # the host's /tmp
    lock: Path  # the host's /tmp/vgpulock
    outside: Path  # somewhere an attacker would like us to write

    @property
    def path(self) -> str:
        return str(self.lock)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    outside = tmp_path / "etc"
    outside.mkdir()
    outside.chmod(0o700)
    (outside / "secret").write_text("keep")
    lock = tmp / "vgpulock"
    # What the device plugin did earlier, with the broker still off: no hostpid yet, so a
    # workload can plant anything there (once prepared with the broker on it is immutable:
    # tests/allocation/test_mount_point_immutable.py).
    prepare_lock_parent(str(lock), 0)
    return Node(tmp, lock, outside)


def refusals(reason: str) -> float:
    value = REGISTRY.get_sample_value("hami_trio_lock_parent_refusals_total", {"reason": reason})
    return value or 0.0


def tree_snapshot(root: Path) -> list[tuple[str, int, int, int, bytes | None]]:
    """Every entry below ``root`` (and ``root`` itself): name, mode, owner, inode, content."""
    found = []
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(path)
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        found.append((str(path), st.st_mode, st.st_uid, st.st_ino, content))
    return found


def repair(node: Node, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HAMI_TRIO, "prepare-lock-dir", "--repair", *extra, node.path],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "LIBVGPU_HOSTPID_BROKER"},
    )


def assert_prepared(node: Node, inode: int) -> None:
    st = os.lstat(node.lock)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_ino) == (0, 0o1777, inode)
    mount_point = os.lstat(node.lock / "hostpid")
    assert stat.S_ISDIR(mount_point.st_mode)
    assert (mount_point.st_uid, stat.S_IMODE(mount_point.st_mode)) == (0, 0o755)


# -- the attacks ------------------------------------------------------------------------------


def take_over(outside: str) -> int:
    """A root workload with default capabilities: chown and chmod its mount root, then plant
    a symlink at the nested mount point (possible whenever the broker mount is not there)."""
    os.chown(WORKLOAD_LOCK, INTRUDER, INTRUDER)  # CAP_CHOWN
    os.chmod(WORKLOAD_LOCK, 0o777)  # owner or CAP_FOWNER: no more sticky bit
    os.symlink(outside, WORKLOAD_LOCK / "hostpid")
    return os.stat(WORKLOAD_LOCK).st_uid


def plant_file() -> None:
    (WORKLOAD_LOCK / "hostpid").write_text("not a mount point")


def chmod_only() -> int:
    os.chmod(WORKLOAD_LOCK, 0o755)  # uid 0 owns the directory: no capability needed
    return stat.S_IMODE(os.stat(WORKLOAD_LOCK).st_mode)


# -- tests ------------------------------------------------------------------------------------


def test_take_over_is_refused_with_the_recovery_counted_and_repaired_in_place(node: Node) -> None:
    inode = os.lstat(node.lock).st_ino
    outside_before = tree_snapshot(node.outside)
    assert as_workload(node.lock, take_over, str(node.outside)) == INTRUDER
    assert os.lstat(node.lock).st_uid == INTRUDER  # the host directory itself was taken

    before = refusals("owner")
    with pytest.raises(LockParentRefused) as info:
        prepare_lock_parent(node.path, 0, broker=True)
    message = str(info.value)
    assert message.startswith(f"{node.lock}: is owned by UID {INTRUDER}, not the trusted UID 0")
    assert f"run `hami-trio prepare-lock-dir --repair --broker {node.lock}` as root" in message
    assert info.value.reason == "owner"
    assert refusals("owner") == before + 1
    assert os.lstat(node.lock).st_uid == INTRUDER  # refused means untouched

    state = inspect_lock_parent(node.path, 0, broker=True)
    assert (state.state, state.reason) == ("unsafe", "owner")
    assert "--repair --broker" in state.message

    done = repair(node, "--broker")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"{node.lock}: repaired: a directory of UID 0, mode 1777, hostpid a directory of "
        "UID 0, mode 0755\n"
    )
    assert_prepared(node, inode)  # the same directory: running workloads keep their mount
    assert tree_snapshot(node.outside) == outside_before  # the symlink was never followed
    assert inspect_lock_parent(node.path, 0, broker=True).state == "ok"
    prepare_lock_parent(node.path, 0, broker=True)  # allocations work again


def test_planted_file_at_the_mount_point_is_refused_with_the_broker_on(node: Node) -> None:
    as_workload(node.lock, plant_file)
    prepare_lock_parent(node.path, 0)  # broker off: hostpid is not used, nothing to refuse
    before = refusals("mount-point")
    with pytest.raises(LockParentRefused, match=r"nested mount point .*/hostpid is a regular file"):
        prepare_lock_parent(node.path, 0, broker=True)
    assert refusals("mount-point") == before + 1
    assert (node.lock / "hostpid").read_text() == "not a mount point"  # refused: untouched
    assert inspect_lock_parent(node.path, 0, broker=True).reason == "mount-point"
    # The switch from the environment works like `hami-trio allocate`'s.
    refused = subprocess.run(
        [HAMI_TRIO, "prepare-lock-dir", node.path],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"LIBVGPU_HOSTPID_BROKER": "1"},
    )
    assert refused.returncode == 1
    assert f"--repair --broker {node.lock}" in refused.stderr
    assert repair(node, "--broker").returncode == 0
    assert_prepared(node, os.lstat(node.lock).st_ino)


def test_repair_never_follows_a_planted_symlink(node: Node) -> None:
    inode = os.lstat(node.lock).st_ino
    outside_before = tree_snapshot(node.outside)
    as_workload(node.lock, take_over, str(node.outside))
    assert os.path.samefile(node.lock / "hostpid", node.outside)  # followed, it is "etc"
    assert repair(node, "--broker").returncode == 0
    assert_prepared(node, inode)
    assert tree_snapshot(node.outside) == outside_before  # no chown, chmod or mkdir there

    # A symlink at the mount root itself (only someone with the host's /tmp can do that):
    # refused even with --repair, with the manual command; the target stays as it was.
    node.lock.rename(node.tmp / "old-vgpulock")
    node.lock.symlink_to(node.outside)
    refused = repair(node, "--broker")
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"hami-trio prepare-lock-dir: {node.lock}: is a symlink")
    assert f"`unlink {node.lock}`" in refused.stderr
    assert "--repair never follows or removes it" in refused.stderr
    assert tree_snapshot(node.outside) == outside_before
    assert node.lock.is_symlink()
    assert inspect_lock_parent(node.path, 0).reason == "symlink"


def test_a_root_workload_without_any_capability_can_still_chmod_its_mount_root(
    node: Node,
) -> None:
    """Why docs/security.md says dropping FOWNER is not enough: uid 0 owns the directory."""
    assert as_workload(node.lock, chmod_only, caps=frozenset()) == 0o755
    state = inspect_lock_parent(node.path, 0)
    assert (state.state, state.reason) == ("unsafe", "mode")
    prepare_lock_parent(node.path, 0)  # a mode is restored by every preparation
    assert stat.S_IMODE(os.lstat(node.lock).st_mode) == 0o1777
    with pytest.raises(Exception, match="Operation not permitted"):
        as_workload(node.lock, take_over, str(node.outside), caps=DEFAULT_CAPS - {0})


async def test_the_running_agent_shows_the_unsafe_lock_parent(
    node: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook = tmp_path / "hook"
    (hook / "containers").mkdir(parents=True)
    argv = [
        "run",
        f"--hook-path={hook}",
        f"--mig-lock-path={tmp_path / 'mig' / 'lock'}",
        f"--lock-parent-path={node.lock}",
        "--metrics-bind-address=127.0.0.1:0",
        "--debug-bind-address=127.0.0.1:0",
        "--interval=0.05",
        "--no-kubernetes",
    ]
    config = resolve_config(build_parser().parse_args(argv), {})

    async def gauges(handle: AgentHandle) -> str:
        _, text = await trio.to_thread.run_sync(
            functools.partial(http_get, handle.metrics_address.port, "/metrics")
        )
        return "\n".join(line for line in text.splitlines() if "lock_parent" in line)

    caplog.set_level(logging.INFO, logger="hami_trio.allocation.watch")
    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(serve_agent, config)
        assert "hami_trio_lock_parent_ok 1.0" in await gauges(handle)
        await trio.to_thread.run_sync(as_workload, node.lock, take_over, str(node.outside))
        with trio.fail_after(10):
            while "hami_trio_lock_parent_ok 0.0" not in (text := await gauges(handle)):  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert 'hami_trio_lock_parent_unsafe{reason="owner"} 1.0' in text
        assert 'hami_trio_lock_parent_unsafe{reason="mode"} 0.0' in text
        assert all(handle.readiness().values())  # the agent itself is fine
        await trio.sleep(0.5)  # ten more checks: still one warning (rate-limited)
        warnings = [
            r.getMessage() for r in caplog.records if "lock parent unsafe" in r.getMessage()
        ]
        assert len(warnings) == 1
        assert f"{node.lock}: is owned by UID {INTRUDER}" in warnings[0]
        assert f"hami-trio prepare-lock-dir --repair {node.lock}" in warnings[0]
        assert (await trio.to_thread.run_sync(repair, node)).returncode == 0
        with trio.fail_after(10):
            while "hami_trio_lock_parent_ok 1.0" not in (text := await gauges(handle)):  # noqa: ASYNC110
                await trio.sleep(0.05)
        handle.request_stop()
    assert any("is safe again" in r.getMessage() for r in caplog.records)
