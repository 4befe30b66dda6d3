"""The mount point swap with the real container runtime (podman + runc), before and after.

How this works: a temporary "node" directory stands in for the host's ``/tmp`` (root, 01777)
with the lock parent ``vgpulock`` and a broker directory holding a marker file.  Two
containers of the image test's mmdebstrap base (``tests/deploy/test_image.py`` builds and
caches it; reused here) run as uid 0 with podman's default capabilities and no user
namespace, like a pod without ``hostUsers: false``:

1. **the attacker** gets only the parent mount (``/tmp/vgpulock``, read-write: a pod with the
   broker off) and tries to rename ``hostpid`` away and put a symlink to ``/etc`` there;
2. **the victim** starts next with both mounts, the parent and the broker directory
   read-only at ``/tmp/vgpulock/hostpid``, exactly as the allocation hands them out.

Without the immutable flag (the mount point as the runtime leaves it) the swap lands and the
victim gets the broker directory over its own ``/etc`` (``/etc/passwd`` gone).  After
``prepare_lock_dir(broker=True)`` the attacker's every step fails with "Operation not
permitted", and the victim has its own ``/etc`` and the broker's marker at
``/tmp/vgpulock/hostpid``.  Mounts happen in podman's namespaces only; the node directory is
a temporary directory whose flags are cleared and which is removed at the end.

Needs root, podman, runc and mmdebstrap, like the image test: skipped without them, failed
in CI (``CI`` set).  About 10 s with the base image cached.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_trio.allocation.lockdir import prepare_lock_dir, prepare_lock_parent
from tests.allocation.immutable import clear_immutable, is_immutable
from tests.deploy.test_image import _ulimits, base_image, podman, steps  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.root, pytest.mark.slow]

MARKER = "broker-directory-marker"

ATTACK = """
cd /tmp/vgpulock || exit 99
mv hostpid moved 2>&1 || echo "mv failed"
rmdir hostpid 2>&1 || echo "rmdir failed"
ln -s /etc hostpid 2>&1 || echo "ln failed"
ln -s /etc decoy && { mv -T decoy hostpid 2>&1 || echo "mv -T failed"; rm -f decoy; }
if [ -L hostpid ]; then echo "swapped: $(readlink hostpid)"; else echo "intact"; fi
"""

VICTIM = f"""
if [ -e /tmp/vgpulock/hostpid/{MARKER} ]; then echo "broker at /tmp/vgpulock/hostpid"; fi
if [ -e /etc/{MARKER} ]; then echo "broker over /etc"; fi
if [ -f /etc/passwd ]; then echo "own /etc/passwd"; else echo "no /etc/passwd"; fi
"""


@pytest.fixture
def node() -> Iterator[Path]:
    """The host's stand-in: ``tmp`` (root 01777) and ``broker`` with the marker."""
    base = Path(tempfile.mkdtemp(prefix="ht-lockdir-runtime-", dir="/var/tmp"))
    try:
        (base / "tmp").mkdir(mode=0o1777)
        (base / "tmp").chmod(0o1777)
        (base / "broker").mkdir(mode=0o711)
        (base / "broker" / MARKER).write_text("the broker's directory\n")
        yield base
    finally:
        clear_immutable(base)
        shutil.rmtree(base)


def run(image: str, script: str, *mounts: str) -> str:
    argv = ["podman", "run", "--rm", "--runtime", "runc", "--network", "none", "--user", "0:0"]
    argv += _ulimits()
    for mount in mounts:
        argv += ["-v", mount]
    result = subprocess.run(
        [*argv, image, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def attacker_then_victim(image: str, node: Path) -> tuple[str, str]:
    lock = node / "tmp" / "vgpulock"
    parent = f"{lock}:/tmp/vgpulock"
    broker = f"{node / 'broker'}:/tmp/vgpulock/hostpid:ro"
    return run(image, ATTACK, parent), run(image, VICTIM, parent, broker)


def test_a_root_container_cannot_move_the_mount_point_of_the_next_one(
    base_image: str,  # noqa: F811
    node: Path,
) -> None:
    lock = node / "tmp" / "vgpulock"
    # Before: the lock parent as an allocation made it and the mount point as the runtime
    # created it for an earlier broker container (root, 0755, no flag).
    prepare_lock_parent(str(lock), 0)
    (lock / "hostpid").mkdir(mode=0o755)
    attack, victim = attacker_then_victim(base_image, node)
    assert "swapped: /etc" in attack, attack
    assert "broker over /etc" in victim, victim
    assert "no /etc/passwd" in victim, victim

    # The repair and the preparation every allocation runs: hostpid immutable.
    assert prepare_lock_dir(str(lock), 0, broker=True, repair=True).mount_point == "immutable"
    assert is_immutable(lock / "hostpid")
    attack, victim = attacker_then_victim(base_image, node)
    assert "intact" in attack, attack
    # mv (into the earlier "moved"), rmdir, ln (which lands inside the directory); mv -T of
    # the symlink over the directory is refused by mv itself.
    assert attack.count("Operation not permitted") == 3, attack
    assert "swapped" not in attack, attack
    assert victim.splitlines()[1:] == ["broker at /tmp/vgpulock/hostpid", "own /etc/passwd"], victim
    assert sorted(p.name for p in lock.iterdir()) == ["hostpid", "moved"]  # the old one aside
