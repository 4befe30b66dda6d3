"""deploy/grafana/hami-trio.json: valid Grafana structure, and only metric names we document.

A renamed metric would silently empty a panel, so every metric name in every PromQL
expression (panel targets and template variable queries) must be one of the names the agent
documents: HAMi's upstream-compatible names (docs UPSTREAM.md) and hami-trio's own (the metric
contract between the broker, monitor and metrics work), kept below as ``DOCUMENTED_METRICS``.
Histograms may be used through their ``_bucket``/``_sum``/``_count`` series.  At integration
a second test checks the same names against the running agent's registry.

The PromQL reader here is deliberately small: it removes strings, label matchers, range
selectors, grouping clauses and Grafana variables, then every identifier that is not a
function call or a keyword is a metric name.  Its own tests below show it finds names in the
shapes the dashboard uses and flags an unknown one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hami-trio.json"

# name -> type.  Upstream (HAMi vGPUmonitor, all gauges) first, then hami-trio's own.
DOCUMENTED_METRICS: dict[str, str] = {
    "hami_host_gpu_memory_used_bytes": "gauge",
    "hami_host_gpu_utilization_ratio": "gauge",
    "hami_host_gpu_memory_controller_utilization_ratio": "gauge",
    "hami_vgpu_memory_used_bytes": "gauge",
    "hami_vgpu_memory_limit_bytes": "gauge",
    "hami_container_device_memory_bytes": "gauge",
    "hami_container_device_utilization_ratio": "gauge",
    "hami_vgpu_memory_context_bytes": "gauge",
    "hami_vgpu_memory_module_bytes": "gauge",
    "hami_vgpu_memory_buffer_bytes": "gauge",
    "hami_container_last_kernel_elapsed_seconds": "gauge",
    "hami_mig_device_info": "gauge",
    "hami_trio_broker_exchanges_total": "counter",
    "hami_trio_broker_exchanges_in_flight": "gauge",
    "hami_trio_broker_exchange_duration_seconds": "histogram",
    "hami_trio_monitor_tick_duration_seconds": "histogram",
    "hami_trio_monitor_containers": "gauge",
    "hami_trio_monitor_files_rejected_total": "counter",
    "hami_trio_monitor_mig_paused": "gauge",
    "hami_trio_container_blocked": "gauge",
    "hami_trio_pod_watch_synced": "gauge",
    "hami_trio_pod_watch_relists_total": "counter",
    "hami_build_info": "gauge",
}
# Series that carry the tenant's namespace/pod labels: panels must apply the pod selector.
POD_SCOPED = frozenset(
    {
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_memory_bytes",
        "hami_container_device_utilization_ratio",
        "hami_vgpu_memory_context_bytes",
        "hami_vgpu_memory_module_bytes",
        "hami_vgpu_memory_buffer_bytes",
        "hami_container_last_kernel_elapsed_seconds",
        "hami_trio_container_blocked",
    }
)
# What issue 7 asks the dashboard to show.
REQUIRED = frozenset(
    {
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_utilization_ratio",
        "hami_container_last_kernel_elapsed_seconds",
        "hami_trio_container_blocked",
        "hami_trio_broker_exchanges_total",
        "hami_trio_broker_exchange_duration_seconds",
        "hami_trio_monitor_tick_duration_seconds",
        "hami_trio_monitor_mig_paused",
        "hami_trio_pod_watch_synced",
        "hami_trio_pod_watch_relists_total",
    }
)

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset", "atan2", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^{}]*)\}")


def metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects."""
    assert "__name__" not in expr, f"select metrics by name, not __name__: {expr}"
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.groups()
        if call is None and name not in _KEYWORDS:
            names.add(name)
    return names


def documented(name: str) -> bool:
    if name in DOCUMENTED_METRICS:
        return True
    base, _, suffix = name.rpartition("_")
    return suffix in {"bucket", "sum", "count"} and DOCUMENTED_METRICS.get(base) == "histogram"


def base_name(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        stem = name.removesuffix(suffix)
        if stem != name and DOCUMENTED_METRICS.get(stem) == "histogram":
            return stem
    return name


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows nest their panels


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"].strip())
            assert match, f"variable {variable['name']}: expected label_values(expr, label)"
            yield f"variable {variable['name']}", match.group(1)


# --- the PromQL reader ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('hami_vgpu_memory_used_bytes{pod=~"$pod"}', {"hami_vgpu_memory_used_bytes"}),
        (
            "histogram_quantile(0.99, sum by (node, le) "
            '(rate(hami_trio_broker_exchange_duration_seconds_bucket{node=~"$node"}'
            "[$__rate_interval])))",
            {"hami_trio_broker_exchange_duration_seconds_bucket"},
        ),
        ("sum(a_total offset 5m) by (x) / on(x) group_left(y) b_info", {"a_total", "b_info"}),
        ('count(up{job="x", le="1e3"} == 0) or vector(0)', {"up"}),
        ("max_over_time(gauge_a[1h:5m]) > bool 2", {"gauge_a"}),
    ],
)
def test_metric_names_reads_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_an_undocumented_name_is_caught() -> None:
    used = metric_names('rate(hami_trio_broker_exchange_total{node=~"$node"}[5m])')
    assert [n for n in used if not documented(n)] == ["hami_trio_broker_exchange_total"]
    assert not documented("hami_trio_monitor_mig_paused_bucket")  # a gauge has no buckets
    assert documented("hami_trio_monitor_tick_duration_seconds_count")


# --- the dashboard --------------------------------------------------------------------------


def test_dashboard_top_level(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36
    assert isinstance(dashboard["panels"], list)
    assert dashboard["panels"]
    assert "id" not in dashboard or dashboard["id"] is None  # importable into any Grafana


def test_datasource_and_selector_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("node", "namespace", "pod"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[name]["includeAll"] is True


def test_panels_have_targets_on_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in all_panels(dashboard):
        assert panel["type"]
        assert panel["title"]
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"panel {panel['title']!r} has no targets"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]


def test_panels_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert pos["w"] >= 1
        assert pos["h"] >= 1
        assert pos["x"] >= 0
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_every_metric_name_is_documented(dashboard: dict[str, Any]) -> None:
    unknown = {}
    for where, expr in expressions(dashboard):
        names = metric_names(expr)
        assert names, f"{where} selects no metric: {expr}"
        for name in names:
            if not documented(name):
                unknown[name] = where
    assert unknown == {}


def test_the_issue_7_panels_are_there(dashboard: dict[str, Any]) -> None:
    used = {base_name(n) for _, expr in expressions(dashboard) for n in metric_names(expr)}
    assert used >= REQUIRED, f"missing: {sorted(REQUIRED - used)}"


def test_every_selector_applies_the_node_and_pod_selection(dashboard: dict[str, Any]) -> None:
    for where, expr in expressions(dashboard):
        if where == "variable node":
            continue  # the node list itself
        selectors = dict(_SELECTOR.findall(expr))
        for name in metric_names(expr):
            assert name in selectors, f"{where}: {name} has no label matchers"
            assert 'node=~"$node"' in selectors[name], f"{where}: {name} ignores $node"
            if base_name(name) in POD_SCOPED and not where.startswith("variable"):
                assert 'pod=~"$pod"' in selectors[name], f"{where}: {name} ignores $pod"
