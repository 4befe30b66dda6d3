"""A HAMi-core workload's view of the shared lock parent, built from real kernel objects.

How this works.  A container that gets HAMi-core has the host's ``/tmp/vgpulock`` bind-mounted
read-write at ``/tmp/vgpulock``; its processes run as root with the container runtime's default
capabilities unless the pod says otherwise.  :func:`as_workload` reproduces that in a forked
child (:func:`tests.sandbox.run_in_child` with a private mount namespace):

1. open the host directory (``O_PATH``) before anything hides it - pytest's trees live under
   the machine's ``/tmp`` too;
2. mount a fresh tmpfs on ``/tmp`` (private to the namespace) and bind-mount the host
   directory at ``/tmp/vgpulock`` through ``/proc/self/fd/N``: the workload's mount root *is*
   the host directory;
3. drop every capability outside the default set of containerd and Docker - CHOWN,
   DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW,
   SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP - or the set a test asks for: in particular no
   CAP_SYS_ADMIN, so the workload cannot unmount or mount anything, like a real container;
4. run the attack, a plain function, through the workload's own path ``/tmp/vgpulock``.

Nothing is mounted outside the child's namespace and the child is always waited for.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The private helper mounts the tmpfs; bind_mount is public.
from hami_trio.demo.sandbox import _mount as mount
from hami_trio.demo.sandbox import bind_mount, enter_namespaces
from tests.sandbox import run_in_child

__all__ = ["DEFAULT_CAPS", "WORKLOAD_LOCK", "as_workload", "effective_caps"]

#: Where the workload sees the lock parent (HAMi-core's compiled-in path).
WORKLOAD_LOCK = Path("/tmp/vgpulock")

#: containerd's and Docker's default capability set (capability numbers, linux/capability.h).
DEFAULT_CAPS = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31})
CAP_SYS_ADMIN = 21
_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_caps(caps: frozenset[int]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap not in caps and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")
    keep = sum(1 << cap for cap in caps)
    header = _Header(_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for index in (0, 1):
        word = (keep >> (32 * index)) & 0xFFFFFFFF
        data[index].effective = data[index].permitted = word
        data[index].inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def effective_caps() -> int:
    """The calling process's effective capability mask (from ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff in /proc/self/status")


def _workload_main(
    host_lock: str, caps: frozenset[int], attack: Callable[..., Any], args: tuple[Any, ...]
) -> Any:
    enter_namespaces(pid=False, mount=True)
    fd = os.open(host_lock, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    host_inode = os.fstat(fd).st_ino
    try:
        mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777,size=4m")
        WORKLOAD_LOCK.mkdir()
        bind_mount(f"/proc/self/fd/{fd}", WORKLOAD_LOCK, read_only=False)
    finally:
        os.close(fd)
    _drop_caps(caps)
    effective = effective_caps()
    if effective & (1 << CAP_SYS_ADMIN) or effective != sum(1 << cap for cap in caps):
        raise AssertionError(f"workload capabilities {effective:#x} are not the ones asked for")
    if os.stat(WORKLOAD_LOCK).st_ino != host_inode:
        raise AssertionError("the workload's /tmp/vgpulock is not the host directory")
    return attack(*args)


def as_workload(
    host_lock: Path,
    attack: Callable[..., Any],
    *args: Any,
    caps: frozenset[int] = DEFAULT_CAPS,
) -> Any:
    """Run ``attack(*args)`` as a root workload that has ``host_lock`` at ``/tmp/vgpulock``.

    Args:
        host_lock: the host-side lock parent (must exist).
        attack: a plain function (no trio, no threads) acting on :data:`WORKLOAD_LOCK`.
        caps: the workload's capabilities (default: the runtime's default set; pass an
            empty set for a pod that drops ALL).

    Returns:
        What ``attack`` returned.

    Raises:
        tests.sandbox.ChildError: the set-up or the attack failed in the child.
    """
    return run_in_child(_workload_main, str(host_lock), caps, attack, args).value
