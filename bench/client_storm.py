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
got a distinct host PID.  Goal (issue 3): 1000 clients in under 1 s on the 2-core
development machine.  Figures are noisy when other work shares the machine: compare medians,
and rerun on a quiet machine before quoting them.

Run as root from the repository root::

    .venv/bin/python bench/client_storm.py [--sizes 300 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.clients.harness import (  # noqa: E402  (needs the repository on sys.path)
    build_c_client,
    make_sandbox,
    python_broker,
    run_in_sandbox,
)
from tests.sandbox import world_readable_dir  # noqa: E402

_LINE = re.compile(
    r"clients=(\d+) successful=(\d+) failed=(\d+) wall_ms=([\d.]+)\n"
    r"latency_ms p50=([\d.]+) p99=([\d.]+) max=([\d.]+) distinct_pids=(\d+)"
)


def environment() -> list[str]:
    """Lines describing the machine and the software under test."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    import trio

    return [
        f"cpu: {cpu} x{os.cpu_count()}",
        f"kernel: {platform.release()}",
        f"python: {platform.python_version()}  trio: {trio.__version__}",
        f"git: {rev}{' (dirty)' if dirty else ''}",
        f"loadavg: {Path('/proc/loadavg').read_text().split()[:3]}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (namespaces, bind mounts, setpriv)", file=sys.stderr)
        return 2
    for line in environment():
        print(line)
    failed = False
    with world_readable_dir("ht-bench-") as bindir:
        client = build_c_client(bindir)
        with make_sandbox() as box, python_broker(box.host_socket):
            for size in args.sizes:
                walls: list[float] = []
                p99s: list[float] = []
                for _ in range(args.runs):
                    run = run_in_sandbox(
                        box,
                        [str(client), "--storm", str(size), str(box.client_socket)],
                        env={"PATH": "/usr/bin:/bin", "LIBVGPU_HOSTPID_BROKER": "1"},
                        timeout=120,
                    )
                    match = _LINE.search(run.stdout)
                    ok = (
                        run.returncode == 0
                        and match is not None
                        and int(match.group(2)) == size
                        and int(match.group(8)) == size
                    )
                    print(f"  N={size}: {run.stdout.strip().replace(chr(10), ' | ')}")
                    if not ok or match is None:
                        failed = True
                        print(f"  run failed: {run.stderr.strip()}")
                        continue
                    walls.append(float(match.group(4)))
                    p99s.append(float(match.group(6)))
                if walls:
                    print(
                        f"N={size}: median wall {statistics.median(walls):.1f} ms "
                        f"(min {min(walls):.1f}, max {max(walls):.1f}, {len(walls)} runs), "
                        f"median client p99 {statistics.median(p99s):.1f} ms"
                    )
    print(f"loadavg after: {Path('/proc/loadavg').read_text().split()[:3]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
