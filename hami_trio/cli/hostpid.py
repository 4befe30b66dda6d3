"""``hami-trio hostpid``: ask the broker for this process's host PID, as HAMi-core would.

The operator's way to verify the broker from inside a pod: it runs every check of
:func:`hami_trio.broker.client.query_host_pid` and prints either the host PID (exit 0) or
the reason there is none (exit 1) - the same reason names as the C reference client
``hostpid-client`` - with one detail line on stderr.  Like HAMi-core it honours
``LIBVGPU_HOSTPID_BROKER`` (on only for exactly ``1``) unless ``--ignore-switch`` is given, so
by default it shows what the library would do in that container.
"""

from __future__ import annotations

import argparse
import math
import sys

from hami_trio.broker.client import (
    DEFAULT_CLIENT_DEADLINE,
    DEFAULT_CLIENT_SOCKET_PATH,
    NoAnswer,
    query_host_pid,
)
from hami_trio.cli.failure import flagged
from hami_trio.errors import ConfigError

__all__ = ["register"]


def _cmd_hostpid(args: argparse.Namespace) -> int:
    deadline = float(args.deadline)
    if not (math.isfinite(deadline) and 0 < deadline <= 3600):
        raise ConfigError(f"--deadline: {args.deadline} is not a number of seconds in (0, 3600]")
    result = query_host_pid(
        args.socket_path, deadline, enabled=True if args.ignore_switch else None
    )
    if isinstance(result, NoAnswer):
        print(result.reason.value)
        line = flagged(str(result), [("--socket-path", str(args.socket_path))])
        print(f"hami-trio hostpid: {line}", file=sys.stderr)
        return 1
    print(result)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``hostpid`` subcommand."""
    parser = subparsers.add_parser(
        "hostpid",
        help="ask the host PID broker for this process's host PID (HAMi-core's checks)",
        description=(
            "Query the host PID broker with every check HAMi-core makes; print the host PID "
            "(exit 0) or the reason there is none (exit 1): missing, stale, unsafe_owner, "
            "unsafe_mode, not_socket, not_read_only, peer_not_root, malformed, timeout, "
            "refused, disabled."
        ),
    )
    parser.add_argument(
        "--socket-path",
        default=str(DEFAULT_CLIENT_SOCKET_PATH),
        metavar="PATH",
        help="the broker socket as seen from here (default: %(default)s)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_CLIENT_DEADLINE,
        metavar="SECONDS",
        help="one deadline for connect + write + read (default: %(default)s)",
    )
    parser.add_argument(
        "--ignore-switch",
        action="store_true",
        help="query even if LIBVGPU_HOSTPID_BROKER is not exactly 1",
    )
    parser.set_defaults(func=_cmd_hostpid)
