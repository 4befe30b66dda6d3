"""Logging set-up and rate limiting for attacker-driven events.

How this works: hami-trio logs one line per event through :mod:`logging`, as text or as one
JSON object per line (``--log-format json``).  Tenants can cause events at will, so such call
sites go through :class:`RateLimiter` (one line per key per interval, counting what it
suppressed, with a bounded key table).  Tenants also choose many strings in messages, so
both formatters escape control characters, Unicode format characters (bidirectional
overrides, zero-width characters), U+2028/U+2029 and lone surrogates
(:func:`~hami_trio._text.escape_control`, re-exported here): a text record is always one
line, a JSON record one line of valid UTF-8 that decodes back to the exact string.  What an
operator sees: docs/operations.md (Logs).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Literal, TextIO

from hami_trio._text import escape_control, unsafe_char

__all__ = ["LogFormat", "RateLimiter", "configure_logging", "escape_control"]

LogFormat = Literal["text", "json"]

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _escape_json_char(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON writes a code point past U+FFFF as its UTF-16 surrogate pair
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


class _TextFormatter(logging.Formatter):
    """The text format, one line per record whatever the message holds."""

    def format(self, record: logging.LogRecord) -> str:
        return escape_control(super().format(record))


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
        text = json.dumps(payload, ensure_ascii=False)
        # Outside strings JSON is ASCII, so each unsafe character is inside a string: escape
        # it there (json.dumps has escaped the C0 controls already).
        if text.isprintable():
            return text
        return "".join(_escape_json_char(char) if unsafe_char(char) else char for char in text)


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
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter(_TEXT_FORMAT))
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

    @property
    def tracked_keys(self) -> int:
        """How many keys it remembers right now (at most ``max_keys``, the oldest go first)."""
        return len(self._state)

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
