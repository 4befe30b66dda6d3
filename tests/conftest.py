"""Shared pytest configuration: hypothesis profiles and the ``root`` marker.

Hypothesis profiles (defined in ``tests/profiles.py``, shared with ``fuzz/run``): ``default``
(quick, for the edit-test loop), ``ci`` and ``fuzz`` (long campaigns); pick one with
``HYPOTHESIS_PROFILE``.

Tests marked ``@pytest.mark.root`` use real kernel objects that need euid 0 (PID and mount
namespaces, bind mounts, chown, setuid).  Without root they are skipped, except in CI
(``CI`` set), where a skipped security test would be a silent gap, so they fail instead.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.profiles import register_profiles

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is None or os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        pytest.fail("this test needs root (euid 0) and CI must run as root")
    pytest.skip("needs root (euid 0)")
