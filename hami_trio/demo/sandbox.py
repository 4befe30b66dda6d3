"""Container-like sandboxes from real kernel objects: namespaces, bind mounts, a private /tmp.

How this works: a HAMi workload sees the broker through a read-only bind mount at
``/tmp/vgpulock/hostpid`` and its ``.cache`` file through a read-write mount of its container
directory; the demo gives each simulated workload the same view without a runtime.
:func:`enter_container` (before the workload forks, in a single-threaded process) unshares a
mount and a PID namespace (plus a user namespace mapping the caller to 0 when not root),
makes every mount private, mounts a tmpfs on ``/tmp`` and bind-mounts the two directories at
:data:`SANDBOX_BROKER_DIR` and :data:`SANDBOX_CACHE_DIR`; the forked child, PID 1, calls
:func:`mount_proc` and, as root, :func:`drop_privileges`.  A failure is an ``OSError`` naming
the call.  Why the client's checks then pass unchanged: docs/demo.md (Sandboxes).
"""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hami_trio.broker.client import DEFAULT_CLIENT_SOCKET_PATH

__all__ = [
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "NOBODY",
    "SANDBOX_BROKER_DIR",
    "SANDBOX_CACHE_DIR",
    "SandboxSpec",
    "bind_mount",
    "drop_privileges",
    "enter_container",
    "enter_namespaces",
    "mount_proc",
    "set_parent_death_signal",
]

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000

#: The unprivileged UID/GID a sandboxed root process drops to (``nobody``/``nogroup``).
NOBODY: Final = 65534

#: Where a workload finds the broker directory (HAMi-core's fixed path).
SANDBOX_BROKER_DIR: Final = DEFAULT_CLIENT_SOCKET_PATH.parent
#: Where a workload finds its container directory (its ``.cache`` file goes there).
SANDBOX_CACHE_DIR: Final = Path("/tmp/vgpu")

_MS_RDONLY: Final = 1
_MS_NOSUID: Final = 2
_MS_NODEV: Final = 4
_MS_NOEXEC: Final = 8
_MS_REMOUNT: Final = 32
_MS_NOATIME: Final = 1024
_MS_NODIRATIME: Final = 2048
_MS_BIND: Final = 4096
_MS_REC: Final = 0x4000
_MS_PRIVATE: Final = 1 << 18
_MS_RELATIME: Final = 1 << 21
_PR_SET_PDEATHSIG: Final = 1

# statvfs flags that, on a mount inside a user namespace, are locked: a read-only remount
# must repeat them or the kernel refuses it (EPERM).
_LOCKED_FLAGS: Final = (
    (os.ST_NOSUID, _MS_NOSUID),
    (os.ST_NODEV, _MS_NODEV),
    (os.ST_NOEXEC, _MS_NOEXEC),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
    (os.ST_RELATIME, _MS_RELATIME),
)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else os.fsencode(value)

    _check(
        _libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
        f"mount {source or fstype} on {target}",
    )


def set_parent_death_signal(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signum`` to this process when the thread that forked it exits.

    Raises:
        OSError: ``prctl`` failed.
    """
    _check(_libc().prctl(_PR_SET_PDEATHSIG, signum), "prctl(PR_SET_PDEATHSIG)")


def enter_namespaces(*, pid: bool, mount: bool, user: bool = False) -> None:
    """Move the calling process into new namespaces.

    A new PID namespace applies to the children forked afterwards, not to the caller.  With
    ``mount`` every mount is made private first, so nothing mounted later propagates to the
    machine's mount tree.  With ``user`` the caller's UID and GID are mapped to 0 in the new
    user namespace (what an unprivileged user may map), which gives it the capabilities to
    mount in the namespaces it owns.

    Raises:
        OSError: the kernel refused (``EPERM`` without privileges, or unprivileged user
            namespaces disabled); the message names the call.
    """
    uid, gid = os.geteuid(), os.getegid()
    flags = (
        (CLONE_NEWPID if pid else 0)
        | (CLONE_NEWNS if mount else 0)
        | (CLONE_NEWUSER if user else 0)
    )
    _check(_libc().unshare(flags), "unshare")
    if user:
        # setgroups must be denied before an unprivileged process may write its gid_map.
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    if mount:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)


def bind_mount(
    source: str | os.PathLike[str], target: str | os.PathLike[str], *, read_only: bool
) -> None:
    """Bind-mount ``source`` on ``target`` (in the caller's mount namespace).

    Read-only needs a second, remounting call; it repeats the flags the kernel locks on
    mounts inherited into a user namespace (``nosuid``, ``nodev``, ...).

    Raises:
        OSError: a mount call failed.
    """
    src, dst = os.fspath(source), os.fspath(target)
    _mount(src, dst, None, _MS_BIND)
    if read_only:
        present = os.statvfs(dst).f_flag
        keep = sum(flag for st_flag, flag in _LOCKED_FLAGS if present & st_flag)
        _mount(None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep)


def mount_proc() -> None:
    """Mount a ``/proc`` of the caller's PID namespace (call as PID 1 of a new one).

    Raises:
        OSError: the mount failed.
    """
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def drop_privileges(uid: int = NOBODY, gid: int = NOBODY) -> None:
    """Irreversibly become ``uid``/``gid`` with no supplementary groups.

    Raises:
        OSError: the caller may not change its IDs (not root).
    """
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What one workload's sandbox shows of the host.

    Attributes:
        broker_dir: the broker's directory on the host (mounted read-only at
            :data:`SANDBOX_BROKER_DIR`).
        container_dir: the workload's ``$HOOK_PATH/containers/<pod>_<ctr>`` on the host
            (mounted read-write at :data:`SANDBOX_CACHE_DIR`).
        user_namespace: also create a user namespace mapping the caller to 0 (for callers
            that are not root).
    """

    broker_dir: Path
    container_dir: Path
    user_namespace: bool = False


def enter_container(spec: SandboxSpec) -> None:
    """Enter new mount and PID namespaces and build the container's view (see the module).

    Call it in a single-threaded process, then fork: the child is PID 1 of the new PID
    namespace and should call :func:`mount_proc`.

    Raises:
        OSError: a host directory cannot be opened, or a namespace or mount call failed.
    """
    enter_namespaces(pid=True, mount=True, user=spec.user_namespace)
    # Opened in the new mount namespace (a bind source must be a mount of the caller's own
    # namespace) and before the tmpfs hides them: the demo's root is under /tmp itself.
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    broker_fd = os.open(spec.broker_dir, flags)
    try:
        container_fd = os.open(spec.container_dir, flags)
        try:
            _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=16m")
            # The layout the device plugin's allocation gives a container.
            SANDBOX_BROKER_DIR.parent.mkdir(mode=0o755)
            SANDBOX_BROKER_DIR.parent.chmod(0o1777)
            SANDBOX_BROKER_DIR.mkdir(mode=0o755)
            SANDBOX_CACHE_DIR.mkdir(mode=0o755)
            bind_mount(f"/proc/self/fd/{broker_fd}", SANDBOX_BROKER_DIR, read_only=True)
            bind_mount(f"/proc/self/fd/{container_fd}", SANDBOX_CACHE_DIR, read_only=False)
        finally:
            os.close(container_fd)
    finally:
        os.close(broker_fd)
