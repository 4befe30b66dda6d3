"""Hypothesis profiles shared by the test suite (``tests/conftest.py``) and ``fuzz/run``.

- ``default``: quick, for the edit-test loop (100 examples per property);
- ``ci``: what CI's tests use when ``HYPOTHESIS_PROFILE=ci`` is set, and the base settings of
  ``fuzz/run --ci`` (which replaces ``max_examples`` with its own time budget);
- ``fuzz``: long campaigns (``fuzz/run --minutes N``), every health check off.

Deadlines are off everywhere: a shared 2-core machine makes per-example timings meaningless.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["register_profiles"]


def register_profiles() -> None:
    """Register the three profiles (idempotent: registering again replaces them)."""
    settings.register_profile("default", max_examples=100, deadline=None)
    settings.register_profile(
        "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile(
        "fuzz", max_examples=100_000, deadline=None, suppress_health_check=list(HealthCheck)
    )
