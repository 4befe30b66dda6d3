"""What a pod gives each of its containers, for the feedback (pure).

How this works: :func:`pod_grants` is what the agent hands the monitor with Kubernetes on
(:mod:`hami_trio.monitor.scope`).  A pod's ``hami.io/vgpu-devices-allocated`` annotation,
written by HAMi's scheduler before the pod runs, says which GPUs each container got; its
spec's ``CUDA_TASK_PRIORITY`` (:attr:`~hami_trio.pods.source.PodInfo.priorities`) says its
priority.  Neither can be changed from inside the container, unlike its ``.cache`` file.
Each allocated UUID becomes the 96-byte slot value HAMi-core writes for it (UTF-8,
NUL-padded), so an honest file's slots equal its grant's.  A pod without the annotation, or
with one that does not decode (the pod collector counts and logs that), gives no grants:
its containers' files count alone, as upstream.  A pod whose annotation the pod watch had
to leave out (too long, or the whole pod too large to keep) gives its containers nothing:
a pod made too large must not earn the trust upstream gives a pod without an allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hami_trio.monitor.feedback import Grant
from hami_trio.pods.allocated import ALLOCATED_ANNOTATION, named_allocations
from hami_trio.pods.source import PodInfo

__all__ = ["pod_grants", "slot_value"]

#: A UUID slot of HAMi-core's region, in bytes.
_SLOT: Final = 96


def slot_value(uuid: str) -> bytes | None:
    """The UUID slot value HAMi-core writes for ``uuid`` (None: longer than a slot)."""
    raw = uuid.encode("utf-8", "surrogatepass")
    return raw.ljust(_SLOT, b"\0") if len(raw) <= _SLOT else None


def pod_grants(pod: PodInfo) -> Mapping[str, Grant] | None:
    """Container name -> its :class:`~hami_trio.monitor.feedback.Grant`; None when the pod
    has no allocation annotation or it does not decode; an empty grant for each container
    when the pod watch withheld the annotation.

    Every container named in the pod spec gets a grant (one the annotation gives nothing
    has no devices); a container the spec does not name gets none here, and the monitor
    counts it on no GPU either.
    """
    if ALLOCATED_ANNOTATION in pod.withheld:
        # It has an allocation the watch could not keep: count its containers on no GPU.
        return {name: Grant(devices=(), priority=None) for name in pod.containers}
    named = named_allocations(pod.annotations, pod.init_containers, pod.containers)
    if named is None:
        return None
    devices: dict[str, list[bytes]] = {name: [] for name in (*pod.init_containers, *pod.containers)}
    for entry in named:
        value = slot_value(entry.device.uuid)
        if value is not None:
            devices[entry.container].append(value)
    priorities = pod.priorities
    return {
        name: Grant(devices=tuple(values), priority=priorities.get(name))
        for name, values in devices.items()
    }
