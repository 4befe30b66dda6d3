"""System programs some tests need beyond Python (gcc, make): skip with the reason, or fail in CI.

A fresh clone on a machine without a C compiler runs the README's test command too: the tests
that compile the C reference client or a C model skip, naming the program and the package
that provides it, instead of erroring with ``FileNotFoundError: 'gcc'``.  In CI (``CI`` set;
``.ci/run`` runs on a machine that has them) a missing program fails the test: a skipped
security test there would be a silent gap.
"""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["PACKAGES", "need"]

#: The Debian package of each program (what the skip reason tells the reader to install).
PACKAGES = {"gcc": "gcc", "make": "make"}


def need(program: str, what: str) -> None:
    """Skip (fail in CI) the calling test or fixture unless ``program`` is on ``PATH``.

    Args:
        program: the executable, e.g. ``gcc``.
        what: what the test uses it for, e.g. ``builds the C reference client``.
    """
    if shutil.which(program) is not None:
        return
    message = (
        f"{program} is not installed: this test {what} "
        f"(apt-get install {PACKAGES.get(program, program)})"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
