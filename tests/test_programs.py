"""A fresh clone on a machine without gcc or make: the C tests skip with the reason, no error.

Runs pytest in a child process on the tests that compile C, with a ``PATH`` that holds every
program of this machine's ``PATH`` except the compilers and make, outside CI.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a machine without a C toolchain lacks.
_COMPILERS = ("gcc", "gcc-*", "*-gcc", "*-gcc-*", "cc", "c89", "c99", "make", "cpp")
_C_TESTS = ("tests/clients/test_c_client.py", "tests/bench/test_storms.py")


def _path_without_compilers(into: Path) -> str:
    into.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if any(fnmatch.fnmatch(name, pattern) for pattern in _COMPILERS):
                continue
            link = into / name
            if not os.path.lexists(link):
                link.symlink_to(os.path.join(directory, name))
    return str(into)


def test_c_tests_skip_with_the_reason_without_gcc(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = _path_without_compilers(tmp_path / "bin")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *_C_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    summary = out.strip().splitlines()[-1]
    assert "error" not in summary, out
    assert "failed" not in summary, out
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))  # type: ignore[union-attr]
    assert skipped >= 20, out
    assert "gcc is not installed: this test builds the C reference client" in out
    assert "(apt-get install gcc)" in out
