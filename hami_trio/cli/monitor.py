"""``hami-trio inspect`` and ``hami-trio monitor``: the monitor core from the command line.

How this works: ``inspect FILE [--json]`` reads one ``.cache`` file read-only (never
following a symlink, never blocking on a FIFO) and prints what the monitor would see, or
exits 1 with the loader's reason.  ``monitor`` is ``hami-trio run`` without the host PID
broker - the same flags minus ``--broker-*`` and the same wiring
(:mod:`hami_trio.agent.service`): the feedback loop, the pod watch (or ``--no-kubernetes``)
and the HTTP endpoint, in the foreground until SIGINT/SIGTERM.  Start-up errors exit 1 or 2
with one line.  docs/monitor.md (Configuration, the ``inspect`` document).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from hami_trio.agent.config import add_agent_arguments
from hami_trio.monitor.layout import Format
from hami_trio.monitor.region import read_region_file
from hami_trio.monitor.snapshot import UsageSnapshot

# The pod watch (kubernetes-asyncio, aiohttp), the HTTP server (h11) and the collectors
# are imported only when ``monitor`` runs (in hami_trio.agent.service): every ``hami-trio`` command
# builds this parser, and those imports would add about half a second to each (the
# allocation command runs per container start).

__all__ = ["register", "snapshot_json"]


def snapshot_json(path: str, snapshot: UsageSnapshot) -> dict[str, Any]:
    """The ``inspect --json`` document for one snapshot (schema in docs/monitor.md)."""
    return {
        "path": path,
        "format": snapshot.format.value,
        "major": snapshot.major,
        "minor": snapshot.minor,
        "file_size": snapshot.file_size,
        "device_count": snapshot.device_count,
        "active_slots": snapshot.active_slots,
        "priority": snapshot.priority,
        "recent_kernel": snapshot.recent_kernel,
        "utilization_switch": snapshot.utilization_switch,
        "last_kernel_time": snapshot.last_kernel_time,
        "devices": [
            {
                "index": device.index,
                "uuid": device.uuid.text,
                "memory_limit": device.memory_limit,
                "sm_limit": device.sm_limit,
                "memory_total": device.memory_total,
                "context_size": device.context_size,
                "module_size": device.module_size,
                "buffer_size": device.buffer_size,
                "offset": device.offset,
                "sm_util": device.sm_util,
            }
            for device in snapshot.devices
        ],
    }


def _table(path: str, snapshot: UsageSnapshot) -> str:
    version = (
        f"{snapshot.major}.{snapshot.minor}" if snapshot.format is Format.V1 else "(none in v0)"
    )
    lines = [
        f"file               {path}",
        f"format             {snapshot.format.value}, version {version}, "
        f"{snapshot.file_size} bytes",
        f"devices            {snapshot.device_count}",
        f"process slots      {snapshot.active_slots} active (proc_num {snapshot.proc_num})",
        f"priority           {snapshot.priority}",
        f"recent_kernel      {snapshot.recent_kernel}"
        + ("  (blocked)" if snapshot.recent_kernel < 0 else ""),
        f"utilization_switch {snapshot.utilization_switch}",
        f"last_kernel_time   {snapshot.last_kernel_time}",
    ]
    if snapshot.devices:
        header = (
            f"{'dev':>3}  {'uuid':<40}  {'mem limit':>14}  {'sm%':>4}  {'mem used':>14}  "
            f"{'context':>12}  {'module':>12}  {'buffer':>14}  {'offset':>12}  {'sm util':>7}"
        )
        lines += ["", header]
        for d in snapshot.devices:
            uuid = d.uuid.text if d.uuid.text is not None else f"<{d.uuid.state.value}>"
            lines.append(
                f"{d.index:>3}  {uuid:<40}  {d.memory_limit:>14}  {d.sm_limit:>4}  "
                f"{d.memory_total:>14}  {d.context_size:>12}  {d.module_size:>12}  "
                f"{d.buffer_size:>14}  {d.offset:>12}  {d.sm_util:>7}"
            )
    return "\n".join(lines)


def _cmd_inspect(args: argparse.Namespace) -> int:
    path: str = args.file
    snapshot = read_region_file(path)
    if args.json:
        print(json.dumps(snapshot_json(path, snapshot), indent=2))
    else:
        print(_table(path, snapshot))
    return 0


def _cmd_monitor(args: argparse.Namespace) -> int:
    # The agent without the broker: one wiring for both commands (hami_trio/agent/service.py).
    from hami_trio.agent.config import resolve_config
    from hami_trio.cli.run import run_agent_process

    config = resolve_config(args, os.environ, with_broker=False)
    if args.print_config:
        print(json.dumps(config.to_json(), indent=2))
        return 0
    return run_agent_process(config)


def _used_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    from hami_trio.cli.run import used_paths

    return used_paths(args)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``inspect`` and ``monitor``."""
    inspect = subparsers.add_parser(
        "inspect",
        help="print one HAMi-core .cache file (format, control words, per-device usage)",
        description="Read one HAMi-core shared-region file read-only and print it.",
    )
    inspect.add_argument("file", metavar="FILE", help="the .cache file")
    inspect.add_argument("--json", action="store_true", help="print one JSON document")
    inspect.set_defaults(func=_cmd_inspect)

    monitor = subparsers.add_parser(
        "monitor",
        help="run the vGPU monitor feedback loop in the foreground",
        description=(
            "Watch $HOOK_PATH/containers, run HAMi's priority feedback every interval, pause "
            "while the MIG apply lock exists.  HAMI_RESYNC_INTERVAL (Go duration, default "
            "5m) sets how long directories of vanished pods are kept."
        ),
    )
    add_agent_arguments(monitor, broker=False)
    monitor.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (JSON: values, where each came from, warnings) "
        "and exit without starting anything",
    )
    monitor.set_defaults(func=_cmd_monitor, paths=_used_paths)
