"""``hami-trio demo``: the whole agent on this machine with simulated HAMi-core workloads.

One command for someone who has never seen a GPU cluster: it starts the agent (host PID
broker, vGPU monitor, ``/metrics``) on a private temporary root and N simulated workloads,
each a separate process in a container-like sandbox that behaves like a CUDA process under
HAMi-core.  A live table shows what the agent sees; the summary at the end shows what
happened (host PIDs from the broker, priority blocking, the MIG pause).  See docs/demo.md.

Exit status: 0 when every check of the summary held, 1 when one did not (or the demo could
not start), 2 for bad flags, 130 when interrupted (Ctrl-C), after a clean shutdown.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from hami_trio.goparse import parse_bind_address

__all__ = ["register"]


def _cmd_demo(args: argparse.Namespace) -> int:
    import trio

    from hami_trio.demo.agent import serve_demo_agent
    from hami_trio.demo.runner import DemoOptions, run_demo

    options = DemoOptions(
        workloads=args.workloads,
        duration=args.duration,
        interval=args.interval,
        root=args.root,
        metrics_bind=parse_bind_address(args.metrics_bind_address),
        summary_json=args.summary_json,
    )
    summary = trio.run(partial(run_demo, options, serve_agent=serve_demo_agent))
    if summary["interrupted"]:
        return 130
    return 0 if summary["ok"] else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo``."""
    demo = subparsers.add_parser(
        "demo",
        help="run the whole agent locally with simulated HAMi-core workloads (no GPU, no "
        "cluster needed)",
        description=(
            "Start the agent (broker, monitor, /metrics) on a private root and N simulated "
            "HAMi-core workloads in container-like sandboxes; show a live table, create the "
            "MIG lock at 40 % of the run and remove it at 60 %, then summarise.  Best as root "
            "(as CI runs it); otherwise each workload needs an unprivileged user namespace."
        ),
    )
    demo.add_argument(
        "--workloads", type=int, default=5, metavar="N", help="simulated workloads (default 5)"
    )
    demo.add_argument(
        "--duration", type=float, default=30.0, metavar="S", help="seconds of the run (default 30)"
    )
    demo.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="the monitor's tick interval (default 1; the agent's own default is 5)",
    )
    demo.add_argument(
        "--root",
        type=Path,
        metavar="DIR",
        help="keep everything in DIR (must be empty or absent; kept afterwards) instead of a "
        "temporary directory",
    )
    demo.add_argument(
        "--metrics-bind-address",
        default="127.0.0.1:0",
        metavar="ADDR",
        help="where the agent serves /metrics (default 127.0.0.1:0 = a free port)",
    )
    demo.add_argument(
        "--summary-json", type=Path, metavar="PATH", help="also write the summary as JSON to PATH"
    )
    demo.set_defaults(func=_cmd_demo)
