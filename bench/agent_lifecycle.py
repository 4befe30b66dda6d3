#!/usr/bin/env python3
"""Agent lifecycle benchmark: how long `hami-trio run` takes to become ready and to drain.

Starts the real agent as a child process (``python -m hami_trio run --log-format=json``,
``--no-kubernetes``, broker on via ``LIBVGPU_HOSTPID_BROKER=1``, monitor and metrics on
temporary paths) ``--runs`` times and reports, as medians:

- start -> ready: from ``exec`` to the structured ``ready`` event (broker listening, monitor
  ticked once, metrics bound) - what a rolling update waits for on each node;
- idle RSS right after ready (``VmRSS`` of the agent process); target <= 60 MiB,
  printed beside the figure - nothing to watch, so it is the memory floor: the interpreter,
  trio, prometheus_client and hami-trio's own modules (kubernetes-asyncio, aiohttp and
  trio-asyncio load only with the pod watch; tests/test_imports.py keeps them out);
- SIGTERM -> exit: the graceful drain (broker stops accepting and removes its socket, the
  monitor finishes its tick) with nothing in flight.

Usage::

    .venv/bin/python bench/agent_lifecycle.py [--runs 7]

It writes a results directory (bench/_results.py) like every benchmark here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._results import Results  # noqa: E402
from tests.agent.agent import AgentProcess, agent_env  # noqa: E402

#: Idle agent, RSS right after ready.
TARGET_IDLE_RSS_MIB = 60.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for PID {pid}")


def one_run(root: Path) -> tuple[float, float, float]:
    """(start->ready s, idle RSS MiB, SIGTERM->exit s) of one agent."""
    (root / "hook" / "containers").mkdir(parents=True)
    args = [
        "--no-kubernetes",
        f"--hook-path={root / 'hook'}",
        f"--broker-socket-path={root / 'broker' / 'broker.sock'}",
        f"--mig-lock-path={root / 'mig' / 'hami-mig-apply.lock'}",
        "--metrics-bind-address=127.0.0.1:0",
    ]
    start = time.perf_counter()
    with AgentProcess(args, env=agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})) as agent:
        agent.wait_ready()
        ready = time.perf_counter() - start
        rss = _rss_mib(agent.proc.pid)
        start = time.perf_counter()
        status = agent.stop()
        drain = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"agent exited {status} on SIGTERM")
    if (root / "broker" / "broker.sock").exists():
        raise SystemExit("agent left its broker socket behind")
    return ready, rss, drain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--results-root", type=Path, default=None)
    args = parser.parse_args()
    with Results("agent_lifecycle", root=args.results_root) as res, res.tee():
        readies, rsses, drains = [], [], []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="ht-agent-bench-") as tmp:
                ready, rss, drain = one_run(Path(tmp))
            print(
                f"run {i + 1}: ready {ready * 1e3:.0f} ms, RSS {rss:.1f} MiB, "
                f"drain {drain * 1e3:.0f} ms"
            )
            readies.append(ready)
            rsses.append(rss)
            drains.append(drain)
        figures = {
            "ready_median_ms": round(statistics.median(readies) * 1e3, 1),
            "idle_rss_median_mib": round(statistics.median(rsses), 1),
            "drain_median_ms": round(statistics.median(drains) * 1e3, 1),
        }
        rss_ok = figures["idle_rss_median_mib"] <= TARGET_IDLE_RSS_MIB
        print(
            f"medians over {args.runs} runs: start->ready {figures['ready_median_ms']} ms, "
            f"idle RSS {figures['idle_rss_median_mib']} MiB, "
            f"SIGTERM->exit {figures['drain_median_ms']} ms"
        )
        print(
            f"target: idle RSS {figures['idle_rss_median_mib']} MiB "
            f"(<= {TARGET_IDLE_RSS_MIB:.0f} MiB: {'met' if rss_ok else 'NOT met'})"
        )
        res.summary(
            "Agent lifecycle: start to ready, idle RSS, graceful drain",
            headers=["figure", "median", "target"],
            rows=[
                ["start -> ready", f"{figures['ready_median_ms']} ms", ""],
                [
                    "idle RSS",
                    f"{figures['idle_rss_median_mib']} MiB",
                    f"<= {TARGET_IDLE_RSS_MIB:.0f} MiB",
                ],
                ["SIGTERM -> exit", f"{figures['drain_median_ms']} ms", ""],
            ],
            figures=figures,
            notes=["hami-trio run --no-kubernetes, broker on, monitor and metrics on temp paths"],
        )
        print(f"results: {res.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
