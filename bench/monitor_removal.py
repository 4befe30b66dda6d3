#!/usr/bin/env python3
"""Removal benchmark: what removing a gone pod's huge directory costs the running monitor.

Builds ``$HOOK_PATH/containers`` with ``--live`` live containers (v1 ``.cache`` files whose
pods exist) and one gone pod's directory holding ``--files`` empty files (40-character
names) or, with ``--depth``, a chain of that many nested directories; its mtime is older
than the resync interval and the pod source is authoritative, so the first tick decides to
remove it.  Then it serves the real :class:`~hami_trio.monitor.loop.Monitor` (real clock,
``--interval``) until the directory is gone and reports:

- ``tick_max_s`` / ``tick_p50_s``: wall time of the ticks while the removal ran (the old
  code removed inside the tick: one tick lasted as long as the whole ``rmtree``);
- ``loop_lag_max_s`` / ``loop_lag_p99_s``: how late a 1 ms heartbeat task woke up (what the
  broker's and the metrics server's tasks would see);
- ``removal_s`` and ``ticks_during_removal``: until the directory was gone;
- ``rss_growth_mib``: peak RSS over the RSS after set-up.

``--churn N`` measures the other case, many ordinary directories: ``N`` gone pods' container
directories of the usual shape (two ``.cache`` files of a region's size, about 2 MB, written
in full unless ``--sparse``) beside the live containers.  One tick of the real
:class:`~hami_trio.monitor.lister.ContainerLister` schedules them all, then its removal steps
run back to back with the default budget (what ``RemovalQueue.serve`` runs after each tick)
until none is left, and it reports:

- ``steps`` and ``directories_per_step``: how many directories one step (one tick) removes;
- ``removal_s`` and ``directories_per_s``: the steps' own wall time, and the throughput
  while removing (the directories of the usual shape a second this machine removes);
- ``ceiling_per_s_at_5s_interval``: ``directories_per_step / 5``, what one step per tick at
  the default interval keeps up with (the code before the change: 0.2).

``--src DIR`` measures the ``hami_trio`` package in ``DIR`` instead of this checkout, e.g. the
code before the change: ``git archive <rev> hami_trio | tar -x -C /tmp/old`` then
``--src /tmp/old``.  The trees go to ``/dev/shm`` when it exists (``--dir`` to choose): on a
slow disk building 200,000 files takes minutes and the figure would be the disk's.

Usage::

    .venv/bin/python bench/monitor_removal.py                       # 200,000 files
    .venv/bin/python bench/monitor_removal.py --depth 5000          # a deep chain
    .venv/bin/python bench/monitor_removal.py --src /tmp/old --json
    .venv/bin/python bench/monitor_removal.py --churn 2000            # ordinary directories
    .venv/bin/python bench/monitor_removal.py --churn 2000 --dir /var/tmp   # on the disk
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _import_path(src: str | None) -> None:
    sys.path.insert(0, src if src is not None else str(REPO))


def _build(base: Path, files: int, depth: int, live: int) -> tuple[Path, list[str]]:
    from hami_trio.testing.regions import RegionSpec, write_region

    containers = base / "hook" / "containers"
    containers.mkdir(parents=True)
    uids = []
    for index in range(live):
        uid = f"live{index:04d}"
        uids.append(uid)
        directory = containers / f"{uid}_main"
        directory.mkdir()
        write_region(directory / "x.cache", RegionSpec(priority=index % 2, uuids=["GPU-0"]))
    gone = containers / "gone0000_main"
    gone.mkdir()
    fd = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for index in range(files):
            os.close(os.open(f"{index:040d}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    old = time.time() - 3600
    os.utime(gone, (old, old))
    return gone, uids


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    import trio

    from hami_trio.monitor.loop import Monitor, MonitorConfig
    from hami_trio.pods.source import PodInfo, StaticPodSource

    gone, uids = _build(base, args.files, args.depth, args.live)
    config = MonitorConfig(
        hook_path=base / "hook",
        interval=args.interval,
        resync_interval=60,
        mig_lock_path=base / "mig" / "hami-mig-apply.lock",
    )
    source = StaticPodSource([PodInfo(uid=uid, namespace="bench", name=uid) for uid in uids])
    monitor = Monitor(config, pod_source=source)
    ticks: list[float] = []
    lags: list[float] = []
    original = monitor.tick

    async def timed_tick() -> int:
        started = time.perf_counter()
        try:
            return await original()
        finally:
            ticks.append(time.perf_counter() - started)

    monitor.tick = timed_tick  # type: ignore[method-assign]
    rss_before = _rss_mib()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    async def heartbeat() -> None:
        while True:
            started = time.perf_counter()
            await trio.sleep(0.001)
            lags.append(time.perf_counter() - started - 0.001)

    async def main() -> float:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat)
            nursery.start_soon(monitor.serve)
            # Polls a path: no event to wait for.
            while os.path.lexists(gone) and time.perf_counter() - started < args.timeout:  # noqa: ASYNC110, ASYNC240
                await trio.sleep(0.01)
            elapsed = time.perf_counter() - started
            monitor.request_stop()
            await trio.sleep(args.interval)  # let the last tick finish
            nursery.cancel_scope.cancel()
        return elapsed

    removal = trio.run(main)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "files": args.files,
        "depth": args.depth,
        "live_containers": args.live,
        "interval_s": args.interval,
        "removed": not os.path.lexists(gone),
        "removal_s": round(removal, 3),
        "ticks_during_removal": len(ticks),
        "tick_max_s": round(max(ticks, default=0.0), 4),
        "tick_p50_s": round(statistics.median(ticks) if ticks else 0.0, 4),
        "loop_lag_max_s": round(max(lags, default=0.0), 4),
        "loop_lag_p99_s": round(_quantile(lags, 0.99), 4),
        "rss_growth_mib": round(max(peak, peak_before) - rss_before, 1),
    }


def _build_churn(base: Path, count: int, live: int, sparse: bool) -> tuple[Path, list[str]]:
    from hami_trio.testing.regions import RegionSpec, build_region, write_region

    containers = base / "hook" / "containers"
    containers.mkdir(parents=True)
    uids = []
    for index in range(live):
        uid = f"live{index:04d}"
        uids.append(uid)
        (containers / f"{uid}_main").mkdir()
        write_region(containers / f"{uid}_main" / "x.cache", RegionSpec(uuids=["GPU-0"]))
    region = build_region(RegionSpec(uuids=["GPU-0"]))
    old = time.time() - 3600
    for index in range(count):
        directory = containers / f"gone{index:06d}_main"
        directory.mkdir()
        for name in ("a.cache", "b.cache"):
            if sparse:
                write_region(directory / name, RegionSpec(uuids=["GPU-0"]))
            else:
                (directory / name).write_bytes(region)
        os.utime(directory, (old, old))
    return containers, uids


def measure_churn(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    import trio

    from hami_trio.monitor.lister import ContainerLister
    from hami_trio.pods.source import PodInfo, StaticPodSource

    containers, uids = _build_churn(base, args.churn, args.live, args.sparse)
    file_size = os.stat(containers / "gone000000_main" / "a.cache").st_size if args.churn else 0
    source = StaticPodSource([PodInfo(uid=uid, namespace="bench", name=uid) for uid in uids])
    lister = ContainerLister(containers, source, resync_interval=60)
    steps: list[float] = []

    async def main() -> None:
        await lister.update()
        assert lister.removals.pending == args.churn, lister.removals.pending
        while lister.removals.pending:
            started = time.perf_counter()
            await lister.removals.step()
            steps.append(time.perf_counter() - started)
            if len(steps) >= args.max_steps:
                break

    trio.run(main)
    removed = args.churn - lister.removals.pending
    lister.close()
    total = sum(steps)
    per_step = removed / len(steps) if steps else 0.0
    return {
        "directories": args.churn,
        "files_per_directory": 2,
        "cache_file_bytes": file_size,
        "sparse": args.sparse,
        "live_containers": args.live,
        "removed": removed,
        "steps": len(steps),
        "directories_per_step": round(per_step, 1),
        "step_max_s": round(max(steps, default=0.0), 4),
        "removal_s": round(total, 3),
        "directories_per_s": round(removed / total, 1) if total else 0.0,
        "ceiling_per_s_at_5s_interval": round(per_step / 5, 2),
    }


def _clean_up(base: Path) -> None:
    """Remove whatever is left with this checkout's remover (the measured code may be the
    old one, or may have crashed); loaded by path, it needs no more than trio and
    hami_trio.logs besides the standard library."""
    spec = importlib.util.spec_from_file_location(
        "_bench_remover", REPO / "hami_trio" / "monitor" / "remover.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    remover = module.TreeRemover(base.parent, base.name)
    while not remover.step(module.Budget(ops=10**9, seconds=1e6)):
        pass
    remover.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--depth", type=int, default=0, help="a chain this deep instead")
    parser.add_argument(
        "--churn", type=int, default=0, help="this many ordinary gone directories instead"
    )
    parser.add_argument("--sparse", action="store_true", help="--churn: sparse .cache files")
    parser.add_argument(
        "--max-steps", type=int, default=200, help="--churn: stop after this many steps"
    )
    parser.add_argument("--live", type=int, default=20, help="live containers beside it")
    parser.add_argument("--interval", type=float, default=0.5, help="tick interval (s)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--src", help="directory holding the hami_trio package to measure")
    parser.add_argument("--dir", help="where to build the trees (default /dev/shm or /tmp)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.depth:
        args.files = 0 if args.files == 200_000 else args.files
    _import_path(args.src)
    import hami_trio

    shm = Path("/dev/shm")
    where = args.dir or (str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None)
    base = Path(tempfile.mkdtemp(prefix="hami-trio-removal-bench-", dir=where))
    try:
        try:
            figures = measure_churn(args, base) if args.churn else measure(args, base)
        except Exception as exc:  # the code before the change crashes on deep chains
            leaf: BaseException = exc
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            figures = {"crashed": f"{type(leaf).__name__}: {leaf}"[:300]}
    finally:
        _clean_up(base)
    environment = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "hami_trio": str(Path(hami_trio.__file__).parent),
        "tree_dir": str(base.parent),
    }
    if args.json:
        print(json.dumps({"figures": figures, "environment": environment}, indent=2))
    else:
        for key, value in {**environment, **figures}.items():
            print(f"{key:22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
