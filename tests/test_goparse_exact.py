"""Go's spellings, pinned: every unit, the exact error words and their default setting names.

test_goparse.py checks what Go accepts and refuses; these tests pin the rest an operator
sees: each unit's factor (both micro signs), and the message of every refusal, whose first
words name the setting (the defaults ``duration`` and ``--metrics-bind-address`` included).
"""

from __future__ import annotations

import pytest

from hami_trio.errors import ConfigError
from hami_trio.goparse import (
    BROKER_SWITCH_ENV,
    BindAddress,
    broker_switch_from_env,
    parse_bind_address,
    parse_go_duration,
    parse_seconds,
)


def refusal(call: object, *args: str, **kwargs: str) -> str:
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(info.value)


def test_the_switch_variable() -> None:
    assert BROKER_SWITCH_ENV == "LIBVGPU_HOSTPID_BROKER"
    assert broker_switch_from_env({"LIBVGPU_HOSTPID_BROKER": "1"}) is True
    assert broker_switch_from_env({"LIBVGPU_HOSTPID_BROKER": "0"}) is False
    assert broker_switch_from_env({}) is False


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3ns", 3e-9),
        ("3us", 3e-6),
        ("3\u00b5s", 3e-6),  # MICRO SIGN
        ("3\u03bcs", 3e-6),  # GREEK SMALL LETTER MU
        ("3ms", 3e-3),
        ("3s", 3.0),
        ("3m", 180.0),
        ("3h", 10800.0),
        ("1h1m1s", 3661.0),
        ("+2m", 120.0),
        ("-2m", -120.0),
        ("-0", 0.0),
        ("0", 0.0),
        (".5s", 0.5),
        ("5.s", 5.0),
    ],
)
def test_every_unit(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text", ["", "+", "-", "5", "5x", "1h 1m", "m"])
def test_duration_refusals_name_the_default_setting(text: str) -> None:
    assert refusal(parse_go_duration, text) == (
        f"duration: invalid duration {text!r} (expected e.g. 5m, 90s, 1h30m)"
    )
    assert refusal(parse_go_duration, text, name="--tick") == (
        f"--tick: invalid duration {text!r} (expected e.g. 5m, 90s, 1h30m)"
    )


@pytest.mark.parametrize("text", ["0", "-1", "0s", "-5m", "nan", "inf"])
def test_seconds_refusal_words(text: str) -> None:
    assert refusal(parse_seconds, text, name="--interval") == (
        f"--interval must be a positive duration, got {text!r}"
    )


def test_seconds_pass_the_name_to_the_duration_parser() -> None:
    assert refusal(parse_seconds, "5x", name="--interval") == (
        "--interval: invalid duration '5x' (expected e.g. 5m, 90s, 1h30m)"
    )
    assert parse_seconds("1e-3", name="x") == 0.001


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9394", "'9394' has no port (expected host:port or :port)"),
        ("[::1:9394", "'[::1:9394' has an unbalanced '[' in its host"),
        ("::1:9394", "'::1:9394': put an IPv6 host in brackets, e.g. [::1]:9394"),
        (":65536", "':65536' has an invalid port '65536' (0..65535)"),
        (":", "':' has an invalid port '' (0..65535)"),
        (":-1", "':-1' has an invalid port '-1' (0..65535)"),
    ],
)
def test_bind_address_refusals_name_the_default_flag(text: str, message: str) -> None:
    assert refusal(parse_bind_address, text) == f"--metrics-bind-address: {message}"
    assert refusal(parse_bind_address, text, name="--debug") == f"--debug: {message}"


def test_bind_address_edges() -> None:
    assert parse_bind_address(":0") == BindAddress("", 0)
    assert parse_bind_address(":65535") == BindAddress("", 65535)
    assert parse_bind_address("[::1]:80") == BindAddress("::1", 80)
    assert str(BindAddress("::1", 80)) == "[::1]:80"
    assert str(BindAddress("", 9394)) == ":9394"
    assert str(BindAddress("10.0.0.1", 1)) == "10.0.0.1:1"
