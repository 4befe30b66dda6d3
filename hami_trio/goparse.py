"""Parsers for the configuration values hami-trio shares with HAMi's Go components.

HAMi configures its node components with Go conventions: durations such as ``5m`` or
``1h30m`` (``time.ParseDuration``), listen addresses such as ``:9394`` (``net.Listen``), and an
on/off switch ``LIBVGPU_HOSTPID_BROKER`` that is on only for the exact string ``1``.  Operators
copy these values between HAMi and hami-trio, so we accept exactly the same spellings and
reject everything else with a :class:`~hami_trio.errors.ConfigError` that names the setting.

All functions here are pure: they take strings and return values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hami_trio.errors import ConfigError

__all__ = [
    "BROKER_SWITCH_ENV",
    "BindAddress",
    "broker_switch_from_env",
    "broker_switch_on",
    "parse_bind_address",
    "parse_go_duration",
    "parse_seconds",
]

#: The environment variable that turns the host PID broker (server and client) on.
BROKER_SWITCH_ENV = "LIBVGPU_HOSTPID_BROKER"

# Go's time.ParseDuration units, in seconds.  "µs" is U+00B5 and "μs" U+03BC: Go accepts both.
_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_COMPONENT = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def broker_switch_on(value: str | None) -> bool:
    """Tell whether a ``LIBVGPU_HOSTPID_BROKER`` value turns the broker on.

    Only the exact string ``"1"`` is on: ``"true"``, ``" 1"``, ``"01"``,
    ``"yes"``, ``""`` and an unset variable (``None``) are all off.  The rule is deliberately
    strict so that server, client and allocation always agree.
    """
    return value == "1"


def broker_switch_from_env(env: Mapping[str, str]) -> bool:
    """:func:`broker_switch_on` applied to ``env[LIBVGPU_HOSTPID_BROKER]``."""
    return broker_switch_on(env.get(BROKER_SWITCH_ENV))


def parse_go_duration(text: str, *, name: str = "duration") -> float:
    """Parse a Go ``time.ParseDuration`` string into seconds.

    Accepts what Go accepts: an optional sign, then one or more ``<number><unit>`` parts with
    units ``ns us µs ms s m h`` (``1h30m``, ``1.5s``, ``90s``, ``-2m``), or a bare ``0``.

    Args:
        text: the value as the operator wrote it.
        name: the flag or variable it came from, used in the error message.

    Returns:
        The duration in seconds (may be negative or zero; the caller decides what is valid).

    Raises:
        ConfigError: the text is not a Go duration.
    """
    body = text
    sign = 1.0
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        raise ConfigError(f"{name}: invalid duration {text!r} (expected e.g. 5m, 90s, 1h30m)")
    total = 0.0
    pos = 0
    while pos < len(body):
        match = _COMPONENT.match(body, pos)
        if match is None:
            raise ConfigError(f"{name}: invalid duration {text!r} (expected e.g. 5m, 90s, 1h30m)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def parse_seconds(text: str, *, name: str) -> float:
    """Parse a positive duration written as seconds (``0.5``) or as a Go duration (``500ms``).

    hami-trio's own duration flags accept both: plain seconds are what Python users write,
    Go durations what HAMi's operators copy from its configuration.

    Args:
        text: the value as the operator wrote it.
        name: the flag or variable it came from, used in the error message.

    Returns:
        The duration in seconds, finite and above 0.

    Raises:
        ConfigError: neither spelling, or not a positive, finite duration.
    """
    try:
        seconds = float(text)
    except ValueError:
        seconds = parse_go_duration(text, name=name)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"{name} must be a positive duration, got {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class BindAddress:
    """A listen address.  ``host == ""`` means every interface, like Go's ``:9394``."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_bind_address(text: str, *, name: str = "--metrics-bind-address") -> BindAddress:
    """Parse a Go-style ``host:port`` listen address.

    ``:9394`` listens on every interface, ``127.0.0.1:9394`` on one address, ``[::1]:9394`` on an
    IPv6 address.  The port must be 0..65535 (0 = pick a free port, useful in tests).

    Raises:
        ConfigError: no port, a port out of range, or an unbalanced IPv6 bracket.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ConfigError(f"{name}: {text!r} has no port (expected host:port or :port)")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ConfigError(f"{name}: {text!r} has an unbalanced '[' in its host")
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{name}: {text!r}: put an IPv6 host in brackets, e.g. [::1]:9394")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{name}: {text!r} has an invalid port {port_text!r} (0..65535)")
    return BindAddress(host=host, port=int(port_text))
