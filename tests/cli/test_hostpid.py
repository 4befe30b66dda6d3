"""``hami-trio hostpid``: output and exit status (the exchange itself: tests/clients)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_trio.cli.main import main


def test_no_answer_prints_the_reason_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absent" / "broker.sock"
    assert main(["hostpid", "--socket-path", str(path), "--ignore-switch"]) == 1
    out, err = capsys.readouterr()
    assert out == "missing\n"
    assert err.startswith(f"hami-trio hostpid: --socket-path {path}: missing: ")
    assert str(path.parent) in err


@pytest.mark.parametrize("value", ["", "true", " 1", "01"])
def test_follows_the_switch_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("LIBVGPU_HOSTPID_BROKER", value)
    assert main(["hostpid", "--socket-path", str(tmp_path / "absent" / "b.sock")]) == 1
    assert capsys.readouterr().out == "disabled\n"


def test_switch_1_queries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIBVGPU_HOSTPID_BROKER", "1")
    assert main(["hostpid", "--socket-path", str(tmp_path / "absent" / "b.sock")]) == 1
    assert capsys.readouterr().out == "missing\n"


@pytest.mark.parametrize("deadline", ["0", "-1", "nan", "inf", "3601"])
def test_bad_deadline_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], deadline: str
) -> None:
    args = ["hostpid", "--socket-path", str(tmp_path / "b.sock"), "--deadline", deadline]
    assert main(args) == 2
    assert "--deadline" in capsys.readouterr().err


def test_non_numeric_deadline_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["hostpid", "--deadline", "soon"])
    assert info.value.code == 2
