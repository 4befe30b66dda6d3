"""The demo's live terminal view: a table redrawn in place, or plain lines when not a terminal.

How this works: :func:`render_frame` and :func:`render_plain` are pure - the
:class:`~hami_trio.demo.report.RunRecord` (the workloads' reports and the latest scrape) in,
lines out.  :class:`Screen` writes them: on a terminal it redraws the frame in place with
plain ANSI sequences (no curses), fitted to the terminal's width (columns give way in
:data:`DROP_ORDER`, and what is still too long is clipped) so that no line wraps; on
anything else it prints the story's events as they happen and a status block every few
seconds.  Colour only on a terminal, never with ``NO_COLOR``.  What each column means:
docs/demo.md (What you see).
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from typing import Final, TextIO

from hami_trio.demo.report import RunRecord, WorkloadRecord, format_events
from hami_trio.demo.scrape import AgentSample, ContainerMetrics

__all__ = [
    "DROP_ORDER",
    "Screen",
    "fit_columns",
    "format_bytes",
    "render_frame",
    "render_plain",
]

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


#: The table's columns: key, header, width, alignment, separator before it.
_COLUMNS: Final = (
    ("name", "CONTAINER", 12, "<", ""),
    ("prio", "PRIO", 4, ">", " "),
    ("gpu", "GPU", 8, "<", "  "),
    ("memory", "MEMORY USED / LIMIT", 21, "<", "  "),
    ("sm", "SM%", 4, ">", " "),
    ("core", "CORE%", 5, ">", " "),
    ("procs", "PROCS", 9, "<", "  "),
    ("state", "STATE", 13, "<", "  "),
    ("rk", "RK", 3, ">", " "),
    ("sw", "SW", 2, ">", " "),
    ("host", "HOST PID", 14, ">", "  "),
    ("sandbox", "PID IN SANDBOX", 14, ">", "  "),
)
#: What gives way, in this order, when the table is wider than the terminal: the memory
#: column first becomes ``1.0/8.0 GiB`` (and the host PID column narrower), then the PID in
#: the sandbox, the GPU, the core limit and the priority are left out (the banner names
#: each workload's GPU and priority).
DROP_ORDER: Final = ("sandbox", "gpu", "core", "prio")
_SHORT_MEMORY_WIDTH: Final = 13

Column = tuple[str, str, int, str, str]


def _table_width(columns: Sequence[Column]) -> int:
    return sum(len(sep) + size for _, _, size, _, sep in columns)


def fit_columns(width: int | None) -> tuple[list[Column], bool]:
    """The columns that fit in ``width`` characters, and whether memory is abbreviated
    (:data:`DROP_ORDER`); None: every column, in full."""
    columns = list(_COLUMNS)
    if width is None or _table_width(columns) <= width:
        return columns, False
    narrow = {"memory": ("MEM USED/LIMIT", _SHORT_MEMORY_WIDTH), "host": ("HOST PID", 10)}
    columns = [(k, *narrow.get(k, (t, n)), a, p) for k, t, n, a, p in columns]
    for key in DROP_ORDER:
        if _table_width(columns) <= width:
            break
        columns = [c for c in columns if c[0] != key]
    return columns, True


def _short_memory(used: int | None, limit: int | None) -> str:
    if used is None and limit is None:
        return "-"
    shown = ["-" if v is None else f"{v / _GIB:.1f}" for v in (used, limit)]
    return f"{shown[0]}/{shown[1]} GiB"


def render_frame(
    record: RunRecord,
    sample: AgentSample | None,
    now: float,
    *,
    colour: bool = False,
    width: int | None = None,
) -> list[str]:
    """The live table and the latest events (pure).

    Args:
        record: what the run recorded so far.
        sample: the latest scrape of ``/metrics`` (None before the first).
        now: ``time.monotonic()``.
        colour: add ANSI colours.
        width: the terminal's width: columns give way in :data:`DROP_ORDER` until the table
            fits, and the legend is wrapped; None: every column, in full.
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
    ]
    rows: list[dict[str, str]] = []
    for w in record.workloads:
        metrics = _metrics(w, sample)
        status = w.status or {}
        rows.append(
            {
                "name": w.spec.name,
                "prio": str(w.spec.priority),
                "gpu": _short_gpu(w.spec.gpu),
                "memory": f"{format_bytes(metrics.memory_used)} / "
                f"{format_bytes(metrics.memory_limit)}",
                "memory_short": _short_memory(metrics.memory_used, metrics.memory_limit),
                "sm": "-" if metrics.sm_util is None else str(metrics.sm_util),
                "core": "-" if metrics.core_limit is None else str(metrics.core_limit),
                "procs": _processes(metrics),
                "state": _state(w, now),
                "rk": str(status.get("recent_kernel", "-")),
                "sw": str(status.get("utilization_switch", "-")),
                "host": _host_pid(w),
                "sandbox": "-" if w.attached is None else str(w.attached.get("pid")),
                "warn_procs": "1"
                if metrics.processes.get("exited") or metrics.processes.get("unknown")
                else "",
            }
        )

    def colour_of(key: str, row: Mapping[str, str]) -> str | None:
        if key == "state":
            if row["state"].startswith("BLOCKED") or row["state"] == "FAILED":
                return "red"
            return "green" if row["state"] == "running" else None
        if key == "procs" and row["warn_procs"]:
            return "yellow"
        return None

    columns, short_memory = fit_columns(width)
    header = "".join(f"{sep}{title:{align}{size}}" for _, title, size, align, sep in columns)
    lines.append(header.rstrip())
    for row in rows:
        cells = []
        for key, _, size, align, sep in columns:
            text = row["memory_short" if key == "memory" and short_memory else key]
            cell = f"{text:{align}{size}}"
            name = colour_of(key, row)
            cells.append(sep + (paint(cell, name) if name is not None else cell))
        lines.append("".join(cells).rstrip())
    legend = (
        "MEMORY, SM%, CORE% (core limit), PROCS (processes by host PID state) = the agent's "
        "/metrics, of simulated workloads (no GPU) | STATE, RK = recent_kernel, SW = "
        "utilization_switch = the workload's own shared region"
    )
    wrapped = textwrap.wrap(legend, width) if width is not None else [legend]
    lines += ["", *(paint(line, "dim") for line in wrapped), "events:"]
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
            width = _usable_width()
            self._redraw(render_frame(record, sample, now, colour=self.colour, width=width))
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
        width = _usable_width()
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


def _usable_width() -> int:
    """The terminal's columns less one (a line that fills the last column wraps on some)."""
    return max(shutil.get_terminal_size().columns - 1, 20)


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
