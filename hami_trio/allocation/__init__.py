"""The allocation integration a device plugin calls from ``Allocate``.

- :mod:`~hami_trio.allocation.lockdir` prepares the host's ``/tmp/vgpulock`` (descriptor-based,
  refuses symlinks, foreign owners and swaps, names the recovery, counts refusals; with the
  broker on the mount point ``hostpid`` made immutable; an explicit repair; a read-only check);
- :mod:`~hami_trio.allocation.watch` is the agent's periodic read-only check (gauges);
- :mod:`~hami_trio.allocation.response` models the kubelet's ContainerAllocateResponse and
  merges the canonical mounts and the broker env switch into it (pure);
- :func:`allocate` does both, in that order;
- :mod:`~hami_trio.cli.allocate` exposes them as ``hami-trio prepare-lock-dir`` and
  ``hami-trio allocate`` for device plugins that are not written in Python.

This namespace only re-exports.
"""

from __future__ import annotations

from hami_trio.allocation.constants import (
    BROKER_CONTAINER_DIR,
    BROKER_HOST_DIR,
    LOCK_PARENT,
    container_target,
    go_clean,
)
from hami_trio.allocation.integration import allocate
from hami_trio.allocation.lockdir import (
    LOCK_PARENT_MODE,
    LockParentRefused,
    Prepared,
    inspect_lock_parent,
    prepare_lock_dir,
    prepare_lock_parent,
)
from hami_trio.allocation.response import (
    RESERVED_ENV_KEYS,
    ContainerAllocateResponse,
    DeviceSpec,
    Mount,
    configure_host_pid_broker,
)

__all__ = [
    "BROKER_CONTAINER_DIR",
    "BROKER_HOST_DIR",
    "LOCK_PARENT",
    "LOCK_PARENT_MODE",
    "RESERVED_ENV_KEYS",
    "ContainerAllocateResponse",
    "DeviceSpec",
    "LockParentRefused",
    "Mount",
    "Prepared",
    "allocate",
    "configure_host_pid_broker",
    "container_target",
    "go_clean",
    "inspect_lock_parent",
    "prepare_lock_dir",
    "prepare_lock_parent",
]
