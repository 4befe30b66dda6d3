from __future__ import annotations

import subprocess
import sys

import pytest

import hami_trio
from hami_trio.cli.main import main


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
