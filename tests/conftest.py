"""Shared pytest configuration: hypothesis profiles, the ``root`` marker, common fixtures.

Hypothesis profiles (defined in ``tests/profiles.py``, shared with ``fuzz/run``): ``default``
(quick, for the edit-test loop), ``ci`` and ``fuzz`` (long campaigns); pick one with
``HYPOTHESIS_PROFILE``.

Tests marked ``@pytest.mark.root`` use real kernel objects that need euid 0 (PID and mount
namespaces, bind mounts, chown, setuid).  Without root they are skipped, except in CI
(``CI`` set), where a skipped security test would be a silent gap, so they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.profiles import register_profiles
from tests.sandbox import world_readable_dir

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is None or os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        pytest.fail("this test needs root (euid 0) and CI must run as root")
    pytest.skip("needs root (euid 0)")


_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def _no_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Talk to the tests' own servers on 127.0.0.1 directly.

    aiohttp (``trust_env``) and urllib honour ``HTTP_PROXY`` and friends; on a CI machine
    behind a proxy they would send the fake API server's and the metrics endpoint's requests
    to the proxy instead.
    """
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
    """Where a test broker (alone or in the agent) listens; its directory does not exist yet."""
    return base_dir / "hostpid" / "broker.sock"


@pytest.fixture
def mig_lock(base_dir: Path) -> Path:
    """The MIG apply lock path; its directory does not exist yet (the monitor creates it)."""
    return base_dir / "mig" / "hami-mig-apply.lock"
