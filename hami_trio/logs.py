"""Logging set-up and rate limiting for attacker-driven events.

hami-trio logs one line per event through the standard :mod:`logging` module, either as text
or as one JSON object per line (``--log-format json``) for log pipelines.

Tenants can make events happen at will: a connection flood on the broker socket, a ``.cache``
file rewritten with garbage every millisecond.  Logging each of those would let a tenant fill
the node's disk and drown real messages, so such call sites go through :class:`RateLimiter`:
at most one line per key per interval, and the line that is let through says how many were
suppressed since the last one.  The limiter's key table is bounded, so a tenant cannot grow it
either.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Literal, TextIO

__all__ = ["LogFormat", "RateLimiter", "configure_logging"]

LogFormat = Literal["text", "json"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and any ``extra`` fields."""

    _RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._RESERVED and not key.startswith("_"):
                payload[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


def configure_logging(
    fmt: LogFormat = "text", level: str = "info", stream: TextIO | None = None
) -> None:
    """Route the ``hami_trio`` loggers to ``stream`` (stderr by default).

    Replaces handlers installed by an earlier call, so it is safe to call more than once.

    Raises:
        ValueError: ``level`` is not a logging level name.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger("hami_trio")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    root.propagate = False


class RateLimiter:
    """Let at most one event per key through per ``interval`` seconds.

    ``check(key)`` returns ``None`` while the key is muted, and otherwise the number of events
    for that key that were suppressed since the last one let through (0 the first time).  At
    most ``max_keys`` keys are remembered (least recently seen dropped first), so
    tenant-controlled keys cannot grow memory without bound.

    The clock is injectable; pass ``trio.current_time`` inside trio code so that MockClock
    drives it in tests.
    """

    def __init__(
        self,
        interval: float = 60.0,
        *,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval < 0 or max_keys < 1:
            raise ValueError("interval must be >= 0 and max_keys >= 1")
        self._interval = interval
        self._max_keys = max_keys
        self._clock = clock
        # key -> [time of the last event let through, events suppressed since]
        self._state: OrderedDict[Hashable, list[float]] = OrderedDict()

    def check(self, key: Hashable = None) -> int | None:
        """Record one event for ``key``; see the class docstring for the result."""
        now = self._clock()
        state = self._state.get(key)
        if state is not None:
            self._state.move_to_end(key)
            if now - state[0] < self._interval:
                state[1] += 1
                return None
            suppressed = int(state[1])
            state[0], state[1] = now, 0
            return suppressed
        self._state[key] = [now, 0]
        if len(self._state) > self._max_keys:
            self._state.popitem(last=False)
        return 0

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: Hashable,
        msg: str,
        *args: object,
    ) -> bool:
        """Log ``msg % args`` unless ``key`` is muted; append the suppressed count if any.

        Returns:
            Whether a line was written.
        """
        suppressed = self.check(key)
        if suppressed is None:
            return False
        if suppressed:
            msg = f"{msg} ({suppressed} similar events suppressed)"
        logger.log(level, msg, *args)
        return True
