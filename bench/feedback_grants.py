#!/usr/bin/env python3
"""Feedback grants benchmark: what reading each file through its pod costs a tick.

N containers (one v1 region each, 8 GPUs on the node, priorities 0 and 1), each in its own
pod with a ``hami.io/vgpu-devices-allocated`` annotation and a spec priority, as the agent
sees them with Kubernetes on.  Measured in this process, process CPU time (a shared machine's
other load counts less than in wall time), best of 7 runs of 20 calls:

- ``observe``: :func:`~hami_trio.monitor.feedback.observe` alone (no Kubernetes: upstream's
  input);
- ``update``: :meth:`~hami_trio.monitor.scope.FeedbackScope.update` - each container's pod
  looked up, its grant (cached per PodInfo), honest files recognised, stray claims counted;
- ``update + observe``: what the tick runs with Kubernetes on;
- the same with 10 % of the files claiming another GPU and priority 0 (stray claims: observe
  then reads them through their grants).

``update`` is what Kubernetes adds to the tick: with honest files it hands ``observe`` no
grant, and ``observe`` does exactly what it does without Kubernetes.  Target: ``update`` at
most 1.5 us per container with honest files.

Usage::

    .venv/bin/python bench/feedback_grants.py              # N = 100, 1000, 2000
    .venv/bin/python bench/feedback_grants.py --n 1000
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._results import loadavg  # noqa: E402

GPUS = [f"GPU-{i:08d}-1111-2222-3333-444444444444" for i in range(8)]


def _best_us(fn: Callable[[], object]) -> float:
    runs = timeit.repeat(fn, number=20, repeat=7, timer=time.process_time)
    return min(runs) / 20 * 1e6


def measure(n: int, liars: float) -> dict[str, float]:
    from hami_trio.agent.grants import pod_grants
    from hami_trio.monitor.feedback import observe
    from hami_trio.monitor.scope import FeedbackScope, StrayStats
    from hami_trio.monitor.snapshot import UsageSnapshot, parse_region
    from hami_trio.monitor.state import ContainerKey
    from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
    from hami_trio.pods.source import PodInfo, StaticPodSource
    from hami_trio.testing.regions import RegionSpec, build_region

    snapshots: dict[ContainerKey, UsageSnapshot] = {}
    pods = []
    every = round(1 / liars) if liars else 0
    for i in range(n):
        gpu, priority = GPUS[i % len(GPUS)], i % 2
        claimed, said = (gpu, priority)
        if every and i % every == 0:
            claimed, said = GPUS[(i + 1) % len(GPUS)], 0  # another GPU, priority 0
        key = ContainerKey(f"uid-{i}", "main")
        region = RegionSpec(uuids=[claimed], limits=[1 << 30], priority=said, recent_kernel=2)
        snapshots[key] = parse_region(bytes(build_region(region)))
        pods.append(
            PodInfo(
                key.pod_uid,
                "ns",
                f"pod-{i}",
                containers=("main",),
                annotations={ALLOCATED_ANNOTATION: f"{gpu},NVIDIA,1024,0:;"},
                priorities={"main": priority},
            )
        )
    scope = FeedbackScope(StaticPodSource(pods), pod_grants, StrayStats(), clock=lambda: 0)
    logging.getLogger("hami_trio").setLevel(logging.ERROR)  # the stray claims' warnings
    scope.update(snapshots)  # the grant cache is warm, as from the second tick on
    return {
        "observe": _best_us(lambda: observe(snapshots)),
        "update": _best_us(lambda: scope.update(snapshots)),
        "update + observe": _best_us(lambda: observe(snapshots, scope.update(snapshots))),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="containers (repeatable)")
    args = parser.parse_args()
    sizes = args.n or [100, 1000, 2000]
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {loadavg()}; process CPU time, best of 7 x 20 calls"
    )
    print(
        f"{'N':>6} {'stray':>6} {'observe ms':>11} {'update ms':>10} {'both ms':>9} "
        f"{'update us/container':>20}"
    )
    for n in sizes:
        for liars in (0.0, 0.1):
            got = measure(n, liars)
            print(
                f"{n:>6} {liars:>6.0%} {got['observe'] / 1e3:>11.2f} {got['update'] / 1e3:>10.2f}"
                f" {got['update + observe'] / 1e3:>9.2f} {got['update'] / n:>20.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
