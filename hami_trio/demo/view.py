"""The demo's live terminal view: a table redrawn in place, or plain lines when not a terminal.

How this works: :func:`render_frame` and :func:`render_plain` are pure - the
:class:`~hami_trio.demo.report.RunRecord` (the workloads' reports and the latest scrape) in,
lines out.  :class:`Screen` writes them: on a terminal it redraws the frame in place with
plain ANSI sequences (no curses), clipped to the terminal's width so that no line wraps; on
anything else it prints the story's events as they happen and a status block every few
seconds.  Colour only on a terminal, never with ``NO_COLOR``.  What each column means:
docs/demo.md (What you see).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Final, TextIO

from hami_trio.demo.report import RunRecord, WorkloadRecord, format_events
from hami_trio.demo.scrape import AgentSample, ContainerMetrics

__all__ = ["Screen", "format_bytes", "render_frame", "render_plain"]

_GIB: Final = float(1 << 30)
_RESET: Final = "\x1b[0m"
_COLOURS: Final = {
    "red": "\x1b[31;1m",
    "green": "\x1b[32m",
    "yellow": "\x1b[33;1m",
    "dim": "\x1b[2m",
}
#: Events shown under the live table.
_EVENT_LINES: Final = 8


def format_bytes(value: int | None) -> str:
    """Bytes as GiB with one decimal (``-`` when unknown)."""
    return "-" if value is None else f"{value / _GIB:.1f} GiB"


def _short_gpu(uuid: str) -> str:
    return uuid[:8]


def _state(w: WorkloadRecord, now: float) -> str:
    if w.error is not None:
        return "FAILED"
    if w.final is not None or w.exit_code is not None:
        return "exited"
    if w.status is None:
        return "starting" if w.attached is None else "attached"
    state = str(w.status["state"])
    if state == "blocked":
        episodes = w.status.get("blocked_since")
        held = f" {now - episodes:.1f}s" if isinstance(episodes, float) else ""
        return f"BLOCKED{held}"
    return state


def _host_pid(w: WorkloadRecord) -> str:
    if w.attached is None:
        return "-"
    answer = w.attached.get("host_pid")
    if answer is None:
        return f"none ({w.attached.get('reason')})"
    if w.host_pid is not None and answer != w.host_pid:
        return f"{answer} != {w.host_pid}"
    return str(answer)


_STATE_WORDS: Final = (("running", "run"), ("exited", "EXITED"), ("unknown", "unknown"))


def _processes(metrics: ContainerMetrics) -> str:
    """The agent's ``hami_trio_container_processes`` of a container, e.g. ``1 unknown``."""
    if not metrics.processes:
        return "-"
    shown = [
        f"{metrics.processes[s]} {word}" for s, word in _STATE_WORDS if metrics.processes.get(s)
    ]
    return " ".join(shown) or "0"


def _metrics(w: WorkloadRecord, sample: AgentSample | None) -> ContainerMetrics:
    if sample is None:
        return ContainerMetrics()
    return sample.containers.get((w.pod_uid, w.spec.name), ContainerMetrics())


def _agent_line(record: RunRecord, sample: AgentSample | None, now: float) -> str:
    if sample is None:
        return "agent: waiting for the first scrape of /metrics"
    answered = sample.exchanges.get("ok", 0)
    if sample.mig_paused:
        since = record.mig_created
        held = f" for {now - since:.1f}s" if since is not None else ""
        monitor = f"PAUSED by the MIG lock{held}, shared regions untouched"
    else:
        monitor = f"tick {sample.ticks} (every {record.interval:g}s)"
    return f"agent: broker answered {answered} | monitor {monitor}"


def render_frame(
    record: RunRecord, sample: AgentSample | None, now: float, *, colour: bool = False
) -> list[str]:
    """The live table and the latest events (pure).

    Args:
        record: what the run recorded so far.
        sample: the latest scrape of ``/metrics`` (None before the first).
        now: ``time.monotonic()``.
        colour: add ANSI colours.
    """

    def paint(text: str, name: str) -> str:
        return f"{_COLOURS[name]}{text}{_RESET}" if colour else text

    elapsed = 0.0 if record.start is None else max(now - record.start, 0.0)
    lines = [
        f"hami-trio demo  {min(elapsed, record.duration):5.1f}s / {record.duration:g}s  "
        "(Ctrl-C stops everything)",
        f"metrics: {record.metrics_url or '-'}",
        _agent_line(record, sample, now),
        "",
        f"{'CONTAINER':<12} {'PRIO':>4}  {'GPU':<8}  {'MEMORY USED / LIMIT':<21} {'SM%':>4} "
        f"{'CORE%':>5}  {'PROCS':<9}  {'STATE':<13} {'RK':>3} {'SW':>2}  {'HOST PID':>14}  "
        f"{'PID IN SANDBOX':>14}",
    ]
    for w in record.workloads:
        metrics = _metrics(w, sample)
        memory = f"{format_bytes(metrics.memory_used)} / {format_bytes(metrics.memory_limit)}"
        sm = "-" if metrics.sm_util is None else str(metrics.sm_util)
        state = _state(w, now)
        shown = f"{state:<13}"
        if state.startswith("BLOCKED") or state == "FAILED":
            shown = paint(shown, "red")
        elif state == "running":
            shown = paint(shown, "green")
        status = w.status or {}
        rk = status.get("recent_kernel", "-")
        sw = status.get("utilization_switch", "-")
        sandbox_pid = "-" if w.attached is None else str(w.attached.get("pid"))
        core = "-" if metrics.core_limit is None else str(metrics.core_limit)
        procs = _processes(metrics)
        shown_procs = f"{procs:<9}"
        if metrics.processes.get("exited") or metrics.processes.get("unknown"):
            shown_procs = paint(shown_procs, "yellow")
        lines.append(
            f"{w.spec.name:<12} {w.spec.priority:>4}  {_short_gpu(w.spec.gpu):<8}  {memory:<21} "
            f"{sm:>4} {core:>5}  {shown_procs}  {shown} {rk!s:>3} {sw!s:>2}  "
            f"{_host_pid(w):>14}  {sandbox_pid:>14}"
        )
    lines += [
        "",
        paint(
            "MEMORY, SM%, CORE% (core limit), PROCS (processes by host PID state) = the agent's "
            "/metrics | STATE, RK = recent_kernel, SW = utilization_switch = the workload's own "
            "shared region",
            "dim",
        ),
        "events:",
    ]
    recent = format_events(record.events, record.start)[-_EVENT_LINES:]
    lines += [f"  {line}" for line in recent]
    return lines


def render_plain(record: RunRecord, sample: AgentSample | None, now: float) -> list[str]:
    """A compact status block for logs: one line for the agent, one per workload (pure)."""
    elapsed = 0.0 if record.start is None else now - record.start
    stamp = f"[{elapsed:6.1f}s]"
    lines = [f"{stamp} {_agent_line(record, sample, now)}"]
    for w in record.workloads:
        metrics = _metrics(w, sample)
        sm = "-" if metrics.sm_util is None else f"{metrics.sm_util}%"
        memory = f"{format_bytes(metrics.memory_used)}/{format_bytes(metrics.memory_limit)}"
        lines.append(
            f"{stamp} {w.spec.name:<12} prio {w.spec.priority}  mem {memory}  SM {sm:>4}  "
            f"procs {_processes(metrics):<9}  {_state(w, now):<13} host PID {_host_pid(w)}"
        )
    return lines


class Screen:
    """Writes frames in place on a terminal, or lines to anything else.

    Args:
        out: where to write.
        tty: redraw in place (default: ``out.isatty()``).
        colour: ANSI colours (default: on a terminal without ``NO_COLOR``).
        plain_period: seconds between status blocks when not a terminal.
    """

    def __init__(
        self,
        out: TextIO,
        *,
        tty: bool | None = None,
        colour: bool | None = None,
        plain_period: float = 5.0,
    ) -> None:
        self._out = out
        self.tty = out.isatty() if tty is None else tty
        self.colour = (self.tty and "NO_COLOR" not in os.environ) if colour is None else colour
        self._plain_period = plain_period
        self._drawn = 0
        self._events_printed = 0
        self._last_block: float | None = None

    def print(self, lines: Sequence[str]) -> None:
        """Print lines below whatever is on the screen (the frame stays where it is)."""
        for line in lines:
            self._out.write(f"{line}\n")
        self._out.flush()

    def update(self, record: RunRecord, sample: AgentSample | None, now: float) -> None:
        """Show the current state: redraw the frame, or print new events and, every
        ``plain_period`` seconds, a status block."""
        if self.tty:
            self._redraw(render_frame(record, sample, now, colour=self.colour))
            return
        events = record.events[self._events_printed :]
        self._events_printed = len(record.events)
        self.print(format_events(events, record.start, plain=True))
        if record.start is not None and (
            self._last_block is None or now - self._last_block >= self._plain_period
        ):
            self._last_block = now
            self.print(render_plain(record, sample, now))

    def _redraw(self, lines: Sequence[str]) -> None:
        width = max(shutil.get_terminal_size().columns - 1, 20)
        parts = []
        if self._drawn:
            parts.append(f"\x1b[{self._drawn}F")  # to the first column, ``drawn`` lines up
        else:
            parts.append("\x1b[?25l")  # hide the cursor while redrawing
        for line in lines:
            parts.append(f"\x1b[2K{_clip(line, width)}\n")
        parts.append("\x1b[J")  # erase what a longer previous frame left below
        self._out.write("".join(parts))
        self._out.flush()
        self._drawn = len(lines)

    def close(self) -> None:
        """Leave the last frame on the screen and show the cursor again."""
        if self.tty and self._drawn:
            self._out.write("\x1b[?25h")
            self._out.flush()


def _clip(line: str, width: int) -> str:
    """Cut a line to ``width`` visible characters, keeping ANSI sequences intact."""
    visible = 0
    out: list[str] = []
    i = 0
    while i < len(line):
        if line[i] == "\x1b":
            end = line.find("m", i)
            if end == -1:
                break
            out.append(line[i : end + 1])
            i = end + 1
            continue
        if visible >= width:
            i += 1
            continue
        out.append(line[i])
        visible += 1
        i += 1
    return "".join(out)
