"""The vGPU monitor: HAMi-core shared regions, container discovery, Observe, MIG pause.

Layers, from pure to I/O (each module opens with how it works):

- :mod:`~hami_trio.monitor.layout` - the v0/v1 byte layouts and the loader rule (pure);
- :mod:`~hami_trio.monitor.snapshot` - immutable :class:`UsageSnapshot` parsed from bytes (pure);
- :mod:`~hami_trio.monitor.feedback` - HAMi's Observe decisions, bounded (pure);
- :mod:`~hami_trio.monitor.region` - one tenant-owned ``.cache`` file, pread/pwrite only;
- :mod:`~hami_trio.monitor.state` - the container values: key, status, rejection (pure);
- :mod:`~hami_trio.monitor.lister` - ``$HOOK_PATH/containers`` -> one state per container;
- :mod:`~hami_trio.monitor.loop` - the tick loop, MIG lock, self-metrics.

The pods the monitor knows come through the :class:`~hami_trio.pods.source.PodSource`
protocol the agent passes in.  This namespace re-exports what the agent uses; each name
loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hami_trio.monitor.layout import Format, RejectReason
    from hami_trio.monitor.loop import Monitor, MonitorConfig, serve_monitor
    from hami_trio.monitor.snapshot import DeviceUsage, DeviceUUID, UsageSnapshot, UUIDState
    from hami_trio.monitor.state import ContainerKey, ContainerState, ContainerStatus, Rejection
else:
    # On first use: the pure layers (layout, snapshot: ``hami-trio inspect``, the test
    # writers) need neither trio nor prometheus_client, which the loop imports.
    from hami_trio._lazy import lazy_exports as _lazy_exports

    __getattr__, __dir__ = _lazy_exports(
        globals(),
        {
            "hami_trio.monitor.layout": ("Format", "RejectReason"),
            "hami_trio.monitor.state": (
                "ContainerKey",
                "ContainerState",
                "ContainerStatus",
                "Rejection",
            ),
            "hami_trio.monitor.loop": ("Monitor", "MonitorConfig", "serve_monitor"),
            "hami_trio.monitor.snapshot": (
                "DeviceUsage",
                "DeviceUUID",
                "UsageSnapshot",
                "UUIDState",
            ),
        },
    )

__all__ = [
    "ContainerKey",
    "ContainerState",
    "ContainerStatus",
    "DeviceUUID",
    "DeviceUsage",
    "Format",
    "Monitor",
    "MonitorConfig",
    "RejectReason",
    "Rejection",
    "UUIDState",
    "UsageSnapshot",
    "serve_monitor",
]
