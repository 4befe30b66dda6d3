"""``promtool check metrics``: the lint gate for the agent's exposition text.

Prometheus' own linter (client_golang's promlint rules) run for real on what ``/metrics``
serves.  .ci/run unpacks Debian's ``prometheus`` package, which ships ``promtool``, so in CI
(``CI`` set) a missing binary fails the test; elsewhere the test is skipped with the reason.
For a local copy: ``cd /tmp && apt-get download prometheus && dpkg -x prometheus_*.deb
/tmp/promroot`` and put ``/tmp/promroot/usr/bin`` on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

__all__ = ["lint", "require_promtool"]

# promtool's exit status: 0 clean, 3 lint findings (anything else: it could not read the text).
_CLEAN, _FINDINGS = 0, 3


def require_promtool() -> str:
    """promtool's path; skips the test without it, fails it in CI (which installs it)."""
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool is not on PATH (Debian's prometheus package ships it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI installs it, see .ci/run")
        pytest.skip(reason)
    return path


def lint(text: str, promtool: str | None = None) -> set[tuple[str, str]]:
    """(metric, finding) for every problem ``promtool check metrics`` reports in ``text``."""
    result = subprocess.run(
        [promtool or require_promtool(), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode in (_CLEAN, _FINDINGS), f"promtool could not lint the text: {output}"
    findings = {tuple(line.split(" ", 1)) for line in output.splitlines() if line.strip()}
    assert all(len(f) == 2 for f in findings), output
    assert (result.returncode == _FINDINGS) == bool(findings), output
    return {(metric, finding) for metric, finding in findings}
