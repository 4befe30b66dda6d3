"""Bloated pods for the fake API server: what any pod creator can bind to a node.

:func:`add_bloated_pods` creates pods with ``spec.nodeName`` set to the node (``Failed``, so
they use no GPU and, in most clusters, no quota), each with thousands of labels and one
large ``hami.io/`` annotation, all within what the API server accepts (a label value is at
most 63 characters, all annotations of an object at most 256 KiB, an object at most about
1.5 MiB).  Half of them carry the annotation under a key the agent decodes
(``hami.io/vgpu-devices-allocated``), half under one it does not.  The pod watch tests and
the agent's soak call it on a :class:`~tests.pods.fake_kube.FakeKubeApi`, and
:func:`memory_kib` to read the agent's resident set.
"""

from __future__ import annotations

from tests.pods.fake_kube import FakeKubeApi

__all__ = [
    "BLOAT_LABEL_PREFIX",
    "BLOAT_NAMESPACE",
    "add_bloated_pods",
    "bloated_labels",
    "memory_kib",
]

BLOAT_NAMESPACE = "bloat"
BLOAT_LABEL_PREFIX = "bloat.example.com/label-"


def bloated_labels(count: int) -> dict[str, str]:
    """``count`` distinct labels of a realistic size (a 35-character key, a 40-character value)."""
    return {f"{BLOAT_LABEL_PREFIX}{i:06d}": f"value-{i:06d}-" + "v" * 27 for i in range(count)}


def add_bloated_pods(
    fake: FakeKubeApi,
    *,
    node: str = "node-a",
    count: int = 80,
    labels: int = 10_000,
    annotation_bytes: int = 200 * 1024,
    namespace: str = BLOAT_NAMESPACE,
    prefix: str = "bloat",
) -> list[str]:
    """Create ``count`` bloated pods bound to ``node``; returns their UIDs.

    Every pod is labelled ``hami.io/vgpu-node=<node>`` (so the agent exports it as a pod of
    this node) plus ``labels`` more, and has one ``annotation_bytes`` annotation: even pods
    under ``hami.io/vgpu-devices-allocated`` (a repeated, well-formed device entry), odd ones
    under ``hami.io/bloat``.
    """
    shared = bloated_labels(labels) | {"hami.io/vgpu-node": node}
    entry = "GPU-00000000-0000-0000-0000-000000000000,NVIDIA,1024,10:"
    allocated = (entry * (annotation_bytes // len(entry) + 1))[:annotation_bytes]
    junk = "x" * annotation_bytes
    uids = []
    for index in range(count):
        key, value = (
            ("hami.io/vgpu-devices-allocated", allocated)
            if index % 2 == 0
            else ("hami.io/bloat", junk)
        )
        uids.append(
            fake.add_pod(
                f"{prefix}-{index:03d}",
                node=node,
                namespace=namespace,
                labels=shared,
                annotations={key: value},
                phase="Failed",
            )
        )
    return uids


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (the peak resident set) of process ``pid``, in KiB."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found
