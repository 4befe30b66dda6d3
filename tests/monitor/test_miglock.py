"""The MIG lock directory: made at start-up with mode 0755, never fatal.

The lock's checks as the running monitor meets them (an unsafe directory refused and never
followed, a check that cannot run) are in test_loop.py, where the monitor is served.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from hami_trio.monitor.miglock import prepare_mig_lock_dir


def test_prepare_lock_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = os.umask(0o077)
    try:
        prepare_mig_lock_dir(tmp_path / "a" / "hami")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "hami").stat().st_mode) == 0o755
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o700)
    prepare_mig_lock_dir(existing)
    assert stat.S_IMODE(existing.stat().st_mode) == 0o700  # not ours to change
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING):
        prepare_mig_lock_dir(tmp_path / "file" / "hami")  # never fatal
        prepare_mig_lock_dir(tmp_path / "file")
    assert len(caplog.records) == 2
