from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_trio.cli.main import main
from hami_trio.goparse import BROKER_SWITCH_ENV
from tests.allocation.immutable import clear_immutable

ME = str(os.geteuid())


@pytest.fixture
def lock(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp").chmod(0o1777)
    yield tmp_path / "tmp" / "vgpulock"
    clear_immutable(tmp_path)  # with the broker on, root's preparation made hostpid immutable


def feed_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_prepare_lock_dir_succeeds_silently(lock: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare-lock-dir", str(lock), "--owner", ME]) == 0
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o1777
    assert capsys.readouterr() == ("", "")


def test_prepare_lock_dir_refusal_is_one_line_and_exit_1(
    lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock.symlink_to(tmp_path)
    assert main(["prepare-lock-dir", str(lock), "--owner", ME]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"hami-trio prepare-lock-dir: {lock}: is a symlink")


def test_prepare_lock_dir_rejects_a_non_numeric_owner() -> None:
    with pytest.raises(SystemExit) as info:
        main(["prepare-lock-dir", "/tmp/vgpulock", "--owner", "root"])
    assert info.value.code == 2


@pytest.mark.parametrize("switch", ["1", "true", None])
def test_allocate_filter(
    lock: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    switch: str | None,
) -> None:
    if switch is None:
        monkeypatch.delenv(BROKER_SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(BROKER_SWITCH_ENV, switch)
    request = {
        "envs": {BROKER_SWITCH_ENV: "1", "A": "b"},
        "mounts": [{"container_path": "/tmp//vgpulock/", "host_path": "/elsewhere"}],
    }
    feed_stdin(monkeypatch, json.dumps(request).encode())
    assert main(["allocate", "--lock-parent", str(lock), "--owner", ME]) == 0
    out = json.loads(capsys.readouterr().out)
    parent = {"container_path": "/tmp/vgpulock", "host_path": str(lock)}
    broker = {
        "container_path": "/tmp/vgpulock/hostpid",
        "host_path": "/var/run/hami/hostpid",
        "read_only": True,
    }
    if switch == "1":
        assert out == {"envs": {"A": "b", BROKER_SWITCH_ENV: "1"}, "mounts": [parent, broker]}
    else:
        assert out == {"envs": {"A": "b"}, "mounts": [parent]}


def test_allocate_refusal_writes_no_response(
    lock: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lock.write_text("")
    feed_stdin(monkeypatch, b"{}")
    assert main(["allocate", "--lock-parent", str(lock), "--owner", ME]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "is a regular file" in captured.err


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"not json", "not valid JSON"), (b'{"mount": []}', "unknown field 'mount'")],
)
def test_allocate_malformed_input_is_exit_2(
    lock: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data: bytes,
    message: str,
) -> None:
    feed_stdin(monkeypatch, data)
    assert main(["allocate", "--lock-parent", str(lock), "--owner", ME]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert not lock.exists()  # input is validated before anything is touched


def test_allocate_as_a_subprocess_like_a_go_plugin_runs_it(lock: Path) -> None:
    env = dict(os.environ, **{BROKER_SWITCH_ENV: "1"})
    proc = subprocess.run(
        [sys.executable, "-m", "hami_trio", "allocate", "--lock-parent", str(lock), "--owner", ME],
        input=b'{"mounts":[{"container_path":"/tmp/vgpulock/hostpid","host_path":"/evil"}]}',
        capture_output=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (0, b"")
    mounts = json.loads(proc.stdout)["mounts"]
    assert [m["container_path"] for m in mounts] == ["/tmp/vgpulock", "/tmp/vgpulock/hostpid"]
    assert mounts[1]["host_path"] == "/var/run/hami/hostpid"
