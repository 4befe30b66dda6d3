"""``hami-trio inspect`` and ``hami-trio monitor``: the monitor core from the command line.

``inspect FILE [--json]`` reads one ``.cache`` file read-only (never following a symlink,
never blocking on a FIFO) and prints what the monitor would see: the format, the control
words and, per device, the limits and the sums over the live process slots.  A file that
does not load exits 1 with the loader's reason.

``monitor --hook-path DIR`` runs the feedback loop in the foreground until SIGINT/SIGTERM,
which finish the current tick and exit 0.  Without a Kubernetes pod watch in this build it
needs ``--no-kubernetes`` (every container directory counts as live, nothing is deleted);
the metrics endpoint is added by the metrics work.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import trio

from hami_trio.errors import ConfigError
from hami_trio.logs import configure_logging
from hami_trio.monitor.layout import Format
from hami_trio.monitor.loop import Monitor, MonitorConfig
from hami_trio.monitor.podsource import StaticPodSource
from hami_trio.monitor.region import read_region_file
from hami_trio.monitor.usage import UsageSnapshot

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


async def _run_monitor(config: MonitorConfig) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        monitor = Monitor(config, pod_source=StaticPodSource())
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    print(
                        f"hami-trio monitor: {signal.Signals(signum).name}, stopping after "
                        "the current tick",
                        file=sys.stderr,
                    )
                    monitor.request_stop()
                    return

            nursery.start_soon(stop_on_signal)
            await monitor.serve()
            nursery.cancel_scope.cancel()


def _cmd_monitor(args: argparse.Namespace) -> int:
    if not args.no_kubernetes:
        raise ConfigError(
            "the Kubernetes pod watch is not part of this build yet: pass --no-kubernetes "
            "(every container directory is treated as live and nothing is deleted)"
        )
    config = MonitorConfig.from_env(
        os.environ,
        hook_path=args.hook_path,
        interval=args.interval,
        mig_lock_path=args.mig_lock_path,
    )
    configure_logging(args.log_format, args.log_level)
    trio.run(_run_monitor, config)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``inspect`` and ``monitor``."""
    inspect = subparsers.add_parser(
        "inspect",
        help="print one HAMi-core .cache file (format, control words, per-device usage)",
        description="Read one HAMi-core shared-region file read-only and print it.",
    )
    inspect.add_argument("file", help="the .cache file")
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
    monitor.add_argument(
        "--hook-path", metavar="DIR", help="HAMi hook directory (default: $HOOK_PATH)"
    )
    monitor.add_argument(
        "--no-kubernetes",
        action="store_true",
        help="no pod watch: every container directory is live, none is ever deleted",
    )
    monitor.add_argument(
        "--interval", type=float, metavar="S", help="seconds between ticks (default 5)"
    )
    monitor.add_argument(
        "--mig-lock-path",
        metavar="P",
        help="MIG apply lock file (default /tmp/hami/hami-mig-apply.lock)",
    )
    monitor.add_argument("--log-format", choices=["text", "json"], default="text")
    monitor.add_argument("--log-level", default="info", help="debug, info, warning, error")
    monitor.set_defaults(func=_cmd_monitor)
