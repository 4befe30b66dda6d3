"""The host PID broker: tells each process its PID in the host PID namespace.

``protocol`` is the sans-I/O wire codec, ``boundary`` the filesystem boundary (directory,
lock, socket), ``server`` the trio server, ``stats`` its counters, ``client`` the client side
(what HAMi-core does); the ``hami-trio broker`` command is :mod:`hami_trio.cli.broker`.  This
package re-exports what the agent and library users need to run one.
"""

from __future__ import annotations

from hami_trio.broker.boundary import DEFAULT_SOCKET_PATH
from hami_trio.broker.server import BrokerConfig, BrokerHandle, serve_broker

__all__ = ["DEFAULT_SOCKET_PATH", "BrokerConfig", "BrokerHandle", "serve_broker"]
