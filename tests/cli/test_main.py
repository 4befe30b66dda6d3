from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import hami_trio
from hami_trio.cli.main import COMMANDS, build_parser, image_lines, main


def test_version_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hami-trio {hami_trio.__version__}\n")
    assert "\ntrio " in out


def test_unknown_command_is_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2


def test_module_entry_point_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hami_trio", "--version"], capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == f"hami-trio {hami_trio.__version__}"


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    return {
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }


def test_every_command_is_mapped_to_the_module_that_registers_it() -> None:
    assert _commands(build_parser()) == {*COMMANDS, "version"}
    for command in COMMANDS:
        assert command in _commands(build_parser(command))


def test_a_command_builds_only_its_own_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert _commands(build_parser("hostpid")) == {"hostpid", "version"}
    # a typo still gets the full list of choices
    with pytest.raises(SystemExit):
        main(["hostpd"])
    err = capsys.readouterr().err
    assert "invalid choice: 'hostpd'" in err
    assert all(f"'{command}'" in err for command in COMMANDS)


def test_an_unknown_option_before_the_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--bogus"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus" in err
    assert "required" not in err


def test_a_subcommand_error_prints_the_subcommands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["status", "--bogus"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: hami-trio status ")
    assert "hami-trio status: error: unrecognized arguments: --bogus" in err


def test_no_help_text_shows_a_doubled_percent_sign() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        assert "%%" not in sub.format_help(), name


def test_image_lines_say_what_the_labels_say(tmp_path: Path) -> None:
    info = tmp_path / "image.json"
    assert image_lines(str(info)) == []  # outside the image: nothing
    info.write_text(
        '{"version": "0.1.0", "revision": "abc123", "source": "https://example.org/x", '
        '"base": "python:3.12-slim-bookworm@sha256:' + "0" * 64 + '"}\n'
    )
    assert image_lines(str(info)) == [
        "image version 0.1.0",
        "image revision abc123",
        "image source https://example.org/x",
        f"image base python:3.12-slim-bookworm@sha256:{'0' * 64}",
    ]
    info.write_text("not json")
    assert image_lines(str(info)) == []
