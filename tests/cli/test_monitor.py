"""``hami-trio inspect`` and ``hami-trio monitor``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hami_trio.cli.main import main
from hami_trio.monitor.layout import Format
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)

SCHEMA = {
    "path",
    "format",
    "major",
    "minor",
    "file_size",
    "device_count",
    "active_slots",
    "priority",
    "recent_kernel",
    "utilization_switch",
    "last_kernel_time",
    "devices",
}
DEVICE_SCHEMA = {
    "index",
    "uuid",
    "memory_limit",
    "sm_limit",
    "memory_total",
    "context_size",
    "module_size",
    "buffer_size",
    "offset",
    "sm_util",
}


def region(path: Path, fmt: Format = Format.V1) -> None:
    write_region(
        path,
        RegionSpec(
            format=fmt,
            num=3,
            uuids=["GPU-a", b"\xff\xfe", b""],
            limits=[1 << 30, 2 << 30, 3 << 30],
            sm_limits=[10, 20, 30],
            procs=[
                ProcSlot(
                    used=[
                        MemoryUse(context_size=1, module_size=2, data_size=3, offset=4, total=10)
                    ],
                    util=[UtilUse(sm_util=42)],
                ),
                ProcSlot(status=0, used=[MemoryUse(total=999)]),
            ],
            priority=2,
            recent_kernel=-1,
            utilization_switch=1,
            last_kernel_time=1_700_000_000 if fmt is Format.V1 else 0,
        ),
    )


def test_inspect_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.cache"
    region(path)
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == SCHEMA
    assert {k: doc[k] for k in SCHEMA - {"devices"}} == {
        "path": str(path),
        "format": "v1",
        "major": 1,
        "minor": 2,
        "file_size": 2008953,
        "device_count": 3,
        "active_slots": 1,
        "priority": 2,
        "recent_kernel": -1,
        "utilization_switch": 1,
        "last_kernel_time": 1_700_000_000,
    }
    assert [set(d) for d in doc["devices"]] == [DEVICE_SCHEMA] * 3
    assert doc["devices"][0] == {
        "index": 0,
        "uuid": "GPU-a",
        "memory_limit": 1 << 30,
        "sm_limit": 10,
        "memory_total": 10,
        "context_size": 1,
        "module_size": 2,
        "buffer_size": 3,
        "offset": 4,
        "sm_util": 42,
    }
    assert doc["devices"][1]["uuid"] is None  # not UTF-8
    assert doc["devices"][2]["uuid"] is None  # unused


def test_inspect_json_v0_has_no_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.cache"
    region(path, Format.V0)
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["format"], doc["major"], doc["minor"], doc["last_kernel_time"]) == (
        "v0",
        None,
        None,
        0,
    )


def test_inspect_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.cache"
    region(path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format             v1, version 1.2, 2008953 bytes" in out
    assert "recent_kernel      -1  (blocked)" in out
    assert "GPU-a" in out
    assert "<invalid_utf8>" in out
    assert "<unused>" in out


@pytest.mark.parametrize("kind", ["garbage", "zero", "symlink", "fifo", "missing", "mislayout"])
def test_inspect_bad_file_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "x.cache"
    if kind == "garbage":
        path.write_bytes(b"\x01" * 100)
        expected = "magic flag not matched: found 16843009, expected 19920718 (size 100, header "
        expected += "version 16843009.16843009): not a HAMi-core shared-region file"
    elif kind == "zero":
        path.write_bytes(b"\0" * 100)
        expected = "found 0, expected 19920718 (size 100): HAMi-core has not finished initialising"
    elif kind == "symlink":
        region(tmp_path / "real.cache")
        path.symlink_to(tmp_path / "real.cache")
        expected = "symlink"
    elif kind == "fifo":
        os.mkfifo(path)
        expected = "FIFO"
    elif kind == "mislayout":
        path.write_bytes((19920718).to_bytes(4, "little") + b"\1\0\0\0\1\0\0\0")
        os.truncate(path, 2008985)
        expected = "unknown cache file size 2008985 version 1.1"
    else:
        expected = "no such file"
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hami-trio inspect: ")
    assert expected in err
    assert str(path) in err


def test_monitor_needs_hook_path_and_a_pod_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOOK_PATH", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["monitor", "--no-kubernetes"]) == 2
    assert "HOOK_PATH is not set" in capsys.readouterr().err
    assert main(["monitor", "--no-kubernetes", "--hook-path", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["monitor", "--hook-path", str(tmp_path)]) == 2
    assert "--no-kubernetes" in capsys.readouterr().err


def test_commands_are_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "inspect" in out
    assert "monitor" in out


def test_monitor_runs_in_the_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    directory = hook / "containers" / "uid_main"
    directory.mkdir(parents=True)
    write_region(directory / "x.cache", RegionSpec(uuids=["GPU-0"], recent_kernel=-1))
    work = SimulatedWorkload(directory / "x.cache")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hami_trio",
            "monitor",
            "--no-kubernetes",
            "--hook-path",
            str(hook),
            "--interval",
            "0.05",
            "--mig-lock-path",
            str(tmp_path / "mig" / "lock"),
            "--metrics-bind-address",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while work.read_control()[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert work.read_control()[0] == 0  # unblocked by the running monitor
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "SIGTERM, stopping after the current tick" in err
    assert (tmp_path / "mig").is_dir()


def test_monitor_prints_its_configuration_without_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LIBVGPU_HOSTPID_BROKER", "1")  # monitor never runs the broker
    hook = str(tmp_path / "hook")
    assert main(["monitor", "--no-kubernetes", f"--hook-path={hook}", "--print-config"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hook_path"] == hook
    assert doc["broker"]["enabled"] is False
    assert doc["sources"]["hook_path"] == "--hook-path"
