"""What the demo recorded, and the summary it draws from it: pure data and functions.

The runner fills a :class:`RunRecord` while the demo runs: each workload's reports (its
``attached`` line with the broker's answer, its latest ``status``, its ``final`` history),
the host PID the kernel gave it, every scrape of the agent's ``/metrics``, the times the
demo created and removed the MIG lock, and what was left after the shutdown.
:func:`summarize` turns that into the summary document (``--summary-json``; schema in
docs/demo.md) and its ``checks``, and :func:`render_summary` into the lines printed at the
end.  Times in the summary are seconds from the start of the run.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hami_trio.demo.scenario import WorkloadSpec
from hami_trio.demo.scrape import AgentSample, bucket_quantile

__all__ = [
    "CHECKS",
    "RunRecord",
    "WorkloadRecord",
    "blocking_grace",
    "render_summary",
    "summarize",
]

#: The checks of a run, in the order the summary prints them, with what each one means.
CHECKS: Final = {
    "pids_correct": "every workload with the broker switch got its own host PID from it",
    "host_pid_unknown_shown": "the agent showed the broker-less workload's process as unknown",
    "exited_process_shown": "the agent showed the crashed workload's process as exited, its "
    "memory still counted",
    "blocking_counted": "the agent counted the blocks of every blocked workload",
    "low_priority_blocked": "each low-priority workload was blocked while a higher one ran",
    "blocking_explained": "every block happened while a higher-priority sharer was active",
    "unblocked_after": "each blocked workload was unblocked and launched again",
    "metrics_served": "/metrics was scraped and showed every workload's memory",
    "mig_paused": "the monitor paused while the MIG lock existed (no tick meanwhile)",
    "mig_resumed": "the monitor ticked again after the MIG lock was removed",
    "clean_shutdown": "every process exited cleanly; no process or socket was left",
}


@dataclass
class WorkloadRecord:
    """One workload as the demo saw it.

    Attributes:
        spec: what it is.
        pod_uid: its fake pod's UID.
        directory: its container directory on the host.
        supervisor_pid: the process the demo started (host side of the sandbox).
        host_pid: the sandboxed process's PID as the kernel shows it to the demo.
        attached: its ``attached`` report (the broker's answer, its PID in the sandbox).
        status: its latest ``status`` report.
        final: its ``final`` report.
        error: its ``error`` report, or why the demo gave up on it.
        exit_code: the supervisor's exit status.
    """

    spec: WorkloadSpec
    pod_uid: str
    directory: Path
    supervisor_pid: int | None = None
    host_pid: int | None = None
    attached: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    error: str | None = None
    exit_code: int | None = None


@dataclass
class RunRecord:
    """Everything one demo run recorded (the runner writes, the view and summary read)."""

    workloads: list[WorkloadRecord]
    duration: float
    interval: float
    root: Path
    sandbox: str
    metrics_url: str | None = None
    start: float | None = None
    mig_created: float | None = None
    mig_removed: float | None = None
    samples: list[AgentSample] = field(default_factory=list)
    failed_scrapes: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)
    interrupted: bool = False
    agent_error: str | None = None
    stray_processes: list[str] = field(default_factory=list)
    socket_left: bool = False
    debug_address: str | None = None
    status_table: list[str] = field(default_factory=list)
    status_error: str | None = None

    def event(self, t: float, text: str) -> None:
        """Record one line of the story (``t`` in monotonic seconds)."""
        self.events.append((t, text))

    def latest(self) -> AgentSample | None:
        """The latest scrape, if any."""
        return self.samples[-1] if self.samples else None


def blocking_grace(interval: float) -> float:
    """How long after a higher-priority workload's last launch a block may still start or
    last: ``recent_kernel`` needs two ticks to fall from 2 to 0, one more tick and a
    scheduling margin cover a late tick on a loaded machine."""
    return 3 * interval + 0.5


def _rel(t: float | None, start: float) -> float | None:
    return None if t is None else round(t - start, 3)


def _windows(record: WorkloadRecord, key: str, start: float) -> list[tuple[float, float | None]]:
    if record.final is None:
        return []
    return [(s - start, None if e is None else e - start) for s, e in record.final[key]]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _blocking(record: RunRecord, start: float) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    grace = blocking_grace(record.interval)
    rows: list[dict[str, Any]] = []
    expected_blocks = explained = unblocked = True
    for w in record.workloads:
        episodes = _windows(w, "episodes", start)
        higher = [
            o
            for o in record.workloads
            if o.spec.gpu == w.spec.gpu and o.spec.priority < w.spec.priority
        ]
        busy = [win for o in higher for win in _windows(o, "windows", start)]
        if not higher and not episodes:
            continue
        unexplained = [
            ep for ep in episodes if not any(ws <= ep[0] <= (we or ws) + grace for ws, we in busy)
        ]
        launches_after = _windows(w, "windows", start)
        last_end = max((ep[1] for ep in episodes if ep[1] is not None), default=None)
        reopened = bool(episodes) and (
            episodes[-1][1] is not None
            and last_end is not None
            and any(we is not None and we >= last_end for _, we in launches_after)
        )
        demand = [(a * record.duration, b * record.duration) for a, b in w.spec.behaviour.busy]
        # Blocks are expected where this workload wanted to launch while a higher-priority
        # sharer did, for long enough that the monitor ticked in between.
        contested = sum(_overlap(d, (ws, we or ws)) for d in demand for ws, we in busy)
        outranked_active = contested >= 2 * record.interval
        busy_seconds = sum((we or ws) - ws for ws, we in busy)
        blocked_seconds = w.final["blocked_seconds"] if w.final else 0.0
        rows.append(
            {
                "workload": w.spec.name,
                "priority": w.spec.priority,
                "gpu": w.spec.gpu,
                "outranked_by": [o.spec.name for o in higher],
                "higher_priority_active_seconds": round(busy_seconds, 3),
                "contested_seconds": round(contested, 3),
                "episodes": len(episodes),
                "blocked_seconds": round(blocked_seconds, 3),
                "episode_times": [
                    [round(s, 3), None if e is None else round(e, 3)] for s, e in episodes
                ],
                "unexplained_episodes": len(unexplained),
                "unblocked_after": reopened,
            }
        )
        if outranked_active and not episodes:
            expected_blocks = False
        if unexplained:
            explained = False
        if episodes and not reopened:
            unblocked = False
    checks = {
        "low_priority_blocked": expected_blocks and any(row["episodes"] for row in rows),
        "blocking_explained": explained,
        "unblocked_after": unblocked and any(row["episodes"] for row in rows),
    }
    return rows, checks


def _mig(record: RunRecord, start: float) -> tuple[dict[str, Any], dict[str, bool]]:
    created, removed = record.mig_created, record.mig_removed
    paused = [s for s in record.samples if s.mig_paused]
    paused_ticks = [s.ticks for s in paused if s.ticks is not None]
    ticks_while_paused = max(paused_ticks) - min(paused_ticks) if paused_ticks else None
    resumed_at: float | None = None
    ticks_after = 0
    if removed is not None and paused_ticks:
        for s in record.samples:
            if s.t >= removed and s.mig_paused is False and (s.ticks or 0) > max(paused_ticks):
                if resumed_at is None:
                    resumed_at = s.t
                ticks_after = (s.ticks or 0) - max(paused_ticks)
    in_window = [
        s
        for s in paused
        if created is not None and s.t >= created and (removed is None or s.t <= removed + 1.0)
    ]
    doc = {
        "lock_created_at": _rel(created, start),
        "lock_removed_at": _rel(removed, start),
        "paused_scrapes": len(paused),
        "ticks_while_paused": ticks_while_paused,
        "resumed_after_seconds": None
        if resumed_at is None or removed is None
        else round(resumed_at - removed, 3),
        "ticks_after_resume": ticks_after,
    }
    checks = {
        "mig_paused": bool(in_window) and ticks_while_paused == 0,
        "mig_resumed": resumed_at is not None,
    }
    return doc, checks


def _crashed_at(w: WorkloadRecord) -> float | None:
    final = w.final or {}
    return float(final["t"]) if final.get("crashed") and "t" in final else None


def _explained(record: RunRecord, start: float) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    """What the agent's /metrics said about each workload's processes, limit and blocking."""
    rows: list[dict[str, Any]] = []
    unknown_ok = exited_ok = counted_ok = True
    last = record.latest()
    for w in record.workloads:
        key = (w.pod_uid, w.spec.name)
        seen = [(s, s.containers[key]) for s in record.samples if key in s.containers]
        latest = seen[-1][1] if seen else None
        crashed = _crashed_at(w)
        after = [(s, m) for s, m in seen if crashed is not None and s.t > crashed]
        # Where the agent cannot check liveness it reports the dead process as running.
        exited_seen = any(
            m.processes.get("exited" if s.liveness_checked else "running", 0) >= 1
            and (m.memory_used or 0) > 0
            for s, m in after
        )
        unknown_seen = any(m.processes.get("unknown", 0) >= 1 for _, m in seen)
        episodes = len(_windows(w, "episodes", start))
        blocks = latest.blocks if latest is not None else None
        if not w.spec.broker and not unknown_seen:
            unknown_ok = False
        if w.spec.exits_at is not None and not exited_seen:
            exited_ok = False
        if episodes and not (blocks or 0) >= 1:
            counted_ok = False
        rows.append(
            {
                "workload": w.spec.name,
                "broker": w.spec.broker,
                "processes": dict(latest.processes) if latest is not None else {},
                "unknown_seen": unknown_seen,
                "crashed_at": _rel(crashed, start),
                "exited_seen_after_crash": exited_seen,
                "memory_after_crash": max(((m.memory_used or 0) for _, m in after), default=None),
                "core_limit": latest.core_limit if latest is not None else None,
                "agent_blocks": blocks,
                "agent_blocked_seconds": latest.blocked_seconds if latest is not None else None,
            }
        )
    liveness = None if last is None else last.liveness_checked
    checks = {
        "host_pid_unknown_shown": unknown_ok,
        "exited_process_shown": exited_ok,
        "blocking_counted": counted_ok,
    }
    return [{"liveness_checked": liveness, "workloads": rows}], checks


def _broker(record: RunRecord) -> dict[str, Any]:
    last = next((s for s in reversed(record.samples) if s.exchanges), None)
    client = [
        w.attached["broker_seconds"]
        for w in record.workloads
        if w.attached is not None and w.attached.get("host_pid")
    ]
    doc: dict[str, Any] = {
        "exchanges": dict(last.exchanges) if last else {},
        "latency_mean_seconds": None,
        "latency_p50_at_most_seconds": None,
        "latency_p99_at_most_seconds": None,
        "client_round_trip_median_seconds": round(statistics.median(client), 6) if client else None,
    }
    if last and last.latency_count:
        doc["latency_mean_seconds"] = round(last.latency_sum / last.latency_count, 6)
        doc["latency_p50_at_most_seconds"] = bucket_quantile(last.latency_buckets, 0.5)
        doc["latency_p99_at_most_seconds"] = bucket_quantile(last.latency_buckets, 0.99)
    return doc


def summarize(record: RunRecord) -> dict[str, Any]:
    """The summary document of a run (pure; see docs/demo.md for every field).

    Returns:
        A JSON-ready dict; ``ok`` is true when every check in ``checks`` holds.
    """
    start = record.start if record.start is not None else 0.0
    workloads: list[dict[str, Any]] = []
    pids_ok = bool(record.workloads)
    seen: set[str] = set()
    for sample in record.samples:
        for w in record.workloads:
            metrics = sample.containers.get((w.pod_uid, w.spec.name))
            if metrics is not None and (metrics.memory_used or 0) > 0:
                seen.add(w.spec.name)
    for w in record.workloads:
        attached = w.attached or {}
        broker_pid = attached.get("host_pid")
        if w.spec.broker:
            correct = (
                broker_pid is not None
                and broker_pid == w.host_pid
                and attached.get("pid") != w.host_pid
            )
        else:  # the switch is off: the client must not even ask
            correct = broker_pid is None and attached.get("reason") == "disabled"
        pids_ok = pids_ok and correct
        final = w.final or {}
        workloads.append(
            {
                "name": w.spec.name,
                "pod_uid": w.pod_uid,
                "priority": w.spec.priority,
                "gpu": w.spec.gpu,
                "memory_limit": w.spec.memory_limit,
                "host_pid": w.host_pid,
                "pid_in_sandbox": attached.get("pid"),
                "uid_in_sandbox": attached.get("uid"),
                "broker_host_pid": broker_pid,
                "broker_reason": attached.get("reason"),
                "broker_detail": attached.get("detail"),
                "broker_round_trip_seconds": attached.get("broker_seconds"),
                "pid_correct": correct,
                "launches": final.get("launches"),
                "blocked_seconds": final.get("blocked_seconds"),
                "blocked_episodes": [
                    [round(s, 3), None if e is None else round(e, 3)]
                    for s, e in _windows(w, "episodes", start)
                ],
                "launch_windows": [
                    [round(s, 3), None if e is None else round(e, 3)]
                    for s, e in _windows(w, "windows", start)
                ],
                "peak_memory": final.get("peak_memory"),
                "memory_metric_seen": w.spec.name in seen,
                "exit_code": w.exit_code,
                "error": w.error,
            }
        )
    blocking, blocking_checks = _blocking(record, start)
    explained, explained_checks = _explained(record, start)
    mig, mig_checks = _mig(record, start)
    clean = (
        not record.stray_processes
        and not record.socket_left
        and record.agent_error is None
        and all(w.exit_code == 0 and w.error is None for w in record.workloads)
    )
    checks = {
        "pids_correct": pids_ok,
        **explained_checks,
        **blocking_checks,
        "metrics_served": bool(record.samples) and len(seen) == len(record.workloads),
        **mig_checks,
        "clean_shutdown": clean,
    }
    checks = {name: bool(checks[name]) for name in CHECKS}
    return {
        "ok": all(checks.values()) and not record.interrupted,
        "interrupted": record.interrupted,
        "duration": record.duration,
        "interval": record.interval,
        "root": str(record.root),
        "sandbox": record.sandbox,
        "metrics_url": record.metrics_url,
        "status": {
            "debug_address": record.debug_address,
            "table": list(record.status_table),
            "error": record.status_error,
        },
        "workloads": workloads,
        "blocking": blocking,
        "explained": explained[0],
        "broker": _broker(record),
        "mig": mig,
        "metrics": {
            "scrapes": len(record.samples),
            "failed_scrapes": record.failed_scrapes,
            "workloads_with_memory_metric": sorted(seen),
        },
        "cleanup": {
            "stray_processes": list(record.stray_processes),
            "socket_left": record.socket_left,
            "agent_error": record.agent_error,
        },
        "checks": checks,
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def render_summary(summary: dict[str, Any]) -> list[str]:
    """The summary as plain lines for the terminal (pure)."""
    lines = ["", "Summary", "-------"]
    lines.append(f"metrics were served at {summary['metrics_url']} while the demo ran")
    lines.append("")
    lines.append("Host PIDs from the broker (each workload asked once, like HAMi-core's cuInit):")
    for w in summary["workloads"]:
        if w["broker_host_pid"] is not None:
            verdict = "correct" if w["pid_correct"] else f"WRONG (kernel says {w['host_pid']})"
            answer = f"host PID {w['broker_host_pid']} ({verdict})"
        else:
            answer = f"no answer: {w['broker_reason']} - {w['broker_detail']}"
        lines.append(f"  {w['name']:<12} PID {w['pid_in_sandbox']} in its sandbox -> {answer}")
    broker = summary["broker"]
    exchanges = ", ".join(f"{k} {v}" for k, v in broker["exchanges"].items() if v) or "none"
    lines.append(
        f"  broker exchanges: {exchanges}; latency mean {_ms(broker['latency_mean_seconds'])}, "
        f"p99 <= {_ms(broker['latency_p99_at_most_seconds'])} (broker side), client round "
        f"trip median {_ms(broker['client_round_trip_median_seconds'])}"
    )
    lines.append("")
    lines.append("Priority blocking (the monitor's feedback through the shared regions):")
    lines.append(
        "  (a block lasts until the monitor's next ticks see no recent kernel of the higher "
        "priority, so it outlasts that activity by a tick or two)"
    )
    for row in summary["blocking"]:
        if not row["outranked_by"]:
            lines.append(
                f"  {row['workload']:<12} blocked {_times(row['episodes'])} (nobody outranks it!)"
            )
            continue
        lines.append(
            f"  {row['workload']:<12} (priority {row['priority']}) blocked "
            f"{_times(row['episodes'])}, {_seconds(row['blocked_seconds'])} in all, while "
            f"{', '.join(row['outranked_by'])} was active for "
            f"{_seconds(row['higher_priority_active_seconds'])}; "
            + ("unblocked afterwards" if row["unblocked_after"] else "NOT unblocked afterwards")
        )
    for w in summary["workloads"]:
        if not any(row["workload"] == w["name"] for row in summary["blocking"]):
            lines.append(
                f"  {w['name']:<12} (priority {w['priority']}) never blocked: nobody outranks it "
                "on its GPU"
            )
    explained = summary["explained"]
    lines.append("")
    checked = explained["liveness_checked"]
    lines.append(
        "What the agent explains (hami_trio_container_processes, _core_limit_ratio, "
        "_blocks_total; "
        + (
            "exited processes are detected"
            if checked
            else "NO liveness check here: exited processes show as running"
        )
        + "):"
    )
    for row in explained["workloads"]:
        procs = ", ".join(f"{n} {state}" for state, n in row["processes"].items() if n) or "none"
        line = f"  {row['workload']:<12} processes {procs}; core limit {row['core_limit']}%"
        if row["agent_blocks"]:
            line += (
                f"; blocked {_times(row['agent_blocks'])}, "
                f"{_seconds(row['agent_blocked_seconds'])} by the monitor's count"
            )
        if not row["broker"]:
            line += " <- no broker: host PID unknown, so HAMi-core cannot attribute SM utilisation"
        if row["crashed_at"] is not None:
            memory = row["memory_after_crash"]
            shown = "-" if memory is None else f"{memory / (1 << 30):.1f} GiB"
            line += f" <- died at {_seconds(row['crashed_at'])}; its slot still counts {shown}"
        lines.append(line)
    mig = summary["mig"]
    lines.append("")
    lines.append(
        f"MIG lock: created at {_seconds(mig['lock_created_at'])}, removed at "
        f"{_seconds(mig['lock_removed_at'])}; the monitor was paused in {mig['paused_scrapes']} "
        f"scrapes with {mig['ticks_while_paused']} ticks meanwhile, and resumed "
        + (
            f"{_seconds(mig['resumed_after_seconds'])} after the removal "
            f"({mig['ticks_after_resume']} ticks since)"
            if mig["resumed_after_seconds"] is not None
            else "- not observed"
        )
    )
    cleanup = summary["cleanup"]
    left = cleanup["stray_processes"] or ["no process"]
    lines.append(
        f"Shutdown: {', '.join(left)} left; broker socket "
        + ("LEFT BEHIND" if cleanup["socket_left"] else "removed")
        + (f"; agent error: {cleanup['agent_error']}" if cleanup["agent_error"] else "")
    )
    lines.append("")
    for name, meaning in CHECKS.items():
        mark = "ok  " if summary["checks"][name] else "FAIL"
        lines.append(f"  [{mark}] {meaning}")
    if summary["interrupted"]:
        lines.append("  (interrupted: the run was cut short, so not every check could hold)")
    status = summary.get("status") or {}
    if status.get("table"):
        lines += [
            "",
            f"hami-trio status --address {status['debug_address']}, at the end of the run:",
            *(f"  {line}" if line else "" for line in status["table"]),
        ]
    elif status.get("error"):
        lines += ["", f"hami-trio status at the end of the run failed: {status['error']}"]
    return lines


def format_events(
    events: Sequence[tuple[float, str]], start: float | None, *, plain: bool = False
) -> list[str]:
    """Event lines stamped with seconds from the start of the run (negative before it;
    from the first event while the run has not started).  ``plain``: ``[  1.2s] text``."""
    origin = start if start is not None else (events[0][0] if events else 0.0)
    if plain:
        return [f"[{t - origin:6.1f}s] {text}" for t, text in events]
    return [f"{t - origin:6.1f}s  {text}" for t, text in events]
