"""The live view: what the table shows, and how it is written to a terminal or a log."""

from __future__ import annotations

import io

import pytest

from hami_trio.demo.report import RunRecord
from hami_trio.demo.scrape import AgentSample
from hami_trio.demo.view import (
    DROP_ORDER,
    Screen,
    _clip,
    fit_columns,
    format_bytes,
    render_frame,
    render_plain,
)
from tests.demo.test_report import START, good_record


def _with_status() -> tuple[RunRecord, AgentSample]:
    record = good_record()
    for w in record.workloads:
        w.final = None
        w.exit_code = None
    inference, training, notebook, no_broker, crashed = record.workloads
    inference.status = {"state": "running", "recent_kernel": 2, "utilization_switch": 0}
    training.status = {
        "state": "blocked",
        "recent_kernel": -1,
        "utilization_switch": 1,
        "blocked_since": START + 1.0,
    }
    notebook.status = {"state": "idle", "recent_kernel": 0, "utilization_switch": 0}
    no_broker.status = {"state": "running", "recent_kernel": 2, "utilization_switch": 0}
    crashed.final = {"type": "final", "crashed": True, "t": START + 3.0}
    record.event(START + 1.0, "training blocked by the monitor")
    return record, record.samples[0]


def test_frame_shows_the_agents_view_and_the_workloads_own() -> None:
    record, sample = _with_status()
    lines = render_frame(record, sample, START + 2.5)
    text = "\n".join(lines)
    assert "2.5s / 10s" in text
    assert "http://127.0.0.1:1/metrics" in text
    assert "monitor tick 1 (every 0.5s)" in text
    rows = {line.split()[0]: line for line in lines if line.startswith(("inf", "tra", "no", "cr"))}
    assert rows["inference"].split()[1:3] == ["0", "GPU-8f1c"]
    assert "1.0 GiB / 8.0 GiB" in rows["inference"]
    assert "running" in rows["inference"]
    assert "BLOCKED 1.5s" in rows["training"]
    assert rows["training"].split()[-4:] == ["-1", "1", "1001", "1"]
    assert "1.0s  training blocked by the monitor" in text
    # The agent's columns: core limit, processes by host PID state.
    assert rows["inference"].split()[9:12] == ["60", "1", "run"]
    assert rows["no-broker"].split()[9:12] == ["50", "1", "unknown"]
    assert "none (disabled)" in rows["no-broker"]
    later = render_frame(record, record.samples[-1], START + 9.0)
    crashed = next(line for line in later if line.startswith("crashed"))
    assert crashed.split()[9:13] == ["50", "1", "EXITED", "exited"]


def test_frame_marks_a_wrong_pid_and_a_pause() -> None:
    record, _ = _with_status()
    attached = record.workloads[0].attached
    assert attached is not None
    attached["host_pid"] = 7
    record.mig_created = START + 4.0
    paused = AgentSample(START + 4.5, {}, True, 8)
    text = "\n".join(render_frame(record, paused, START + 5.0))
    assert "7 != 1000" in text
    assert "PAUSED by the MIG lock for 1.0s" in text


def test_colour_only_on_request() -> None:
    record, sample = _with_status()
    plain = "\n".join(render_frame(record, sample, START + 2))
    coloured = "\n".join(render_frame(record, sample, START + 2, colour=True))
    assert "\x1b[" not in plain
    assert "\x1b[31;1mBLOCKED" in coloured


def test_not_a_terminal_prints_events_once_and_status_blocks_periodically() -> None:
    record, sample = _with_status()
    out = io.StringIO()
    screen = Screen(out, tty=False, plain_period=5.0)
    screen.update(record, sample, START + 1.0)
    screen.update(record, sample, START + 2.0)
    record.event(START + 3.0, "training unblocked")
    screen.update(record, sample, START + 6.5)
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue()
    assert lines.count("[   1.0s] training blocked by the monitor") == 1
    assert "[   3.0s] training unblocked" in lines
    blocks = [line for line in lines if "agent:" in line]
    assert [line.split("]")[0] for line in blocks] == ["[   1.0s", "[   6.5s"]
    assert render_plain(record, sample, START + 1.0)[0] == blocks[0]


def test_terminal_redraws_in_place() -> None:
    record, sample = _with_status()
    out = io.StringIO()
    screen = Screen(out, tty=True, colour=False)
    screen.update(record, sample, START + 1.0)
    first = out.getvalue()
    frame_lines = first.count("\n")
    assert first.startswith("\x1b[?25l")
    screen.update(record, sample, START + 2.0)
    second = out.getvalue()[len(first) :]
    assert second.startswith(f"\x1b[{frame_lines}F")  # back to the frame's first line
    assert second.count("\x1b[2K") == frame_lines
    screen.close()
    assert out.getvalue().endswith("\x1b[?25h")


@pytest.mark.parametrize(
    ("line", "width", "clipped"),
    [
        ("abcdef", 3, "abc"),
        ("ab", 5, "ab"),
        ("\x1b[31mabcdef\x1b[0m", 2, "\x1b[31mab\x1b[0m"),
    ],
)
def test_clip_counts_only_visible_characters(line: str, width: int, clipped: str) -> None:
    assert _clip(line, width) == clipped


def test_format_bytes() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(3 << 29) == "1.5 GiB"


@pytest.mark.parametrize("width", [79, 99, 119])
def test_the_table_fits_the_terminal_keeping_state_and_host_pid(width: int) -> None:
    record, sample = _with_status()
    lines = render_frame(record, sample, START + 2.5, width=width)
    header = next(line for line in lines if line.startswith("CONTAINER"))
    table = [header] + [line for line in lines if line.startswith(("inf", "tra", "note", "cra"))]
    assert all(len(line) <= width for line in table), table
    for title in ("CONTAINER", "PROCS", "STATE", "RK", "SW", "HOST PID"):
        assert title in header
    training = next(line for line in table if line.startswith("training"))
    assert "BLOCKED 1.5s" in training
    words = training.split()
    assert words[words.index("-1") : words.index("-1") + 3] == ["-1", "1", "1001"]
    assert "simulated" in "\n".join(lines)
    assert all(len(line) <= width for line in lines if "the agent's" in line)


def test_columns_give_way_in_the_stated_order() -> None:
    _, short = fit_columns(None)
    assert not short
    dropped = []
    for width in range(200, 40, -1):
        kept = {c[0] for c in fit_columns(width)[0]}
        dropped += [k for k in DROP_ORDER if k not in kept and k not in dropped]
    assert dropped == list(DROP_ORDER)
    assert {c[0] for c in fit_columns(60)[0]} >= {"name", "state", "rk", "sw", "host"}
