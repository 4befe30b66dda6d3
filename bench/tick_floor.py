#!/usr/bin/env python3
"""What every tick must do, alone, beside the real tick: the floor under any tick that lists.

Builds N v1 ``.cache`` files (bench/monitor_scale.py's tree), then, in one process and
alternately, measures the real ``Monitor.tick()`` of the checkout given by ``--code`` (a
static tree: nothing changes between ticks) and a bare loop that does only what any tick
must: list the containers directory (sorted), and per entry look up an open descriptor,
``pread`` its tail through one byte past the end and compare it with the bytes kept from
last time; and the ``pread`` s alone.  Prints the least CPU time (``time.thread_time``) of
``--rounds`` rounds of each and their ratio to the tick, with the environment.

Usage::

    .venv/bin/python bench/tick_floor.py --n 1000 --code ../base
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--code", type=Path, default=REPO)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))
    sys.path.insert(1, str(REPO))
    import trio

    from bench.monitor_scale import _uid, build_tree
    from hami_trio.monitor.layout import LAYOUTS, Format
    from hami_trio.monitor.loop import Monitor, MonitorConfig
    from hami_trio.pods.source import PodInfo, StaticPodSource

    n = args.n
    hook = Path(tempfile.mkdtemp(prefix="tick-floor-"))
    build_tree(hook, n)
    pods = StaticPodSource(
        [PodInfo(uid=_uid(i), namespace="b", name=f"p{i}", containers=("main",)) for i in range(n)]
    )
    config = MonitorConfig(hook_path=hook, mig_lock_path=hook / "mig" / "lock")
    root = str(hook / "containers")
    names = sorted(os.listdir(root))
    fds = {name: os.open(f"{root}/{name}/x.cache", os.O_RDONLY | os.O_CLOEXEC) for name in names}
    layout = LAYOUTS[Format.V1]
    size = os.fstat(next(iter(fds.values()))).st_size
    offset = layout.tail_offset
    want = size - offset + 1
    kept = {name: os.pread(fd, want, offset) for name, fd in fds.items()}

    def bare() -> int:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with os.scandir(root_fd) as it:
                entries = sorted(it, key=lambda e: e.name)
        finally:
            os.close(root_fd)
        pread, get, same = os.pread, fds.get, 0
        for entry in entries:
            fd = get(entry.name)
            if fd is not None and pread(fd, want, offset) == kept[entry.name]:
                same += 1
        return same

    def preads() -> None:
        pread = os.pread
        for fd in fds.values():
            pread(fd, want, offset)

    async def run() -> tuple[float, float, float]:
        monitor = Monitor(config, pod_source=pods)
        for _ in range(3):
            await monitor.tick()
        ticks, loops, reads = [], [], []
        clock = time.thread_time
        for _ in range(args.rounds):
            start = clock()
            await monitor.tick()
            ticks.append(clock() - start)
            start = clock()
            bare()
            loops.append(clock() - start)
            start = clock()
            preads()
            reads.append(clock() - start)
        monitor.close()
        return min(ticks), min(loops), min(reads)

    tick, loop, reads = trio.run(run)
    print(
        f"environment: python={platform.python_version()}, cpus={os.cpu_count()}, "
        f"loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}, code={args.code}"
    )
    print(f"N={n}, least of {args.rounds} rounds, CPU ms:")
    print(f"  {'tick':42} {tick * 1e3:8.2f}")
    for label, value in (("bare loop (list, lookup, pread, compare)", loop), ("preads", reads)):
        print(f"  {label:42} {value * 1e3:8.2f}  ({value / tick:.2f}x the tick)")
    for fd in fds.values():
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
