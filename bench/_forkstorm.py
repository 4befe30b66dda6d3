"""A storm of forked Python processes released at the same instant (stdlib only).

How this works: the same mechanism as ``hostpid-client --storm N`` (clients/c/hostpid_cli.c),
for work written in Python.  The parent forks N children after everything is imported (so
each child is a separate Python process that starts from a warm interpreter, as a CUDA
process's library would be loaded before it calls ``cuInit``); each child blocks reading one
pipe; closing its write end releases them all at once.  Each child runs ``work()``, timing it
with ``time.monotonic_ns``, and writes one fixed-size record through a second pipe (well
below ``PIPE_BUF``, so records never interleave).  The parent prints the storm report of the C
client, so the benchmark parses both alike::

    clients=N successful=S failed=F wall_ms=W
    latency_ms p50=.. p99=.. max=.. distinct_pids=D fork_ms=..
    phases_ms NAME p50=.. p99=.. max=.. ...     (work that reports phases, e.g. CUDA)
    failures: reason=count ...                  (only when F > 0)

``gc.freeze()`` before forking keeps the collector from touching (and so copying) every
inherited page in every child.
"""

from __future__ import annotations

import gc
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence

__all__ = ["Work", "WorkResult", "storm"]

#: status (0 = success, else an index into the reasons), answer (a PID or 0), pad, three
#: phase durations (ns, -1 if unused), total elapsed (ns).
_RECORD = struct.Struct("=iiiqqqq")
#: What a child's work returns: (status, answer, phase durations in ns).
WorkResult = tuple[int, int, Sequence[int]]
Work = Callable[[], WorkResult]


def _read_full(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _child(gate: int, results: int, work: Work, exception_status: int) -> None:
    """Runs in a forked child; never returns."""
    status = exception_status
    try:
        os.read(gate, 1)  # EOF when the parent closes the write end: the release
        start = time.monotonic_ns()
        try:
            status, answer, phases = work()
        except Exception:
            answer, phases = 0, ()
        elapsed = time.monotonic_ns() - start
        padded = [*phases, -1, -1, -1][:3]
        os.write(results, _RECORD.pack(status, answer, 0, *padded, elapsed))
    finally:
        os._exit(0 if status == 0 else 1)


def _percentiles(values: list[int]) -> tuple[float, float, float]:
    ordered = sorted(values)
    count = len(ordered)
    return (
        ordered[count // 2] / 1e6,
        ordered[(count * 99) // 100] / 1e6,
        ordered[-1] / 1e6,
    )


def storm(
    clients: int,
    work: Work,
    *,
    reasons: Sequence[str],
    phase_names: Sequence[str] = (),
) -> int:
    """Fork ``clients`` processes, release them together, print the storm report.

    Args:
        clients: how many processes.
        work: what each process does once released.
        reasons: names of the non-zero statuses ``work`` returns (index = status); an
            exception in ``work`` is reported as ``exception``.
        phase_names: names of the phase durations ``work`` reports (at most three).

    Returns:
        0 if every process succeeded with a distinct answer, else 1.
    """
    names = ["ok", *reasons, "exception"]
    gate_r, gate_w = os.pipe()
    results_r, results_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()
    children = []
    fork_start = time.monotonic_ns()
    for _ in range(clients):
        try:
            pid = os.fork()
        except OSError as exc:
            print(f"fork failed after {len(children)} children: {exc}", file=sys.stderr)
            break
        if pid == 0:
            os.close(gate_w)
            os.close(results_r)
            _child(gate_r, results_w, work, len(names) - 1)
        children.append(pid)
    fork_ms = (time.monotonic_ns() - fork_start) / 1e6
    os.close(gate_r)
    os.close(results_w)
    release = time.monotonic_ns()
    os.close(gate_w)
    records = []
    while len(records) < len(children):
        data = _read_full(results_r, _RECORD.size)
        if len(data) < _RECORD.size:
            break
        records.append(_RECORD.unpack(data))
    wall_ms = (time.monotonic_ns() - release) / 1e6
    os.close(results_r)
    for pid in children:
        os.waitpid(pid, 0)
    gc.unfreeze()

    ok = [r for r in records if r[0] == 0]
    answers = {r[1] for r in ok}
    print(
        f"clients={clients} successful={len(ok)} failed={clients - len(ok)} wall_ms={wall_ms:.1f}"
    )
    if records:
        p50, p99, top = _percentiles([r[6] for r in records])
        print(
            f"latency_ms p50={p50:.2f} p99={p99:.2f} max={top:.2f} "
            f"distinct_pids={len(answers)} fork_ms={fork_ms:.1f}"
        )
        for index, name in enumerate(phase_names[:3]):
            values = [r[3 + index] for r in ok if r[3 + index] >= 0]
            if values:
                p50, p99, top = _percentiles(values)
                print(f"phases_ms {name} p50={p50:.2f} p99={p99:.2f} max={top:.2f}")
    if len(ok) < clients:
        counts: dict[str, int] = {}
        for record in records:
            if record[0] != 0:
                name = names[record[0]] if 0 < record[0] < len(names) else str(record[0])
                counts[name] = counts.get(name, 0) + 1
        lost = clients - len(records)
        parts = [f"{name}={count}" for name, count in sorted(counts.items())]
        parts += [f"not_started_or_lost={lost}"] if lost else []
        print("failures: " + " ".join(parts))
    return 0 if len(ok) == clients and len(answers) == len(ok) else 1
