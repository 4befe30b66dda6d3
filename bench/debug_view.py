#!/usr/bin/env python3
"""Debug view benchmark: building and serving ``/debug/state`` for N containers.

Builds the same tree as ``monitor_scale.py`` (N v1 ``.cache`` files, 2 devices, 8 live slots
each), runs the real ``Monitor`` three ticks, then measures, in this process:

- ``build``: :func:`hami_trio.agent.debug.debug_state` + :func:`render` over the latest tick
  (median of 11; what one ``/debug/state`` costs the worker thread);
- ``fetch``: ``GET /debug/state`` over real HTTP from ``serve_routes`` (median of 21);
- the body's size and how many entries it holds (the cap: 1000);
- peak RSS before and after (``ru_maxrss``).

The debug view runs only when asked, never in the tick or the scrape: these figures say what
an operator's ``hami-trio status`` costs on a full node, not a cost every node pays.
Target: at N = 1000 a build of at most 250 ms and a body of at most 16 MiB. docs/benchmarks.md
(Debug view) has the figures.

Usage::

    .venv/bin/python bench/debug_view.py              # N = 100, 1000, 2000
    .venv/bin/python bench/debug_view.py --n 1000
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.monitor_scale import _uid, build_tree  # noqa: E402

Figures = dict[str, float]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(n: int) -> Figures:
    import trio

    from hami_trio.agent.debug import MonitorSummary, PodWatchSummary, debug_state, render
    from hami_trio.goparse import BindAddress
    from hami_trio.http.routes import RouteAnswer, serve_routes
    from hami_trio.monitor.loop import Monitor, MonitorConfig
    from hami_trio.pods.source import PodInfo, StaticPodSource

    with tempfile.TemporaryDirectory(prefix="debug-view-") as tmp:
        hook = Path(tmp)
        build_tree(hook, n)
        pods = StaticPodSource(
            [
                PodInfo(uid=_uid(i), namespace="bench", name=f"pod-{i}", containers=("main",))
                for i in range(n)
            ]
        )
        config = MonitorConfig(hook_path=hook, mig_lock_path=hook / "mig" / "lock")

        async def run() -> Figures:
            monitor = Monitor(config, pod_source=pods)
            for _ in range(3):
                await monitor.tick()
            rss_before = _rss_mb()
            summary = MonitorSummary(str(config.containers_dir), 5.0, monitor.ticks, False)
            watch = PodWatchSummary("static", True, True, node_name="bench")

            def build() -> bytes:
                # the containers as the agent's debug view shows them: with their usage
                usage = getattr(monitor, "usage", None)
                containers = monitor.containers() if usage is None else usage().containers
                document = debug_state(
                    containers,
                    pods,
                    now=time.time(),
                    node_name="bench",
                    version="bench",
                    monitor=summary,
                    pods=watch,
                    broker=None,
                )
                return render(document)

            samples = []
            for _ in range(11):
                start = time.perf_counter()
                body = build()
                samples.append(time.perf_counter() - start)

            def route(params: object) -> RouteAnswer:
                return 200, b"application/json", build()

            def fetch(url: str) -> float:
                start = time.perf_counter()
                with urllib.request.urlopen(url, timeout=60) as reply:
                    reply.read()
                return time.perf_counter() - start

            async with trio.open_nursery() as nursery:
                serve = partial(serve_routes, name="bench")
                bound = await nursery.start(
                    serve, BindAddress("127.0.0.1", 0), {"/debug/state": route}
                )
                url = f"http://127.0.0.1:{bound.port}/debug/state"
                await trio.to_thread.run_sync(fetch, url)
                latencies = [await trio.to_thread.run_sync(fetch, url) for _ in range(21)]
                nursery.cancel_scope.cancel()
            monitor.close()
            return {
                "n": float(n),
                "build_median_ms": statistics.median(samples) * 1e3,
                "fetch_median_ms": statistics.median(latencies) * 1e3,
                "body_bytes": float(len(body)),
                "entries": float(json.loads(body)["containers_shown"]),
                "rss_before_mb": rss_before,
                "rss_after_mb": _rss_mb(),
            }

        return trio.run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="containers (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    results = [measure(n) for n in args.n or [100, 1000, 2000]]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.platform()}")
    print("    N  build ms  fetch ms    body KiB  entries  RSS before -> after MB")
    for r in results:
        print(
            f"{r['n']:5.0f}  {r['build_median_ms']:8.1f}  {r['fetch_median_ms']:8.1f}  "
            f"{r['body_bytes'] / 1024:10.0f}  {r['entries']:7.0f}  "
            f"{r['rss_before_mb']:.0f} -> {r['rss_after_mb']:.0f}"
        )


if __name__ == "__main__":
    main()
