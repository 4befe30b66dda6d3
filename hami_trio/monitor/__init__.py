"""The vGPU monitor: HAMi-core shared regions, container discovery, Observe, MIG pause.

Layers, from pure to I/O (each module opens with how it works):

- :mod:`~hami_trio.monitor.layout` - the v0/v1 byte layouts and the loader rule (pure);
- :mod:`~hami_trio.monitor.usage` - immutable :class:`UsageSnapshot` parsed from bytes (pure);
- :mod:`~hami_trio.monitor.feedback` - HAMi's Observe decisions, bounded (pure);
- :mod:`~hami_trio.monitor.region` - one tenant-owned ``.cache`` file, pread/pwrite only;
- :mod:`~hami_trio.monitor.lister` - ``$HOOK_PATH/containers`` -> one state per container;
- :mod:`~hami_trio.monitor.loop` - the tick loop, MIG lock, self-metrics;
- :mod:`~hami_trio.monitor.builder` - writes ``.cache`` files (tests, benchmarks, demo);
- :mod:`~hami_trio.monitor.podsource` - the pods the monitor knows (protocol).

This namespace re-exports what the daemon and the metrics collector use.
"""

from __future__ import annotations

from hami_trio.monitor.layout import Format, RejectReason
from hami_trio.monitor.lister import ContainerKey, ContainerState, ContainerStatus, Rejection
from hami_trio.monitor.loop import Monitor, MonitorConfig, serve_monitor
from hami_trio.monitor.podsource import PodInfo, PodSource, StaticPodSource
from hami_trio.monitor.usage import DeviceUsage, DeviceUUID, UsageSnapshot, UUIDState

__all__ = [
    "ContainerKey",
    "ContainerState",
    "ContainerStatus",
    "DeviceUUID",
    "DeviceUsage",
    "Format",
    "Monitor",
    "MonitorConfig",
    "PodInfo",
    "PodSource",
    "RejectReason",
    "Rejection",
    "StaticPodSource",
    "UUIDState",
    "UsageSnapshot",
    "serve_monitor",
]
