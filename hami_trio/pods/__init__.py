"""The pods on this node: the :class:`PodSource` seam, the Kubernetes watch, MIG annotations.

See docs/architecture.md for where this package sits.
"""

from __future__ import annotations

from hami_trio.pods.source import PodInfo, PodSource, StaticPodSource

__all__ = ["PodInfo", "PodSource", "StaticPodSource"]
