from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import hami_trio
from hami_trio.cli.main import COMMANDS, build_parser, main


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
