"""The demo's container-like sandbox passes the broker client's checks, as root and not."""

from __future__ import annotations

import ctypes
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_trio.broker.client import check_directory, check_socket
from hami_trio.demo.sandbox import (
    NOBODY,
    SANDBOX_BROKER_DIR,
    SANDBOX_CACHE_DIR,
    SandboxSpec,
    enter_container,
)
from tests.sandbox import run_in_child, world_readable_dir

pytestmark = pytest.mark.root

_PR_SET_DUMPABLE = 4


@pytest.fixture
def host(request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    """A broker directory with a socket file, and a container directory, owned by ``uid``."""
    uid = request.param
    with world_readable_dir("ht-sbx-") as root:
        broker_dir = root / "hostpid"
        broker_dir.mkdir(mode=0o711)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(broker_dir / "broker.sock"))
        container = root / "containers" / "pod_ctr"
        container.mkdir(parents=True)
        for path in (broker_dir, broker_dir / "broker.sock", container):
            os.chown(path, uid, uid)
        broker_dir.chmod(0o711)
        yield broker_dir, container


def _look_inside(spec: SandboxSpec) -> dict[str, object]:
    """Runs in a forked child: enter the sandbox, report what a workload would see."""
    if os.geteuid() != 0:
        # setuid() made this forked child non-dumpable, which hides /proc/self/uid_map from
        # it; a user who started the demo unprivileged never changed its uid and is dumpable.
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1)
    enter_container(spec)
    st = os.stat(SANDBOX_BROKER_DIR, follow_symlinks=False)
    read_only = bool(os.statvfs(SANDBOX_BROKER_DIR).f_flag & os.ST_RDONLY)
    sock = SANDBOX_BROKER_DIR / "broker.sock"
    (SANDBOX_CACHE_DIR / "probe.cache").write_bytes(b"x")
    try:
        (SANDBOX_BROKER_DIR / "intruder").touch()
        wrote_broker_dir = True
    except OSError:
        wrote_broker_dir = False
    return {
        "directory": check_directory(SANDBOX_BROKER_DIR, st, read_only),
        "socket": check_socket(sock, os.lstat(sock)),
        "tmp_is_private": not any(Path("/tmp").glob("ht-sbx-*")),
        "wrote_broker_dir": wrote_broker_dir,
        "vgpulock_mode": stat.S_IMODE(os.stat(SANDBOX_BROKER_DIR.parent).st_mode),
    }


def _assert_like_a_container(seen: dict[str, object], container: Path) -> None:
    assert seen["directory"] is None  # root-owned, 0711, read-only: trusted
    assert seen["socket"] is None
    assert seen["tmp_is_private"]
    assert not seen["wrote_broker_dir"]
    assert seen["vgpulock_mode"] == 0o1777
    # The container directory was the host's, read-write; the host's /tmp was untouched.
    assert (container / "probe.cache").read_bytes() == b"x"
    assert not (SANDBOX_CACHE_DIR / "probe.cache").exists()


@pytest.mark.parametrize("host", [0], indirect=True)
def test_root_sandbox_shows_the_broker_dir_read_only_at_hami_cores_path(
    host: tuple[Path, Path],
) -> None:
    broker_dir, container = host
    seen = run_in_child(_look_inside, SandboxSpec(broker_dir, container)).value
    _assert_like_a_container(seen, container)


@pytest.mark.parametrize("host", [NOBODY], indirect=True)
def test_user_namespace_sandbox_makes_the_callers_files_root_owned(
    host: tuple[Path, Path],
) -> None:
    # What a non-root user gets: its own uid shows as 0 inside, so the unchanged checks pass.
    broker_dir, container = host
    spec = SandboxSpec(broker_dir, container, user_namespace=True)
    seen = run_in_child(_look_inside, spec, uid=NOBODY).value
    _assert_like_a_container(seen, container)
