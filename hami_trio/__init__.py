"""hami-trio: the node agent for HAMi GPU sharing on Kubernetes, built on trio.

One process, one trio nursery: the host PID broker, the vGPU monitor, the pod watch and the
Prometheus endpoint.  This namespace only re-exports the public API; the implementation
lives in the subpackages (``broker``, ``allocation``, ``monitor``) and a test checks that
everything listed in ``__all__`` exists.  Only the errors and the Go-value parsers load with
the namespace; every other name loads its module on first use (``hami_trio._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hami_trio._version import __version__
from hami_trio.errors import (
    AgentError,
    BrokerError,
    BrokerStartupError,
    CacheFileRejected,
    ConfigError,
    DemoError,
    HamiTrioError,
    LockDirError,
    PodSourceError,
)
from hami_trio.goparse import broker_switch_on, parse_bind_address, parse_go_duration

if TYPE_CHECKING:
    from hami_trio.agent.config import AgentConfig, resolve_config
    from hami_trio.agent.service import AgentHandle, run_agent, serve_agent
    from hami_trio.allocation import (
        ContainerAllocateResponse,
        Mount,
        allocate,
        configure_host_pid_broker,
        prepare_lock_parent,
    )
    from hami_trio.broker import BrokerConfig, BrokerHandle, serve_broker
    from hami_trio.broker.client import NoAnswer, query_host_pid
    from hami_trio.monitor import Monitor, MonitorConfig, serve_monitor
else:
    # Loaded on first use: `import hami_trio.<anything>` runs this file, and importing the
    # agent, the broker server and the monitor here would cost every command (and the
    # monitor alone) the whole package.  The same names as the block above.
    from hami_trio._lazy import lazy_exports as _lazy_exports

    __getattr__, __dir__ = _lazy_exports(
        globals(),
        {
            "hami_trio.agent.config": ("AgentConfig", "resolve_config"),
            "hami_trio.agent.service": ("AgentHandle", "run_agent", "serve_agent"),
            "hami_trio.allocation": (
                "ContainerAllocateResponse",
                "Mount",
                "allocate",
                "configure_host_pid_broker",
                "prepare_lock_parent",
            ),
            "hami_trio.broker": ("BrokerConfig", "BrokerHandle", "serve_broker"),
            "hami_trio.broker.client": ("NoAnswer", "query_host_pid"),
            "hami_trio.monitor": ("Monitor", "MonitorConfig", "serve_monitor"),
        },
    )

__all__ = [
    "AgentConfig",
    "AgentError",
    "AgentHandle",
    "BrokerConfig",
    "BrokerError",
    "BrokerHandle",
    "BrokerStartupError",
    "CacheFileRejected",
    "ConfigError",
    "ContainerAllocateResponse",
    "DemoError",
    "HamiTrioError",
    "LockDirError",
    "Monitor",
    "MonitorConfig",
    "Mount",
    "NoAnswer",
    "PodSourceError",
    "__version__",
    "allocate",
    "broker_switch_on",
    "configure_host_pid_broker",
    "parse_bind_address",
    "parse_go_duration",
    "prepare_lock_parent",
    "query_host_pid",
    "resolve_config",
    "run_agent",
    "serve_agent",
    "serve_broker",
    "serve_monitor",
]
