#!/usr/bin/env python3
"""Metrics-port stall benchmark: what clients that never read cost the agent's HTTP server.

Starts the real ``serve_http`` (hami_trio.metrics.endpoint) in a child process on 127.0.0.1,
serving a registry whose text exposition is about ``--body-kib`` KiB (a node with a few
hundred containers).  For each client count (default 300 and 1000) it opens that many TCP
connections with a 4 KiB receive buffer, sends ``GET /metrics`` on each and never reads the
answer, then holds them for ``--hold`` seconds while it samples, in the server process:

- RSS (``VmRSS``) before the attack, at its peak and at the end of the hold;
- the connections the server still has open (its ESTABLISHED/CLOSE_WAIT sockets on the port);
- whether a normal scrape (urllib, 5 s timeout) is answered during the attack, and how fast.

A server that shields its send keeps every body for as long as the client keeps its socket;
a server with a per-response deadline and a connection cap frees them.  Bounded in count
(at most ``--max-clients`` connections) and time (``--hold`` at most 120 s).

Usage::

    .venv/bin/python bench/http_stall.py [--clients 300,1000] [--hold 15] [--body-kib 256]

It writes a results directory (bench/_results.py) like every benchmark here.
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.procnet import stalled_client, tcp_connections  # noqa: E402  (needs the repository on sys.path)

_MAX_CLIENTS = 2000
_MAX_HOLD = 120.0


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(body_kib: int) -> None:
    """Child mode: serve a registry of about ``body_kib`` KiB on 127.0.0.1:0, print the port."""
    import trio
    from prometheus_client import CollectorRegistry, Gauge

    from hami_trio.goparse import parse_bind_address
    from hami_trio.metrics.endpoint import serve_http

    _raise_nofile()
    registry = CollectorRegistry()
    gauge = Gauge("bench_series", "a padded series", ["pod", "container"], registry=registry)
    # One sample line is about 100 bytes.
    for i in range(body_kib * 1024 // 100):
        gauge.labels(f"pod-{i:06d}-abcdefghijklmnop", f"container-{i:06d}").set(i)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_http, parse_bind_address("127.0.0.1:0"), registry)
            print(bound.port, flush=True)

    trio.run(main)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for PID {pid}")


def _scrape(port: int) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            reply.read()
            status = str(reply.status)
    except Exception as exc:  # the figure is what happened
        status = type(exc).__name__
    return status, time.perf_counter() - start


def attack(clients: int, hold: float, body_kib: int) -> dict[str, float | str]:
    """One server, ``clients`` stalled connections held ``hold`` seconds; the figures."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(body_kib)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    socks: list[socket.socket] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        _scrape(port)  # warm: the first render's allocations are not the attack's
        rss_before = _rss_mib(server.pid)
        refused = 0
        for _ in range(clients):
            sock, sent = stalled_client(port)
            if not sent:
                refused += 1
                sock.close()
                continue
            socks.append(sock)
        time.sleep(1.0)
        peak = _rss_mib(server.pid)
        open_1s = tcp_connections(port, server.pid)
        status, latency = _scrape(port)
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            time.sleep(0.5)
            peak = max(peak, _rss_mib(server.pid))
        rss_end = _rss_mib(server.pid)
        open_end = tcp_connections(port, server.pid)
        after_status, _ = _scrape(port)
        return {
            "clients": clients,
            "connect_failed": refused,
            "rss_before_mib": round(rss_before, 1),
            "rss_peak_mib": round(peak, 1),
            "rss_end_mib": round(rss_end, 1),
            "open_after_1s": open_1s,
            "open_at_end": open_end,
            "scrape_during": status,
            "scrape_during_ms": round(latency * 1e3, 1),
            "scrape_after": after_status,
        }
    finally:
        for sock in socks:
            sock.close()
        server.terminate()
        server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--clients", default="300,1000", help="comma-separated client counts")
    parser.add_argument("--hold", type=float, default=15.0, help="seconds the clients stall")
    parser.add_argument("--body-kib", type=int, default=256, help="size of the exposition")
    parser.add_argument("--results-root", type=Path, default=None)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return 0
    counts = [int(c) for c in args.clients.split(",")]
    if any(c < 1 or c > _MAX_CLIENTS for c in counts) or not 0 < args.hold <= _MAX_HOLD:
        parser.error(f"clients must be 1..{_MAX_CLIENTS} and hold 0..{_MAX_HOLD:g} s")
    _raise_nofile()

    from bench._results import Results

    with Results("http_stall", root=args.results_root) as res, res.tee():
        rows = []
        figures: dict[str, float | str] = {}
        for count in counts:
            result = attack(count, args.hold, args.body_kib)
            print(
                f"{count} stalled clients: RSS {result['rss_before_mib']} -> peak "
                f"{result['rss_peak_mib']} -> end {result['rss_end_mib']} MiB; open after 1 s "
                f"{result['open_after_1s']}, after {args.hold:g} s {result['open_at_end']}; "
                f"scrape during the attack {result['scrape_during']} in "
                f"{result['scrape_during_ms']} ms, after {result['scrape_after']}"
            )
            rows.append(
                [
                    str(count),
                    f"{result['rss_before_mib']}",
                    f"{result['rss_peak_mib']}",
                    f"{result['rss_end_mib']}",
                    f"{result['open_after_1s']} / {result['open_at_end']}",
                    f"{result['scrape_during']} ({result['scrape_during_ms']} ms)",
                ]
            )
            for key, value in result.items():
                figures[f"{key}_{count}"] = value
        res.summary(
            "Metrics port: clients that send GET /metrics and never read",
            headers=[
                "clients",
                "RSS before MiB",
                "RSS peak MiB",
                "RSS end MiB",
                f"open after 1 s / {args.hold:g} s",
                "scrape during",
            ],
            rows=rows,
            figures=figures,
            notes=[
                f"exposition about {args.body_kib} KiB, client SO_RCVBUF 4 KiB, "
                f"held {args.hold:g} s, server and clients on 127.0.0.1"
            ],
        )
        print(f"results: {res.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
