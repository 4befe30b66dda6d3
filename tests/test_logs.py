from __future__ import annotations

import io
import json
import logging

import pytest

from hami_trio.logs import RateLimiter, configure_logging


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
    assert len(limiter._state) == 3
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
