"""``hami-trio status``: what the running agent knows, per container, as a table.

How this works: it resolves the debug address (``--address``, else
``HAMI_TRIO_DEBUG_BIND_ADDRESS``, which ``kubectl exec`` into the agent's pod inherits, else
``127.0.0.1:9395``), GETs ``/debug/state`` (:func:`~hami_trio.agent.status.fetch_state`) and
prints the JSON as it came (``--json``) or the table of
:func:`~hami_trio.agent.status.format_status`.  Exit 0 when it got an answer, 1 when the agent
cannot be reached or answers something else, 2 for a bad address or timeout.  docs/debug.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from hami_trio.agent.config import DEFAULT_DEBUG_BIND_ADDRESS
from hami_trio.agent.status import DEBUG_ENV, fetch_state, format_status, status_address
from hami_trio.errors import ConfigError

__all__ = ["register"]


def _cmd_status(args: argparse.Namespace) -> int:
    timeout = float(args.timeout)
    if not (math.isfinite(timeout) and 0 < timeout <= 600):
        raise ConfigError(f"--timeout: {args.timeout} is not a number of seconds in (0, 600]")
    address = status_address(args.address, os.environ)
    document = fetch_state(address, timeout=timeout, namespace=args.namespace, pod=args.pod)
    if args.json:
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_status(document))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``status`` subcommand."""
    parser = subparsers.add_parser(
        "status",
        help="show what the running agent knows per container (run it in the agent's pod)",
        description=(
            "Ask the running agent's debug view (/debug/state) and print one row per device of "
            "each container directory: identity (or why unknown), format, used/limit MiB, SM "
            "utilisation, core limit, priority, blocking, processes by state, allocation and "
            "export state, with the reasons under it.  Run it where the debug address is "
            "reachable: kubectl exec -n <ns> <agent pod> -- hami-trio status."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the JSON document as it came")
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help=f"the agent's debug address (default: ${DEBUG_ENV}, else "
        f"{DEFAULT_DEBUG_BIND_ADDRESS})",
    )
    parser.add_argument("--namespace", help="only the containers of this namespace")
    parser.add_argument(
        "--pod", help="only the containers of pods of this name (narrow with --namespace)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="for connecting and for each read of the answer (default: %(default)s)",
    )
    parser.set_defaults(func=_cmd_status)
