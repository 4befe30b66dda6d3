"""Shared by the storm benchmarks: run a storm of clients in the sandbox, parse its report.

How this works: a *storm* program (``hostpid-client --storm N``, ``bench/pystorm.py``,
``bench/fallback_model``) forks N processes that block on one pipe, releases them at the same
instant, and prints one line per outcome class plus a latency line::

    clients=N successful=S failed=F wall_ms=W
    latency_ms p50=.. p99=.. max=.. distinct_pids=D ...
    failures: reason=count ...          (only when F > 0)

:func:`run_sandboxed` runs such a program inside the container-like sandbox of the client
tests (tests/clients/harness.py: new PID and mount namespace, broker directory bind-mounted
read-only, uid 65534) and records the exact command, its raw output and exit status in the
benchmark's results directory; :func:`parse_storm` turns the report into numbers.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from bench._results import Results
from tests.clients.harness import (
    ClientRun,
    Sandbox,
    make_sandbox,
    python_broker,
    run_in_sandbox,
    sandbox_command,
)

__all__ = ["StormReport", "parse_storm", "run_sandboxed", "sandbox_with_broker"]

_HEAD = re.compile(r"clients=(\d+) successful=(\d+) failed=(\d+) wall_ms=([\d.]+)")
_LATENCY = re.compile(
    r"latency_ms p50=([\d.]+) p99=([\d.]+) max=([\d.]+) distinct_pids=(\d+)"
    r"(?: answers_equal_local_pid=(\d+))?"
)
_FAILURES = re.compile(r"^failures:(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class StormReport:
    """One storm's figures (latencies in milliseconds)."""

    clients: int
    successful: int
    failed: int
    wall_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    distinct_pids: int
    failures: str  # "reason=count ..." or ""

    @property
    def all_ok(self) -> bool:
        """Every client succeeded with its own PID."""
        return self.failed == 0 and self.successful == self.clients == self.distinct_pids


def parse_storm(stdout: str) -> StormReport | None:
    """The figures of a storm report, or None if the output has no complete report."""
    head, latency = _HEAD.search(stdout), _LATENCY.search(stdout)
    if head is None or latency is None:
        return None
    failures = _FAILURES.search(stdout)
    return StormReport(
        clients=int(head.group(1)),
        successful=int(head.group(2)),
        failed=int(head.group(3)),
        wall_ms=float(head.group(4)),
        p50_ms=float(latency.group(1)),
        p99_ms=float(latency.group(2)),
        max_ms=float(latency.group(3)),
        distinct_pids=int(latency.group(4)),
        failures=failures.group(1).strip() if failures else "",
    )


def run_sandboxed(
    res: Results,
    box: Sandbox,
    argv: Sequence[str],
    *,
    name: str,
    env: Mapping[str, str],
    client_drops_itself: bool = False,
    timeout: float = 300.0,
) -> tuple[ClientRun, StormReport | None]:
    """Run a storm program in the sandbox; keep its command and raw output in ``res``.

    Returns:
        The run (exit status, output) and its parsed report (None if incomplete).
    """
    command = sandbox_command(box, argv, client_drops_itself=client_drops_itself)
    run = run_in_sandbox(
        box, argv, env=env, client_drops_itself=client_drops_itself, timeout=timeout
    )
    out = res.raw(f"{name}.out", run.stdout)
    err = res.raw(f"{name}.err", run.stderr)
    env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    res.note_command(
        command,
        name=name,
        returncode=run.returncode,
        seconds=run.elapsed,
        outputs=[out, err],
        note=f"env: {env_text}; stdin 'go' releases the storm (tests/clients/harness.py)",
    )
    return run, parse_storm(run.stdout)


@contextlib.contextmanager
def sandbox_with_broker(res: Results) -> Iterator[Sandbox]:
    """The client sandbox with our broker listening on its host-side socket.

    The broker runs for the whole ``with`` block; its command line is recorded in ``res``.
    """
    with make_sandbox() as box, python_broker(box.host_socket):
        res.note_command(
            [sys.executable, "-m", "hami_trio", "broker", "--socket-path", str(box.host_socket)],
            name="broker",
            returncode=None,
            seconds=None,
            note="tests/clients/harness.py python_broker, runs for the whole benchmark",
        )
        yield box
