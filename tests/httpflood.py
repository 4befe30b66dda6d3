"""A flood of metrics-port clients that ask for ``/metrics`` with gzip and never read.

What a hostile pod can do to the agent's metrics port: open connections at a steady rate,
each sending ``GET /metrics`` with ``Accept-Encoding: gzip`` (and a 4 KiB receive buffer),
and never read the answer; the oldest are closed once ``max_open`` are held.  Several source
addresses (``127.0.0.x``: every one of them reaches a server on ``127.0.0.1``) stand for
several pods.  Bounded in rate, count and time.

From a test or a benchmark, in another process (so that the flood does not share the
server's interpreter)::

    from tests.httpflood import flooding
    with flooding(port, sources=["127.0.0.2"], rate=500, seconds=10) as floods:
        ...  # scrape, probe
    print(floods.results())  # per process: opened, connect_failed, ...

or ``python -m tests.httpflood --port P --sources 127.0.0.2 --rate 500 --seconds 10``, which
prints its figures as one JSON line when done.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
#: Bounds: connections a second per process, seconds, connections held per process.
MAX_RATE = 5000.0
MAX_SECONDS = 120.0
MAX_OPEN = 4000


def flood(
    port: int,
    *,
    host: str = "127.0.0.1",
    sources: Sequence[str] = ("127.0.0.2",),
    rate: float = 500.0,
    seconds: float = 10.0,
    max_open: int = 1000,
    path: str = "/metrics",
) -> dict[str, float]:
    """Flood ``host:port`` from this thread for ``seconds``: ``rate`` connections a second,
    round-robin over ``sources``, each sending one gzip ``GET`` and never reading.

    Returns:
        ``opened`` (request sent), ``connect_failed`` (refused, reset or no answer to the
        connect within 1 s), ``seconds`` (how long it ran), ``rate`` (achieved opens/s).
    """
    if not 0 < rate <= MAX_RATE or not 0 < seconds <= MAX_SECONDS or not 0 < max_open <= MAX_OPEN:
        raise ValueError(f"rate 0..{MAX_RATE}, seconds 0..{MAX_SECONDS}, max_open 1..{MAX_OPEN}")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: gzip\r\n"
        "User-Agent: flood\r\n\r\n"
    ).encode()
    held: deque[socket.socket] = deque()
    # Connects are non-blocking, so a server whose backlog is full slows nothing down here:
    # the offered rate stays what was asked for, whatever the server does.
    pending: dict[socket.socket, float] = {}
    selector = selectors.DefaultSelector()
    opened = failed = 0
    start = time.monotonic()
    end = start + seconds

    def finish(timeout: float) -> None:
        nonlocal opened, failed
        for key, _ in selector.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            selector.unregister(sock)
            del pending[sock]
            try:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, "connect failed")
                sock.send(request)  # fits the empty send buffer: never blocks
            except OSError:
                sock.close()
                failed += 1
                continue
            opened += 1
            held.append(sock)
            while len(held) > max_open:
                held.popleft().close()
        now = time.monotonic()
        for sock, since in list(pending.items()):
            if now - since > 1.0:  # no SYN-ACK within a second: the backlog dropped it
                selector.unregister(sock)
                del pending[sock]
                sock.close()
                failed += 1

    try:
        n = 0
        while (now := time.monotonic()) < end:
            due = start + n / rate
            if due > now:
                finish(due - now)
                continue
            source = sources[n % len(sources)]
            n += 1
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
                sock.bind((source, 0))
                sock.setblocking(False)
                sock.connect_ex((host, port))
            except OSError:
                sock.close()
                failed += 1
                continue
            pending[sock] = now
            selector.register(sock, selectors.EVENT_WRITE)
            if len(pending) > max_open:  # bounded even against a server that never answers
                finish(0)
        finish(0)
    finally:
        for sock in [*held, *pending]:
            sock.close()
        selector.close()
    took = time.monotonic() - start
    return {
        "opened": opened,
        "connect_failed": failed,
        "seconds": round(took, 2),
        "rate": round(opened / took, 1) if took else 0.0,
    }


class Floods:
    """The flood processes of :func:`flooding`."""

    def __init__(self, processes: list[subprocess.Popen[str]]) -> None:
        self.processes = processes
        self._results: list[dict[str, Any]] | None = None

    def results(self) -> list[dict[str, Any]]:
        """Each process's figures (waits for them to end)."""
        if self._results is None:
            self._results = []
            for process in self.processes:
                out, _ = process.communicate(timeout=MAX_SECONDS + 30)
                lines = out.strip().splitlines()
                result = json.loads(lines[-1]) if lines else {"error": process.returncode}
                self._results.append(result)
        return self._results

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def flooding(
    port: int,
    *,
    sources: Sequence[str] = ("127.0.0.2",),
    rate: float = 500.0,
    seconds: float = 10.0,
    processes: int = 1,
    max_open: int = 1000,
    nice: int = 0,
) -> Iterator[Floods]:
    """Run ``processes`` flood processes (``python -m tests.httpflood``), each at ``rate``
    from all ``sources``, for ``seconds``; yields once they run, waits for their figures and
    stops them on exit.  ``nice``: their niceness (a benchmark on a small machine runs them at
    19, so that they do not take the server's CPU, as a flood from other pods would not)."""
    procs = []
    try:
        for _ in range(processes):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.httpflood",
                        "--port",
                        str(port),
                        "--sources",
                        ",".join(sources),
                        "--rate",
                        str(rate),
                        "--seconds",
                        str(seconds),
                        "--max-open",
                        str(max_open),
                        "--nice",
                        str(nice),
                    ],
                    cwd=_REPO,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        floods = Floods(procs)
        for proc in procs:  # each says "started" once it runs
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "started":
                raise RuntimeError(f"flood process did not start: {line!r}")
        yield floods
        floods.results()
    finally:
        Floods(procs).stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--sources", default="127.0.0.2", help="comma-separated addresses")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-open", type=int, default=1000)
    parser.add_argument("--nice", type=int, default=0, help="niceness to add (0-19)")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(min(max(args.nice, 0), 19))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, args.max_open + 64):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.max_open + 64), hard))
    print("started", flush=True)
    figures = flood(
        args.port,
        host=args.host,
        sources=args.sources.split(","),
        rate=args.rate,
        seconds=args.seconds,
        max_open=args.max_open,
    )
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
