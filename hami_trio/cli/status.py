"""``hami-trio status``: what the running agent knows, per container, as a table.

How this works: it resolves the debug address (``--address``, else
``HAMI_TRIO_DEBUG_BIND_ADDRESS``, which ``kubectl exec`` into the agent's pod inherits, else
``127.0.0.1:9395``), GETs ``/debug/state`` (:func:`~hami_trio.agent.status.fetch_state`) and
prints the JSON as it came (``--json``) or the table of
:func:`~hami_trio.agent.status.format_status`.  Exit 0 when it got an answer, 1 when the agent
cannot be reached or answers something else (the metrics port is named as such), 2 for a bad
address or timeout.  Which agent answered (address, node, version, the PID listening there
when this host's ``/proc`` shows it) goes to stderr: on a shared host the default address may
belong to another agent.  docs/debug.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from hami_trio.agent.config import DEFAULT_DEBUG_BIND_ADDRESS
from hami_trio.agent.status import DEBUG_ENV, fetch_state, format_status, status_address
from hami_trio.errors import ConfigError, HamiTrioError
from hami_trio.goparse import BindAddress

__all__ = ["register"]


def _cmd_status(args: argparse.Namespace) -> int:
    timeout = float(args.timeout)
    if not (math.isfinite(timeout) and 0 < timeout <= 600):
        raise ConfigError(f"--timeout: {args.timeout} is not a number of seconds in (0, 600]")
    address = status_address(args.address, os.environ)
    pid = listener_pid(address.port)  # before asking: the answer is as of its moment
    try:
        document = fetch_state(address, timeout=timeout, namespace=args.namespace, pod=args.pod)
    except HamiTrioError as exc:
        if " answered 404" in str(exc) and _is_metrics_port(address, timeout):
            raise HamiTrioError(
                f"{address} is the agent's metrics port (/metrics); its debug view is on "
                f"--debug-bind-address (default {DEFAULT_DEBUG_BIND_ADDRESS}, "
                f"${DEBUG_ENV} in its pod)"
            ) from exc
        raise
    # On a shared host any agent may hold the address: say which one answered.
    sys.stderr.write(f"{answered_by(address, document, pid)}\n")
    if args.json:
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_status(document))
    return 0


def _is_metrics_port(address: BindAddress, timeout: float) -> bool:
    """Whether ``address`` serves the agent's ``/metrics`` (what a 404 there means)."""
    connection = http.client.HTTPConnection(address.host, address.port, timeout=timeout)
    try:
        connection.request("GET", "/metrics")
        reply = connection.getresponse()
        body = reply.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return reply.status == 200 and b"hami_trio_" in body


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXADDR:HEXPORT; state 0A is LISTEN; field 9 the inode.
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    return inodes


def listener_pid(port: int) -> int | None:
    """The PID of the process on this host (PID namespace) listening on TCP ``port``, if
    one can be seen in ``/proc``; None when none or several can."""
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not targets:
        return None
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in targets:
                    found.add(int(entry.name))
                    break
            except OSError:
                continue
    return found.pop() if len(found) == 1 else None


def answered_by(address: BindAddress, document: dict[str, Any], pid: int | None) -> str:
    """The line naming the agent that answered: address, node, version and, where this host's
    ``/proc`` shows it, the PID listening there (:func:`listener_pid`)."""
    where = "" if pid is None else f", pid {pid}"
    return (
        f"answered by the agent at {address}: node {document.get('node')}, "
        f"hami-trio {document.get('version')}{where}"
    )


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
    parser.add_argument("--namespace", metavar="NS", help="only the containers of this namespace")
    parser.add_argument(
        "--pod",
        metavar="NAME",
        help="only the containers of pods of this name (narrow with --namespace)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="for connecting and for each read of the answer (default: %(default)s)",
    )
    parser.set_defaults(func=_cmd_status)
