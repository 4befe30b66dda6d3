#!/usr/bin/env python3
"""Storm benchmark: N C clients released at once against the real Python broker.

What it measures: the situation HAMi-core's broker exists for - hundreds of CUDA processes
calling ``cuInit()`` at the same moment.  ``hostpid-client --storm N`` (clients/c) forks N
processes that wait on one pipe and releases them together; each runs the full client
(directory/socket/mount/peer checks, one 500 ms deadline) against ``hami-trio broker``.  The
clients run as in a container: uid 65534, their own PID namespace, the broker directory
bind-mounted read-only (tests/clients/harness.py builds that sandbox).

It prints, per storm size, every run's wall time (release -> last answer) and per-client
latency, the medians, and the environment.  A run counts only if every client succeeded and
got a distinct host PID.  Goal: 1000 clients in under 1 s on the 2-core
development machine.  Figures are noisy when other work shares the machine: compare medians,
and rerun on a quiet machine before quoting them.

Run as root from the repository root::

    .venv/bin/python bench/client_storm.py [--sizes 300 1000] [--runs 5]

Each run writes a results directory (bench/_results.py): every storm's raw output, the exact
sandbox command lines, the environment, ``summary.md`` and ``SHA256SUMS``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._results import Results, loadavg  # noqa: E402  (needs the repository on sys.path)
from bench._storm import run_sandboxed, sandbox_with_broker  # noqa: E402
from tests.clients.harness import (  # noqa: E402
    build_c_client,
    c_client_build_command,
)
from tests.sandbox import world_readable_dir  # noqa: E402


def environment(res: Results) -> list[str]:
    """Lines describing the machine and the software under test."""
    env = res.environment
    trio_version = env["packages"].get("trio", "not installed")
    return [
        f"cpu: {env['cpu_model']} x{env['cpu_count']}",
        f"kernel: {env['kernel'].split()[1]}",
        f"python: {env['python'].split()[0]}  trio: {trio_version}",
        f"git: {res.git.label()}",
        f"loadavg: {env['loadavg_start']}",
        f"results: {res.path}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--results-root",
        type=Path,
        help="where the results directory goes (default bench/results)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (namespaces, bind mounts, setpriv)", file=sys.stderr)
        return 2
    failed = False
    rows: list[list[object]] = []
    figures: dict[str, object] = {}
    with Results("client_storm", root=args.results_root) as res, res.tee():
        for line in environment(res):
            print(line)
        with world_readable_dir("ht-bench-") as bindir:
            client = build_c_client(bindir)
            res.note_command(
                c_client_build_command(bindir),
                name="build-hostpid-client",
                returncode=0,
                seconds=None,
            )
            with sandbox_with_broker(res) as box:
                for size in args.sizes:
                    walls: list[float] = []
                    p99s: list[float] = []
                    for number in range(args.runs):
                        run, report = run_sandboxed(
                            res,
                            box,
                            [str(client), "--storm", str(size), str(box.client_socket)],
                            name=f"storm-c-n{size}-run{number}",
                            env={"PATH": "/usr/bin:/bin", "LIBVGPU_HOSTPID_BROKER": "1"},
                            timeout=120,
                        )
                        print(f"  N={size}: {run.stdout.strip().replace(chr(10), ' | ')}")
                        if run.returncode != 0 or report is None or not report.all_ok:
                            failed = True
                            print(f"  run failed: {run.stderr.strip()}")
                            continue
                        walls.append(report.wall_ms)
                        p99s.append(report.p99_ms)
                    if walls:
                        median_wall = statistics.median(walls)
                        print(
                            f"N={size}: median wall {median_wall:.1f} ms "
                            f"(min {min(walls):.1f}, max {max(walls):.1f}, {len(walls)} runs), "
                            f"median client p99 {statistics.median(p99s):.1f} ms"
                        )
                        figures[f"storm_n{size}_median_wall_ms"] = round(median_wall, 1)
                        rows.append(
                            [
                                size,
                                f"{len(walls)}/{args.runs}",
                                f"{median_wall:.1f}",
                                f"{min(walls):.1f}-{max(walls):.1f}",
                                f"{statistics.median(p99s):.1f}",
                            ]
                        )
                    else:
                        rows.append([size, f"0/{args.runs}", "-", "-", "-"])
        print(f"loadavg after: {loadavg()}")
        res.summary(
            "Client storm: N C clients released at once against hami-trio broker",
            headers=[
                "clients",
                "runs all answered",
                "median wall ms",
                "range ms",
                "median client p99 ms",
            ],
            rows=rows,
            figures=figures,
            notes=[
                "wall: release of the storm -> last answer; every client runs as uid 65534 "
                "in its own PID namespace behind a read-only bind mount (the container setup).",
                "A run counts only if every client got an answer and every PID is distinct. "
                "Goal: 1000 clients in under 1 s.",
            ],
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
