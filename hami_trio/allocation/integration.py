"""``allocate``: the one call a device plugin makes per HAMi-core container.

It composes the two halves of the allocation integration in the order the design requires:
first prepare the host's lock parent (file system, may refuse), then
merge the canonical mounts and the broker switch into the response (pure).  A refusal in the
first half fails the allocation - the plugin returns the error to the kubelet and the pod does
not start - so a response with an unsafe parent mount is never produced.  The preparation
runs even with the broker off: HAMi-core's fallback path takes its locks in the same directory.

The function is synchronous and does a handful of local system calls; a trio-based plugin
runs it with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

from hami_trio.allocation.constants import BROKER_HOST_DIR, LOCK_PARENT
from hami_trio.allocation.lockdir import prepare_lock_parent
from hami_trio.allocation.response import ContainerAllocateResponse, configure_host_pid_broker

__all__ = ["allocate"]


def allocate(
    response: ContainerAllocateResponse,
    *,
    broker_enabled: bool,
    lock_parent: str = LOCK_PARENT,
    owner: int = 0,
    broker_host_dir: str = BROKER_HOST_DIR,
) -> ContainerAllocateResponse:
    """Prepare the lock parent, then apply the broker mounts and env to ``response``.

    Call it for every container that gets HAMi-core (not for MIG containers), after the plugin
    has built the rest of the response.

    Args:
        response: the container's response as the plugin built it (not modified).
        broker_enabled: the broker switch; pass ``broker_switch_from_env(os.environ)`` so it
            is on only for ``LIBVGPU_HOSTPID_BROKER=1``, like the server and HAMi-core.
        lock_parent: the host directory to prepare and mount writable at ``/tmp/vgpulock``.
        owner: the UID that must own it and its parent (root; tests use their own UID).
        broker_host_dir: the broker's socket directory on the host.

    Returns:
        The merged response (see ``configure_host_pid_broker``).

    Raises:
        LockDirError: the lock parent (or, with the broker on, its nested mount point
            ``hostpid``) cannot be prepared safely; fail the allocation.  The message names
            the recovery (a :class:`~hami_trio.allocation.lockdir.LockParentRefused`), and
            the refusal is counted in ``hami_trio_lock_parent_refusals_total``.
    """
    prepared = prepare_lock_parent(lock_parent, owner, broker=broker_enabled)
    return configure_host_pid_broker(
        response,
        broker_enabled,
        lock_parent_host=prepared,
        broker_host_dir=broker_host_dir,
    )
