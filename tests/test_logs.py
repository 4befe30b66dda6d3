from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_trio._text import quote, unsafe_char
from hami_trio.logs import RateLimiter, configure_logging, escape_control


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_lets_one_through_per_interval_and_counts_the_rest() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10.0, clock=clock)
    assert limiter.check("a") == 0
    assert limiter.check("a") is None
    assert limiter.check("a") is None
    assert limiter.check("b") == 0  # keys are independent
    clock.now = 9.9
    assert limiter.check("a") is None
    clock.now = 10.0
    assert limiter.check("a") == 3
    assert limiter.check("a") is None


def test_rate_limiter_key_table_is_bounded() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10.0, max_keys=3, clock=clock)
    for key in range(100):
        assert limiter.check(key) == 0
    assert limiter.tracked_keys == 3
    assert limiter.check(99) is None  # the most recent keys are kept


def test_rate_limiter_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="interval"):
        RateLimiter(-1.0)
    with pytest.raises(ValueError, match="max_keys"):
        RateLimiter(1.0, max_keys=0)


def test_rate_limited_log_mentions_suppressed_count() -> None:
    clock = FakeClock()
    limiter = RateLimiter(1.0, clock=clock)
    stream = io.StringIO()
    configure_logging("text", "info", stream)
    log = logging.getLogger("hami_trio.test")
    assert limiter.log(log, logging.WARNING, "k", "dropped %s", "x")
    assert not limiter.log(log, logging.WARNING, "k", "dropped %s", "x")
    clock.now = 2.0
    assert limiter.log(log, logging.WARNING, "k", "dropped %s", "x")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("dropped x")
    assert lines[1].endswith("dropped x (1 similar events suppressed)")


def test_json_log_lines_are_objects_with_extra_fields() -> None:
    stream = io.StringIO()
    configure_logging("json", "debug", stream)
    logging.getLogger("hami_trio.test").info("hello %d", 5, extra={"container": "c1", "n": 3})
    record = json.loads(stream.getvalue())
    assert record["msg"] == "hello 5"
    assert record["level"] == "info"
    assert record["logger"] == "hami_trio.test"
    assert record["container"] == "c1"
    assert record["n"] == 3


def test_configure_logging_rejects_unknown_level() -> None:
    with pytest.raises(ValueError, match="verbose"):
        configure_logging("text", "verbose")


# Tenant-controlled strings in log lines ------------------------------------------------------

# A ``.cache`` name as a tenant can create it inside its container directory: a newline that
# starts a forged record, an ANSI colour escape, a carriage return that rewinds a terminal
# line, and bytes that are not UTF-8.
FORGED = b"2026-01-01 00:00:00,000 ERROR hami_trio.broker: forged record"
HOSTILE_CACHE_NAME = b"x\n" + FORGED + b"\x1b[31mred\rover\xff.cache"
_RECORD_START = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ hami_trio[.\w]*: ")


def _run_monitor_until(tmp_path: Path, fmt: str, wanted: bytes) -> bytes:
    """Run the real ``hami-trio monitor`` over a container whose ``.cache`` file has the
    hostile name (and garbage content, so the monitor logs the name when rejecting it)
    until its stderr holds ``wanted``; returns all of stderr."""
    hook = tmp_path / "hook"
    container = os.path.join(os.fsencode(hook / "containers"), b"pod-1_main")
    os.makedirs(container)
    with open(os.path.join(container, HOSTILE_CACHE_NAME), "wb") as cache:
        cache.write(b"\0" * 4096)  # no magic: rejected, and the rejection names the file
    err_path = tmp_path / "stderr"
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")}
    command = [
        *("hami-trio", "monitor", "--no-kubernetes", "--log-format", fmt),
        *("--hook-path", str(hook), "--interval", "0.1"),
        *("--mig-lock-path", str(tmp_path / "mig" / "lock")),
        *("--metrics-bind-address", "127.0.0.1:0"),
    ]
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), command[0]), *command[1:]],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while wanted not in err_path.read_bytes() and time.monotonic() < deadline:
                assert proc.poll() is None, err_path.read_bytes()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = err_path.read_bytes()
    assert wanted in output, output
    return output


def test_text_log_cannot_be_forged_by_a_cache_file_name(tmp_path: Path) -> None:
    output = _run_monitor_until(tmp_path, "text", b"ignoring its cache file")
    lines = output.split(b"\n")
    assert lines[-1] == b""
    for line in lines[:-1]:
        assert _RECORD_START.match(line), line  # every line starts a record
        assert not line.startswith(FORGED), output  # and none of them is the tenant's
    assert b"\r" not in output
    assert b"\x1b" not in output
    (rejection,) = [line for line in lines if b"ignoring its cache file" in line]
    # The name is there, quoted and escaped: visible to the reader, inert for the terminal.
    assert quote(os.fsdecode(HOSTILE_CACHE_NAME)).encode() in rejection
    assert b"'x\\n" + FORGED + b"\\x1b[31mred\\rove...'" in rejection  # cut at 80


def test_json_log_keeps_a_cache_file_name_inside_one_record(tmp_path: Path) -> None:
    output = _run_monitor_until(tmp_path, "json", b"ignoring its cache file")
    assert b"\r" not in output
    assert b"\x1b" not in output
    records = [json.loads(line) for line in output.decode("utf-8").splitlines()]
    (rejection,) = [r for r in records if "ignoring its cache file" in r["msg"]]
    # The JSON string decodes back to the exact message, the name in it quoted.
    assert quote(os.fsdecode(HOSTILE_CACHE_NAME)) in rejection["msg"]


# Any text, lone surrogates and every control character included.
_ANY_TEXT = st.lists(
    st.characters()
    | st.characters(min_codepoint=0, max_codepoint=0xA0)
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
    | st.characters(categories=["Cf"])  # bidirectional overrides, zero-width characters
    | st.sampled_from(["\u2028", "\u2029", "\x85", "\x1b[2J", "%", "\\n", "\u202e"]),
    max_size=30,
).map("".join)


def test_escape_control_names_each_character() -> None:
    assert escape_control("plain / path ünïcode \\n") == "plain / path ünïcode \\n"
    assert escape_control("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert escape_control("\x00\x1b[31m\x7f\x85\x9b") == "\\x00\\x1b[31m\\x7f\\x85\\x9b"
    assert escape_control("\u2028\u2029\ud800\udcff") == "\\u2028\\u2029\\ud800\\udcff"


def _strict_stream() -> tuple[io.TextIOWrapper, io.BytesIO]:
    raw = io.BytesIO()
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n"), raw


def test_text_record_is_one_line_even_with_a_traceback() -> None:
    stream, raw = _strict_stream()
    configure_logging("text", "info", stream)
    log = logging.getLogger("hami_trio.test")
    try:
        raise OSError(2, "No such file", "evil\nname\udcff")
    except OSError:
        log.exception("cannot open %s", "x\r\x1b[1m\udcff.cache")
    stream.flush()
    output = raw.getvalue().decode("utf-8")  # valid UTF-8: the surrogates are escaped
    lines = output.split("\n")
    assert len(lines) == 2, output
    assert lines[1] == ""
    assert "cannot open x\\r\\x1b[1m\\udcff.cache\\nTraceback" in lines[0]
    assert "'evil\\nname\\udcff'" in lines[0]  # OSError's repr of the name, kept


def test_json_record_with_surrogates_is_valid_utf8_and_round_trips() -> None:
    stream, raw = _strict_stream()
    configure_logging("json", "info", stream)
    name = "x\udcff\u2028\x85y"
    logging.getLogger("hami_trio.test").warning("cannot open %s", name, extra={"path": name})
    stream.flush()
    (line,) = raw.getvalue().decode("utf-8").splitlines()  # no U+2028/U+0085 splits either
    record = json.loads(line)
    assert record["msg"] == f"cannot open {name}"
    assert record["path"] == name


def test_format_characters_are_escaped_in_both_formats() -> None:
    name = "a\u202eb\u2066c\u200b\ufeff\U000e0041.cache"  # the last one past U+FFFF
    for fmt in ("text", "json"):
        stream, raw = _strict_stream()
        configure_logging(fmt, "info", stream)
        logging.getLogger("hami_trio.test").warning("cannot open %s", name)
        stream.flush()
        (line,) = raw.getvalue().decode("utf-8").splitlines()
        assert line.isascii(), line
        if fmt == "json":
            assert json.loads(line)["msg"] == f"cannot open {name}"  # exact, surrogate pair
            assert "\\udb40\\udc41" in line
        else:
            assert line.endswith("cannot open a\\u202eb\\u2066c\\u200b\\ufeff\\U000e0041.cache")


@given(_ANY_TEXT, _ANY_TEXT)
def test_any_message_is_one_line_in_both_formats(message: str, arg: str) -> None:
    # Tenant strings reach a record as arguments (call sites never format them into ``msg``).
    for fmt in ("text", "json"):
        stream, raw = _strict_stream()
        configure_logging(fmt, "info", stream)
        logging.getLogger("hami_trio.test").warning("%s %s", message, arg)
        stream.flush()
        output = raw.getvalue().decode("utf-8")
        assert output.endswith("\n")
        (line,) = output.splitlines()  # str.splitlines splits on every line boundary
        assert not any(unsafe_char(char) for char in line)  # no format character either
        if fmt == "json":
            # Exact, except that JSON cannot tell a high then low lone surrogate from a pair.
            assert json.loads(line)["msg"] == json.loads(json.dumps(f"{message} {arg}"))
        else:
            assert line.endswith(escape_control(f"{message} {arg}"))
