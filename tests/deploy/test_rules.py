"""The chart's alert rules, checked and unit-tested by the real promtool.

``deploy/helm/hami-trio/files/hami-trio-rules.yaml`` is a plain Prometheus rules file (the
chart's PrometheusRule renders it, see tests/deploy/test_chart.py); its unit tests are
``deploy/prometheus/hami-trio-rules_test.yaml``, where each alert has input series that make
it fire for one node and stay silent for another.  ``promtool check rules`` and
``promtool test rules`` run on them here; a test also mutates a rule and sees the unit tests
fail, so they cannot pass whatever the rules say.  tests/deploy/test_prometheus.py loads the
same rules into a real Prometheus scraping a real agent.

promtool comes from Debian's ``prometheus`` package (.ci/run unpacks it onto ``PATH``).
Without it these tests skip with the reason; in CI (``CI`` set) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "helm" / "hami-trio" / "files" / "hami-trio-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "hami-trio-rules_test.yaml"
# The alerts the chart must ship (an alert removed from the file fails here).
ALERTS = frozenset(
    {
        "HamiTrioAgentDown",
        "HamiTrioPodWatchNotSynced",
        "HamiTrioMonitorNotTicking",
        "HamiTrioBrokerPressure",
        "HamiTrioBrokerPeerErrors",
        "HamiTrioContainerNearMemoryLimit",
        "HamiTrioContainerHostPidUnknown",
        "HamiTrioLockParentRefused",
        "HamiTrioMigLockDirUnsafe",
        "HamiTrioForeignMonitor",
        "HamiTrioForeignBroker",
        "HamiTrioRemovalsFailing",
        "HamiTrioCollectorErrors",
    }
)


def prometheus_binary(name: str) -> str:
    """The path of ``name`` (promtool, prometheus); skip without it, fail in CI."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not on PATH and CI must have it (.ci/run unpacks Debian's)")
        pytest.skip(f"{name} is not installed (Debian's prometheus package has it)")
    return found


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [prometheus_binary("promtool"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=cwd,
    )


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_rules_file_has_every_alert_once() -> None:
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), names
    assert set(names) == ALERTS
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]


def test_only_the_agent_down_rule_names_the_job() -> None:
    # The chart replaces exactly this text with its Service name (templates/prometheusrule.yaml).
    assert RULES.read_text().count('job="hami-trio"') == 1
    (down,) = [rule for rule in rules() if rule["alert"] == "HamiTrioAgentDown"]
    assert 'job="hami-trio"' in down["expr"]


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [os.path.relpath(RULES, RULE_TESTS.parent)]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert firing == ALERTS
    assert silent == ALERTS


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("> 0.9", "> 0.99"),  # the memory threshold
        ("unless on (job, instance) hami_trio_monitor_mig_paused == 1", ""),  # MIG pause
        ('outcome=~"rejected_full|timeout"', 'outcome=~"rejected_full"'),
        ("hami_trio_lock_parent_ok == 0", "hami_trio_lock_parent_ok == 2"),
        ("for: 5m", "for: 1m"),
        ('processes{state="unknown"} > 0', 'processes{state!="running"} > 0'),
        ("for: 10m", "for: 5m"),
    ],
    ids=["memory", "mig-pause", "broker-timeout", "lock-parent", "for", "pid-state", "pid-for"],
)
def test_the_unit_tests_catch_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    text = RULES.read_text()
    assert old in text
    rules_dir = tmp_path / "helm" / "hami-trio" / "files"
    rules_dir.mkdir(parents=True)
    (rules_dir / RULES.name).write_text(text.replace(old, new))
    (tmp_path / "prometheus").mkdir()
    copy = tmp_path / "prometheus" / RULE_TESTS.name
    copy.write_text(RULE_TESTS.read_text())
    assert promtool("check", "rules", str(rules_dir / RULES.name)).returncode == 0
    result = promtool("test", "rules", str(copy))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout + result.stderr
