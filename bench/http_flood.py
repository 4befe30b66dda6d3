#!/usr/bin/env python3
"""Metrics-port flood benchmark: do Prometheus and the probes get through while pods flood it?

Starts the real ``serve_http`` (hami_trio.metrics.endpoint) in a child process on 127.0.0.1,
serving a registry of about ``--body-kib`` KiB of text (kept lines, as the agent's collector
hands over per container; by default 3.9 MB, a large node) with the agent's freshness window
(``--freshness``, its monitor interval).  Per scenario, flood processes (tests/httpflood.py)
open connections at a steady rate, each sending ``GET /metrics`` with ``Accept-Encoding:
gzip`` and never reading, while this process, from 127.0.0.1:

- scrapes 20 times as Prometheus does (its ``Accept``, gzip, one every ``--scrape-every``
  seconds, a 5 s timeout) and counts the scrapes whose whole body came within 5 s;
- probes ``/healthz`` and ``/readyz`` every 0.5 s with the kubelet's 3 s timeout;
- samples the server process's CPU time over the flood (cores = CPU seconds / wall seconds).

Scenarios: ``one`` - one flooding peer (127.0.0.2) at ``--rate`` connections/s; ``ten`` - ten
times that from ten peers (127.0.0.2-11), one flood process each.  ``--server-tree DIR`` runs
the server from another checkout (e.g. the previous revision, for a before/after); without
it, this one.  The flood processes run at nice 19: on a small machine they would otherwise
take the server's CPU, which a flood from other pods does not.  Bounded: at most 5000
connections/s per flood process and 60 s.

Usage::

    .venv/bin/python bench/http_flood.py [--scenarios one,ten] [--rate 500] \\
        [--server-tree /tmp/before] [--body-kib 3900] [--freshness 5]

It writes a results directory (bench/_results.py) like every benchmark here.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import inspect
import os
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.httpflood import flooding  # noqa: E402  (needs the repository on sys.path)

#: What Prometheus 2.x asks for.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
SCRAPES = 20
_MAX_SECONDS = 60.0


def serve(body_kib: int, freshness: float) -> None:
    """Child mode: serve about ``body_kib`` KiB of kept lines on 127.0.0.1:0, print the port."""
    import trio
    from prometheus_client import CollectorRegistry

    from hami_trio.goparse import parse_bind_address
    from hami_trio.metrics.endpoint import serve_http
    from hami_trio.metrics.exposition import FastGauge

    line = 'bench_series{{pod="pod-{0:06d}-abcdefghijklmnop",container="c-{0:06d}"}} {1}\n'
    count = body_kib * 1024 // len(line.format(0, 123456))
    # Kept lines in blocks of 100, as the agent's collector keeps each container's rows.
    blocks = [
        "".join(line.format(i, i * 7919 % 1000003) for i in range(start, start + 100)).encode()
        for start in range(0, count, 100)
    ]

    class Kept:
        def collect(self) -> list[FastGauge]:
            family = FastGauge("bench_series", "kept rows", ("pod", "container"))
            family.blocks = list(blocks)
            return [family]

    registry = CollectorRegistry()
    registry.register(Kept())
    options: dict[str, Any] = {}
    if "freshness" in inspect.signature(serve_http).parameters:  # not in the old server
        options["freshness"] = freshness

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                partial(serve_http, parse_bind_address("127.0.0.1:0"), registry, **options)
            )
            print(bound.port, flush=True)

    trio.run(main)


def _scrape(port: int) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            body = gzip.decompress(reply.read())
    except Exception:  # refused, reset, timed out, cut short, 503: the figure is what happened
        return False
    return time.monotonic() - start < 5 and body.endswith(b"# EOF\n")


def _probe(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as reply:
            reply.read()
            return bool(reply.status == 200)
    except Exception:
        return False


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(scenario: str, args: argparse.Namespace) -> dict[str, float | str]:
    """One server, one flood scenario; the figures."""
    tree = Path(args.server_tree or REPO).resolve()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(args.body_kib),
            "--freshness",
            str(args.freshness),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tree,
        env=env,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        assert _scrape(port) or _scrape(port), "the server does not answer a scrape"
        peers = 1 if scenario == "one" else 10
        sources = [f"127.0.0.{2 + i}" for i in range(peers)]
        seconds = SCRAPES * args.scrape_every + 7
        scrapes: list[bool] = []
        probes: list[bool] = []
        timers = [
            threading.Timer(i * args.scrape_every, lambda: scrapes.append(_scrape(port)))
            for i in range(SCRAPES)
        ]
        for i in range(int(SCRAPES * args.scrape_every / 0.5)):
            path = "/healthz" if i % 2 else "/readyz"
            timers.append(threading.Timer(i * 0.5, lambda p=path: probes.append(_probe(port, p))))
        # One flood process per peer, each at the scenario's rate: ten peers, ten times it.
        with contextlib.ExitStack() as stack:
            floods = [
                stack.enter_context(
                    flooding(port, sources=[source], rate=args.rate, seconds=seconds, nice=19)
                )
                for source in sources
            ]
            time.sleep(1.0)  # the flood is on
            cpu0, wall0 = _cpu_seconds(server.pid), time.monotonic()
            for timer in timers:
                timer.start()
            for timer in timers:
                timer.join()
            cpu = _cpu_seconds(server.pid) - cpu0
            wall = time.monotonic() - wall0
        results = [r for flood in floods for r in flood.results()]
        opened = sum(r.get("opened", 0) for r in results)
        failed = sum(r.get("connect_failed", 0) for r in results)
        took = max(r.get("seconds", 0) for r in results) or 1
        return {
            "scenario": scenario,
            "peers": peers,
            "offered_per_s": round((opened + failed) / took),
            "connected_per_s": round(opened / took),
            "scrapes_ok": sum(scrapes),
            "scrapes": len(scrapes),
            "probes_ok": sum(probes),
            "probes": len(probes),
            "server_cores": round(cpu / wall, 2),
        }
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scenarios", default="one,ten", help="comma-separated: one, ten")
    parser.add_argument("--rate", type=float, default=500.0, help="connections/s per peer")
    parser.add_argument("--scrape-every", type=float, default=0.5, help="seconds")
    parser.add_argument("--body-kib", type=int, default=3900, help="size of the exposition")
    parser.add_argument("--freshness", type=float, default=5.0, help="the server's window")
    parser.add_argument("--server-tree", type=Path, default=None, help="checkout to serve from")
    parser.add_argument("--label", default="", help="a name for the server tree in the table")
    parser.add_argument("--results-root", type=Path, default=None)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.freshness)
        return 0
    scenarios = args.scenarios.split(",")
    if not set(scenarios) <= {"one", "ten"} or not 0 < args.rate <= 5000:
        parser.error("scenarios are one and ten; rate 1..5000")
    if SCRAPES * args.scrape_every + 7 > _MAX_SECONDS:
        parser.error(f"--scrape-every too long: the flood would last over {_MAX_SECONDS:g} s")

    from bench._results import Results

    label = args.label or ("this tree" if args.server_tree is None else str(args.server_tree))
    with Results("http_flood", root=args.results_root) as res, res.tee():
        rows = []
        figures: dict[str, float | str] = {}
        for scenario in scenarios:
            result = run(scenario, args)
            print(
                f"{label}, {scenario} ({result['peers']} peer(s), offered "
                f"{result['offered_per_s']}/s, connected {result['connected_per_s']}/s): "
                f"scrapes within 5 s {result['scrapes_ok']}/{result['scrapes']}, probes "
                f"{result['probes_ok']}/{result['probes']}, server CPU "
                f"{result['server_cores']} cores"
            )
            rows.append(
                [
                    label,
                    f"{result['peers']}",
                    f"{result['offered_per_s']} / {result['connected_per_s']}",
                    f"{result['scrapes_ok']}/{result['scrapes']}",
                    f"{result['probes_ok']}/{result['probes']}",
                    f"{result['server_cores']}",
                ]
            )
            for key, value in result.items():
                figures[f"{key}_{scenario}"] = value
        res.summary(
            "Metrics port: a flood of gzip GET /metrics that never read",
            headers=[
                "server",
                "flooding peers",
                "offered / connected per s",
                "scrapes within 5 s",
                "probes answered (3 s)",
                "server CPU (cores)",
            ],
            rows=rows,
            figures=figures,
            notes=[
                f"exposition about {args.body_kib} KiB of kept lines, freshness "
                f"{args.freshness:g} s (where the server has it), {args.rate:g} connections/s "
                f"per flooding peer, scrapes every {args.scrape_every:g} s, all on 127.0.0.1"
            ],
        )
        print(f"results: {res.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
