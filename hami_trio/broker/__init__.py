"""The host PID broker: tells each process its PID in the host PID namespace.

``protocol`` is the sans-I/O wire codec, ``boundary`` the filesystem boundary (directory,
lock, socket), ``server`` the trio server, ``stats`` its counters, ``client`` the client side
(what HAMi-core does); the ``hami-trio broker`` command is :mod:`hami_trio.cli.broker`.  This
package re-exports what the agent and library users need to run one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hami_trio.broker.boundary import DEFAULT_SOCKET_PATH
    from hami_trio.broker.server import BrokerConfig, BrokerHandle, serve_broker
else:
    # On first use: the client side (``broker.client``, ``hami-trio hostpid``) needs neither
    # trio nor the server.
    from hami_trio._lazy import lazy_exports as _lazy_exports

    __getattr__, __dir__ = _lazy_exports(
        globals(),
        {
            "hami_trio.broker.boundary": ("DEFAULT_SOCKET_PATH",),
            "hami_trio.broker.server": ("BrokerConfig", "BrokerHandle", "serve_broker"),
        },
    )

__all__ = ["DEFAULT_SOCKET_PATH", "BrokerConfig", "BrokerHandle", "serve_broker"]
