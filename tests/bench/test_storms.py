"""The storm pieces of bench/concurrent_start.py, without a GPU and without root.

The real-CUDA path is exercised against a fake ``libcuda`` compiled here (same entry points,
each sleeping a little), so the ctypes calls, the phases and the serialising lock are checked
for real; the "no CUDA" path against a library that does not exist and against a driver whose
``cuInit`` fails.  The fallback model and the report parser are checked on their own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench._storm import parse_storm
from tests.programs import need

ROOT = Path(__file__).resolve().parents[2]
PYSTORM = ROOT / "bench" / "pystorm.py"

FAKE_CUDA = r"""
#include <unistd.h>
#ifndef INIT_RESULT
#define INIT_RESULT 0
#endif
int cuInit(unsigned flags) { (void)flags; usleep(1000); return INIT_RESULT; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    (void)dev; usleep(20000); *ctx = (void *)1; return 0;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; usleep(5000); return 0; }
"""


def _fake_cuda(tmp_path: Path, init_result: int = 0) -> Path:
    need("gcc", "builds a fake CUDA driver")
    source = tmp_path / "fake_cuda.c"
    source.write_text(FAKE_CUDA)
    lib = tmp_path / f"libcuda-fake-{init_result}.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-DINIT_RESULT={init_result}", "-o", lib, source],
        check=True,
    )
    return lib


def _pystorm(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, PYSTORM, *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_no_cuda_library_skips_without_forking() -> None:
    done = _pystorm("cuda", "--storm", "3", "--libcuda", "/nonexistent/libcuda.so.1")
    assert done.returncode == 3
    assert done.stdout.startswith("cuda unavailable: /nonexistent/libcuda.so.1 not loadable")
    assert "clients=" not in done.stdout


def test_driver_without_gpu_skips(tmp_path: Path) -> None:
    lib = _fake_cuda(tmp_path, init_result=100)  # CUDA_ERROR_NO_DEVICE
    done = _pystorm("cuda", "--storm", "3", "--libcuda", lib)
    assert done.returncode == 3
    assert "cuInit(0) failed with CUresult 100" in done.stdout


def test_real_cuda_path_against_a_fake_driver(tmp_path: Path) -> None:
    lib = _fake_cuda(tmp_path)
    free = _pystorm("cuda", "--storm", "4", "--libcuda", lib)
    locked = _pystorm("cuda", "--storm", "4", "--libcuda", lib, "--lock", tmp_path / "lock")
    for done in (free, locked):
        assert done.returncode == 0, done.stdout + done.stderr
        report = parse_storm(done.stdout)
        assert report is not None
        assert report.all_ok
        assert report.clients == 4
        for phase in ("init", "retain", "release"):
            assert f"phases_ms {phase} p50=" in done.stdout
    free_report, locked_report = parse_storm(free.stdout), parse_storm(locked.stdout)
    assert free_report is not None
    assert locked_report is not None
    # Under the lock the four 25 ms critical sections run one after the other.
    assert locked_report.wall_ms >= 4 * 25
    assert locked_report.max_ms >= 4 * 25


def test_fallback_model_serialises_the_critical_section(tmp_path: Path) -> None:
    need("gcc", "builds the fallback model")
    model = tmp_path / "fallback_model"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            model,
            ROOT / "bench" / "fallback_model.c",
        ],
        check=True,
    )
    done = subprocess.run(
        [model, "--storm", "5", "--hold-ms", "20", tmp_path / "lock"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    report = parse_storm(done.stdout)
    assert report is not None
    assert report.all_ok
    assert report.wall_ms >= 5 * 20
    assert report.p50_ms < report.max_ms
    usage = subprocess.run([model, "--storm", "0", "x"], capture_output=True, text=True)
    assert usage.returncode == 2


@pytest.mark.parametrize(
    ("text", "ok", "failures"),
    [
        (
            "clients=3 successful=3 failed=0 wall_ms=1.5\n"
            "latency_ms p50=0.20 p99=0.40 max=0.40 distinct_pids=3 answers_equal_local_pid=0 "
            "fork_ms=0.9\n",
            True,
            "",
        ),
        (
            "clients=3 successful=2 failed=1 wall_ms=501.0\n"
            "latency_ms p50=0.20 p99=500.00 max=500.10 distinct_pids=2 fork_ms=0.9\n"
            "failures: timeout=1\n",
            False,
            "timeout=1",
        ),
        (
            "clients=2 successful=2 failed=0 wall_ms=1.0\n"
            "latency_ms p50=0.20 p99=0.40 max=0.40 distinct_pids=1 fork_ms=0.9\n",
            False,
            "",
        ),
    ],
)
def test_parse_storm(text: str, ok: bool, failures: str) -> None:
    report = parse_storm(text)
    assert report is not None
    assert report.all_ok is ok
    assert report.failures == failures
    assert parse_storm("clients=3 successful=3") is None
