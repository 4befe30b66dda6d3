"""``hami-trio inspect`` and ``hami-trio monitor``: the monitor core from the command line.

``inspect FILE [--json]`` reads one ``.cache`` file read-only (never following a symlink,
never blocking on a FIFO) and prints what the monitor would see: the format, the control
words and, per device, the limits and the sums over the live process slots.  A file that
does not load exits 1 with the loader's reason.

``monitor --hook-path DIR`` runs the feedback loop in the foreground until SIGINT/SIGTERM,
which finish the current tick and exit 0.  Alongside it, in the same nursery: the Kubernetes
pod watch of ``$NODE_NAME`` (kubeconfig from ``$KUBECONFIG`` or the in-cluster service
account; ``--no-kubernetes`` runs without it: every container directory counts as live under
its pod UID and nothing is deleted), and the HTTP endpoint on ``--metrics-bind-address``
(default ``:9394``) with ``/metrics`` (upstream's names; ``--legacy-metrics`` adds the old
ones), ``/healthz`` and ``/readyz`` (monitor ticking or MIG-paused, pod watch listed).
Start-up errors (bad flags, no pod source configuration, a busy port) exit 1 or 2 with one
line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from hami_trio.config import BindAddress, parse_bind_address
from hami_trio.errors import HamiTrioError
from hami_trio.logs import configure_logging
from hami_trio.monitor.layout import Format
from hami_trio.monitor.loop import Monitor, MonitorConfig
from hami_trio.monitor.podsource import PodInfo, PodSource, StaticPodSource
from hami_trio.monitor.region import read_region_file
from hami_trio.monitor.usage import UsageSnapshot

if TYPE_CHECKING:
    from hami_trio.monitor.http import ReadinessCheck
    from hami_trio.monitor.pods import KubeAccess

# The pod watch (kubernetes-asyncio, aiohttp), the HTTP server (hypercorn) and the collectors
# are imported inside ``monitor`` only: every ``hami-trio`` command builds this parser, and
# those imports would add about half a second to each (the allocation command runs per
# container start).

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


@dataclass(frozen=True, slots=True)
class _Serving:
    """What ``monitor`` serves next to the loop (validated before trio starts)."""

    bind: BindAddress
    legacy: bool
    node: str  # the host metrics' node label
    kubernetes: KubeAccess | None  # None: --no-kubernetes


async def _run_monitor(config: MonitorConfig, serving: _Serving) -> None:
    from prometheus_client import CollectorRegistry

    from hami_trio.monitor.hostgpu import HostGpuSampler, serve_nvml_release
    from hami_trio.monitor.http import progress_check, serve_http
    from hami_trio.monitor.metrics import BuildInfoCollector, VGpuCollector
    from hami_trio.monitor.pods import KubernetesPodSource, serve_pod_watch

    registry = CollectorRegistry()
    registry.register(BuildInfoCollector())
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            pod_source: PodSource
            all_pods: Callable[[], Mapping[str, PodInfo]] | None = None
            checks: dict[str, ReadinessCheck] = {}
            if serving.kubernetes is not None:
                watch = KubernetesPodSource(serving.node, registry=registry)
                await nursery.start(serve_pod_watch, watch, serving.kubernetes)
                pod_source, all_pods = watch, watch.pods
                checks["pod-watch"] = lambda: watch.ready
            else:
                pod_source = StaticPodSource()
            monitor = Monitor(config, pod_source=pod_source, registry=registry)
            sampler = HostGpuSampler()
            registry.register(
                VGpuCollector(
                    monitor,
                    pod_source,
                    node_name=serving.node,
                    kubernetes=serving.kubernetes is not None,
                    all_pods=all_pods,
                    host=sampler,
                    legacy=serving.legacy,
                )
            )
            # A tick may take up to its deadline; three intervals without one is a stall.
            stall = 3 * config.interval + (config.tick_deadline or config.interval)
            checks["monitor"] = progress_check(
                lambda: monitor.ticks, max_stall=stall, idle=lambda: monitor.paused
            )
            await nursery.start(partial(serve_http, serving.bind, registry, checks))
            nursery.start_soon(serve_nvml_release, sampler, lambda: monitor.paused)

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


def _only_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The single exception inside nested groups, if there is exactly one."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else None


def _cmd_monitor(args: argparse.Namespace) -> int:
    from hami_trio.monitor.pods import NODE_NAME_ENV, KubeAccess, node_name_from_env

    config = MonitorConfig.from_env(
        os.environ,
        hook_path=args.hook_path,
        interval=args.interval,
        mig_lock_path=args.mig_lock_path,
    )
    bind = parse_bind_address(args.metrics_bind_address)
    if args.no_kubernetes:
        # Host metrics still carry a node label: NODE_NAME when set, else the host name.
        node = os.environ.get(NODE_NAME_ENV) or socket.gethostname()
        access = None
    else:
        node = node_name_from_env(os.environ)
        access = KubeAccess.from_env(os.environ)
    configure_logging(args.log_format, args.log_level)
    try:
        trio.run(_run_monitor, config, _Serving(bind, args.legacy_metrics, node, access))
    except BaseExceptionGroup as group:
        # Start-up errors of a task (a busy port, an invalid kubeconfig) come out of the
        # nursery wrapped; report them as the one clear line they are.
        only = _only_error(group)
        if isinstance(only, HamiTrioError):
            raise only from None
        raise
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
        help="no pod watch: every container directory is live under its pod UID, none is "
        "ever deleted (default: watch the pods of $NODE_NAME via $KUBECONFIG or the "
        "in-cluster service account)",
    )
    monitor.add_argument(
        "--metrics-bind-address",
        default=":9394",
        metavar="ADDR",
        help="host:port of /metrics, /healthz and /readyz; ':9394' = every interface, port 0 "
        "= any free port (default :9394)",
    )
    monitor.add_argument(
        "--legacy-metrics",
        action="store_true",
        help="also export HAMi's legacy metric names and labels (vGPU_device_memory_usage_"
        "in_bytes, ...)",
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
