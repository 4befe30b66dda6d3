"""``hami-trio broker``: run the host PID broker alone, in the foreground.

How this works: the command builds a :class:`~hami_trio.broker.server.BrokerConfig` from its
flags and runs :func:`~hami_trio.broker.server.serve_broker` under ``trio.run``.  An explicit
command needs no ``LIBVGPU_HOSTPID_BROKER`` switch (that switch gates the broker inside the
full agent).  The first SIGTERM or SIGINT stops it gracefully (stop accepting, remove the own
socket, let in-flight exchanges finish within their deadline) and the command exits 0; a
second signal cancels what is still in flight.  A start-up refusal (unsafe directory, lock
held by another broker, live socket, ...) is one line on stderr naming the path and the
reason, exit status 1; a bad flag value exits 2.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import trio

from hami_trio._trio import freeze_startup_objects, serve_under_signals
from hami_trio.agent.config import SETTINGS_BY_NAME
from hami_trio.broker.boundary import (
    DEFAULT_SOCKET_PATH,
    LOCK_DIR_SUFFIX,
    LOCK_NAME,
    default_lock_path,
)
from hami_trio.broker.server import BrokerConfig, BrokerHandle, serve_broker
from hami_trio.errors import BrokerError, ConfigError
from hami_trio.logs import configure_logging

__all__ = ["parse_deadline", "register", "run_broker"]

#: The agent's settings this command shares, under its own flag names (no environment
#: variable: an explicit command takes its flags only).
_MAX_EXCHANGES = SETTINGS_BY_NAME["broker_max_exchanges"]
_EXCHANGE_DEADLINE = SETTINGS_BY_NAME["broker_exchange_deadline"]


def parse_deadline(text: str) -> float:
    """Parse ``--exchange-deadline``: seconds (``0.5``) or a Go duration (``500ms``), as the
    agent's ``--broker-exchange-deadline``.

    Raises:
        ConfigError: not a positive, finite duration.
    """
    value: float = _EXCHANGE_DEADLINE.value(text, "--exchange-deadline")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``broker`` subcommand."""
    parser = subparsers.add_parser(
        "broker",
        help="run the host PID broker alone in the foreground",
        description=(
            "Serve the host PID broker protocol v1 on a Unix socket until SIGTERM or SIGINT. "
            "The default socket path needs root; any other path is owned by the current user."
        ),
    )
    parser.add_argument(
        "--socket-path",
        type=Path,
        default=DEFAULT_SOCKET_PATH,
        metavar="PATH",
        help=f"Unix socket to listen on (default {DEFAULT_SOCKET_PATH})",
    )
    parser.add_argument(
        "--lock-path",
        type=Path,
        default=None,
        metavar="PATH",
        help="lock file that keeps a second broker from starting; it must not be in, below or "
        f"above the socket's directory (default <socket dir>{LOCK_DIR_SUFFIX}/{LOCK_NAME}, "
        "beside it)",
    )
    for flag, setting in (
        ("--max-exchanges", _MAX_EXCHANGES),
        ("--exchange-deadline", _EXCHANGE_DEADLINE),
    ):
        parser.add_argument(
            flag,
            metavar=setting.metavar,
            help=f"{setting.help} [as {setting.flag} of hami-trio run]",
        )
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", default="info", metavar="LEVEL")
    parser.set_defaults(func=_cmd_broker, paths=_used_paths)


def _used_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The socket and the lock (beside the socket's directory unless ``--lock-path``)."""
    if args.lock_path is not None:
        lock = ("--lock-path", str(args.lock_path))
    else:
        lock = ("--lock-path default", str(default_lock_path(args.socket_path)))
    return [("--socket-path", str(args.socket_path)), lock]


def _cmd_broker(args: argparse.Namespace) -> int:
    config = BrokerConfig(
        socket_path=args.socket_path,
        lock_path=args.lock_path,
        max_exchanges=_MAX_EXCHANGES.value(args.max_exchanges, "--max-exchanges"),
        exchange_deadline=_EXCHANGE_DEADLINE.value(args.exchange_deadline, "--exchange-deadline"),
    )
    try:
        configure_logging(args.log_format, args.log_level)
    except ValueError as exc:
        raise ConfigError(f"--log-level: {exc}") from None
    freeze_startup_objects()
    trio.run(run_broker, config)
    return 0


async def run_broker(config: BrokerConfig) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully.

    Raises:
        BrokerStartupError: the broker refused to start.
        BrokerError: the broker failed after it started.
    """
    await serve_under_signals(partial(serve_broker, config), BrokerHandle.stop, errors=BrokerError)
