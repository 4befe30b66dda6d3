"""Fixtures for the agent tests: short private paths, a hook directory, no HTTP proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox import world_readable_dir

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def _no_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Talk to the tests' own 127.0.0.1 servers directly, never through a CI proxy."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A fresh 0755 directory under /tmp (short: Unix socket paths are limited to 107 bytes)."""
    with world_readable_dir("ht-agent-") as path:
        yield path


@pytest.fixture
def hook(base_dir: Path) -> Path:
    """``HOOK_PATH`` with an empty ``containers/``."""
    path = base_dir / "hook"
    (path / "containers").mkdir(parents=True)
    return path


@pytest.fixture
def socket_path(base_dir: Path) -> Path:
    """Where the agent's broker listens; its directory does not exist yet."""
    return base_dir / "hostpid" / "broker.sock"


@pytest.fixture
def mig_lock(base_dir: Path) -> Path:
    """The MIG apply lock path; its directory does not exist yet (the monitor creates it)."""
    return base_dir / "mig" / "hami-mig-apply.lock"
