"""Fixtures for the broker tests: short, private socket paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox import world_readable_dir


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A fresh 0755 directory under /tmp (short: Unix socket paths are limited to 107 bytes)."""
    with world_readable_dir("ht-broker-") as path:
        yield path


@pytest.fixture
def socket_path(base_dir: Path) -> Path:
    """Where a test broker listens; its directory does not exist yet."""
    return base_dir / "hostpid" / "broker.sock"
