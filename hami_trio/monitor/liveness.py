"""Is a host PID alive?  The one system call behind ``hami_trio_container_processes``.

How this works: a slot's host PID means something only in the host's (the initial) PID
namespace.  :func:`in_host_pid_namespace` compares the inode of ``/proc/self/ns/pid`` with
the kernel's fixed inode of the initial PID namespace (``PROC_PID_INIT_INO``, 0xEFFFFFFC in
``include/linux/proc_ns.h``); the chart runs the agent with ``hostPID: true``.  There,
:func:`pid_alive` is ``kill(pid, 0)``: no signal is sent, ``ESRCH`` means no such process
(``EPERM`` means it exists); when a tick has many distinct host PIDs, :func:`live_pids` lists
``/proc`` once instead (its numeric names are the processes; threads are not listed, and a
slot's host PID is a process).  Outside the host PID namespace the monitor asks nothing and
reports no process as exited.  docs/monitor.md (Processes and feedback state).
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["PROC_PID_INIT_INO", "in_host_pid_namespace", "live_pids", "pid_alive"]

#: The inode of the initial PID namespace's ``/proc/<pid>/ns/pid`` (fixed since Linux 3.8).
PROC_PID_INIT_INO: Final = 0xEFFFFFFC


def in_host_pid_namespace(ns_path: str = "/proc/self/ns/pid") -> bool:
    """Whether this process lives in the initial (host) PID namespace.

    Returns False when ``ns_path`` cannot be read (no ``/proc``): better "cannot tell" than
    calling live processes exited.
    """
    try:
        return os.stat(ns_path).st_ino == PROC_PID_INIT_INO
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists in our PID namespace (``kill(pid, 0)``).

    Only PIDs above 0 are asked (0 and negative numbers name process groups).  A zombie
    (exited, not yet reaped by its parent) still exists.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours to signal
    return True


def live_pids(proc: str = "/proc") -> frozenset[int]:
    """Every process ID listed in ``proc`` (the processes of its PID namespace, zombies
    included).  Raises ``OSError`` when it cannot be listed."""
    return frozenset(map(int, filter(str.isdigit, os.listdir(proc))))
