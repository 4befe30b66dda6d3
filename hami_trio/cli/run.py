"""``hami-trio run``: the node agent in the foreground - the DaemonSet's entrypoint.

How this works: the flags and their environment fallbacks (:mod:`hami_trio.agent.config`)
resolve into one :class:`~hami_trio.agent.config.AgentConfig`; ``--print-config`` prints it
as JSON and exits 0.  Otherwise the hook directory is checked, logging configured, the
warnings logged, and :func:`~hami_trio.agent.service.run_agent` runs under ``trio.run`` until
SIGTERM or SIGINT.  Exit 0 after a signal, 1 when a task could not start or failed (one line
naming it), 2 for an invalid flag or variable.  ``hami-trio monitor`` shares
:func:`run_agent_process`, so the two commands cannot drift apart.  docs/operations.md
(Stopping, failures and exit codes).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from hami_trio._trio import freeze_startup_objects, raise_young_gc_threshold
from hami_trio.agent.config import (
    SETTINGS,
    AgentConfig,
    add_agent_arguments,
    check_host,
    resolve_config,
)
from hami_trio.errors import ConfigError
from hami_trio.logs import configure_logging

if TYPE_CHECKING:
    from hami_trio.metrics.hostgpu import NvmlLibrary

__all__ = ["register", "run_agent_process", "used_paths"]

logger = logging.getLogger(__name__)


def run_agent_process(config: AgentConfig, *, nvml: NvmlLibrary | None = None) -> int:
    """Run the agent as this process's main program until a signal stops it.

    Checks the host, configures logging, logs the configuration's warnings, freezes the
    start-up objects out of the garbage collector's reach, raises the youngest generation's
    threshold and runs
    :func:`~hami_trio.agent.service.run_agent` under ``trio.run``.

    Returns:
        0 once stopped by a signal.

    Raises:
        ConfigError: the hook directory does not exist.
        HamiTrioError: a task could not start, or failed (its traceback is logged at debug).
    """
    from hami_trio.agent.service import run_agent

    check_host(config)
    configure_logging(config.log_format, config.log_level)
    for warning in config.warnings:
        logger.warning("%s", warning, extra={"event": "config_warning"})
    freeze_startup_objects()
    raise_young_gc_threshold()  # the monitor's ticks: docs/monitor.md (Garbage collection)
    # A failing task's traceback is logged at debug level by serve_agent; the CLI prints the
    # error itself as one line.
    trio.run(partial(run_agent, config, nvml=nvml))
    return 0


def used_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(flag or variable, path)`` of every path ``run`` or ``monitor`` uses, defaults and the
    broker's lock beside its socket included: what an error on a path is matched against
    (:mod:`hami_trio.cli.failure`)."""
    try:
        config = resolve_config(args, os.environ, with_broker=args.command == "run")
    except ConfigError:
        return []
    flags = {setting.dest: setting.flag for setting in SETTINGS}

    def origin(dest: str) -> str:
        source = config.sources.get(dest, "default")
        return f"{flags[dest]} default" if source == "default" else source

    paths = [
        (origin("hook_path"), config.monitor.hook_path),
        (origin("mig_lock_path"), config.monitor.mig_lock_path),
        (origin("lock_parent_path"), config.lock_parent_path),
    ]
    if config.kubernetes is not None and config.kubernetes.kubeconfig is not None:
        paths.append((origin("kubeconfig"), Path(config.kubernetes.kubeconfig)))
    if config.broker is not None:
        paths.append((origin("broker_socket_path"), config.broker.socket_path))
        paths.append((origin("broker_lock_path"), config.broker.resolved_lock_path))
    return [(label, str(path)) for label, path in paths]


def _cmd_run(args: argparse.Namespace) -> int:
    config = resolve_config(args, os.environ)
    if args.print_config:
        print(json.dumps(config.to_json(), indent=2))
        return 0
    return run_agent_process(config)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run the node agent (DaemonSet entrypoint): broker, monitor, pod watch, metrics",
        description=(
            "Run the hami-trio node agent until SIGTERM or SIGINT: the host PID broker (only "
            "when LIBVGPU_HOSTPID_BROKER is exactly 1), the pod watch of NODE_NAME, the vGPU "
            "monitor over $HOOK_PATH/containers and the /metrics, /healthz, /readyz endpoint, "
            "in one process.  Every flag falls back to the environment variable shown in "
            "brackets; a flag wins over its variable."
        ),
    )
    add_agent_arguments(parser, broker=True)
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (JSON: values, where each came from, warnings) "
        "and exit without starting anything",
    )
    parser.set_defaults(func=_cmd_run, paths=used_paths)
