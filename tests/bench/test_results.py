"""The results-directory framework of the benchmarks (bench/_results.py): quick checks only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _results
from bench._results import Results, markdown_table, verify, write_checksums

ROOT = Path(__file__).resolve().parents[2]


def _make(tmp_path: Path) -> Path:
    with Results("demo", argv=["bench/demo.py", "--quick"], root=tmp_path) as res:
        with res.tee():
            print("hello from the benchmark")
        res.run(
            [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
            name="child",
        )
        res.raw("figures.json", json.dumps({"x": 1}))
        res.summary(
            "Demo benchmark",
            headers=["N", "p50 ms"],
            rows=[[50, 1.5], [300, 2.5]],
            figures={"p50_ms_n300": 2.5},
            notes=["p50: median per-process latency"],
        )
    return res.path


def test_directory_holds_raw_output_commands_environment_and_summary(tmp_path: Path) -> None:
    path = _make(tmp_path)
    assert path.parent == tmp_path
    assert path.name.startswith("demo-")
    assert (path / "raw" / "console.txt").read_text() == "hello from the benchmark\n"
    assert (path / "raw" / "child.out").read_text() == "out\n"
    assert (path / "raw" / "child.err").read_text() == "err\n"
    commands = (path / "commands.txt").read_text()
    assert "bench/demo.py --quick" in commands
    assert "import sys; print" in commands
    assert "rc=0" in commands

    env = json.loads((path / "environment.json").read_text())
    for key in ("cpu_model", "cpu_count", "kernel", "distribution", "python", "packages", "gpus"):
        assert env[key], key
    assert "hypothesis" in {name.lower() for name in env["packages"]}

    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert len(manifest["git_revision"]) == 40
    assert isinstance(manifest["git_dirty"], bool)
    assert manifest["commands"][0]["returncode"] == 0

    summary = (path / "summary.md").read_text()
    assert summary.startswith("# Demo benchmark\n")
    assert "| N | p50 ms |" in summary
    assert "| 300 | 2.5 |" in summary
    assert "p50: median per-process latency" in summary
    assert json.loads((path / "summary.json").read_text())["figures"] == {"p50_ms_n300": 2.5}


def test_checksums_cover_every_file_and_verify(tmp_path: Path) -> None:
    path = _make(tmp_path)
    listed = [line.split("  ", 1)[1] for line in (path / "SHA256SUMS").read_text().splitlines()]
    every = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert sorted([*listed, "SHA256SUMS"]) == every
    assert verify(path) == []
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=path, check=True)


def test_verify_reports_changed_missing_and_extra_files(tmp_path: Path) -> None:
    path = _make(tmp_path)
    (path / "raw" / "child.out").write_text("tampered\n")
    (path / "raw" / "figures.json").unlink()
    (path / "extra.txt").write_text("added later\n")
    assert verify(path) == [
        "raw/child.out: checksum mismatch",
        "raw/figures.json: listed but missing",
        "extra.txt: not listed",
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "_results.py"), "verify", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "checksum mismatch" in done.stdout
    write_checksums(path)
    assert verify(path) == []


def test_a_failed_benchmark_is_recorded_and_still_sealed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Results("broken", argv=["x"], root=tmp_path) as res:
        raise RuntimeError("server died")
    manifest = json.loads((res.path / "manifest.json").read_text())
    assert manifest["status"] == "failed: RuntimeError: server died"
    assert verify(res.path) == []


def test_dirty_source_is_kept_as_a_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _results.GitState("a" * 40, "a" * 12, True, "main", " M x.py\n", "diff --git x\n")
    monkeypatch.setattr(_results, "git_state", lambda: state)
    with Results("dirty", argv=["x"], root=tmp_path) as res:
        pass
    assert res.path.name.endswith("-aaaaaaaa-dirty")
    assert (res.path / "source.diff").read_text() == "diff --git x\n"
    assert (res.path / "source.status").read_text() == " M x.py\n"


def test_raw_names_stay_unique_and_safe(tmp_path: Path) -> None:
    with Results("names", argv=["x"], root=tmp_path) as res:
        first = res.raw("run c=64/ours.json", "1")
        second = res.raw("run c=64/ours.json", "2")
    assert first.parent == second.parent == res.path / "raw"
    assert first != second
    assert first.read_text() == "1"


def test_markdown_table() -> None:
    assert markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n| --- | --- |\n| 1 | x |\n"
