from __future__ import annotations

import pytest

from hami_trio.errors import ConfigError
from hami_trio.goparse import (
    BindAddress,
    broker_switch_from_env,
    broker_switch_on,
    parse_bind_address,
    parse_go_duration,
    parse_seconds,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", False),
        (" 1", False),
        ("1 ", False),
        ("01", False),
        ("yes", False),
        ("", False),
        ("0", False),
        (None, False),
    ],
)
def test_broker_switch_is_exactly_one(value: str | None, expected: bool) -> None:
    assert broker_switch_on(value) is expected


def test_broker_switch_from_env() -> None:
    assert broker_switch_from_env({"LIBVGPU_HOSTPID_BROKER": "1"})
    assert not broker_switch_from_env({"LIBVGPU_HOSTPID_BROKER": "true"})
    assert not broker_switch_from_env({})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300.0),
        ("90s", 90.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("0", 0.0),
        ("-2m", -120.0),
        ("+3s", 3.0),
        ("100ms", 0.1),
        ("250us", 0.00025),
        ("1\u00b5s", 1e-6),
        ("7ns", 7e-9),
        (".5h", 1800.0),
        ("2h45m30.5s", 9930.5),
    ],
)
def test_go_duration_accepts_what_go_accepts(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 m", "m", "5min", "1d", "-", "5m ", "1h-30m", "."])
def test_go_duration_rejects_and_names_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="HAMI_RESYNC_INTERVAL") as info:
        parse_go_duration(text, name="HAMI_RESYNC_INTERVAL")
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9394", BindAddress("", 9394)),
        ("127.0.0.1:0", BindAddress("127.0.0.1", 0)),
        ("[::1]:9394", BindAddress("::1", 9394)),
        ("localhost:65535", BindAddress("localhost", 65535)),
    ],
)
def test_bind_address(text: str, expected: BindAddress) -> None:
    assert parse_bind_address(text) == expected


@pytest.mark.parametrize("text", ["9394", ":", ":65536", ":-1", "::1:9394", "[::1:9394", "a:b"])
def test_bind_address_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-bind-address"):
        parse_bind_address(text)


def test_bind_address_str_round_trips() -> None:
    for text in (":9394", "127.0.0.1:80", "[::1]:9394"):
        assert str(parse_bind_address(text)) == text


@pytest.mark.parametrize(
    ("text", "seconds"), [("0.5", 0.5), ("2", 2.0), ("500ms", 0.5), ("1m", 60.0), ("1h1s", 3601.0)]
)
def test_seconds_accept_plain_seconds_or_go_durations(text: str, seconds: float) -> None:
    assert parse_seconds(text, name="--interval") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1", "-1s", "inf", "nan", "0s", "soon", "", "1e999"])
def test_seconds_must_be_positive_and_finite(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--interval") as info:
        parse_seconds(text, name="--interval")
    assert repr(text) in str(info.value)
