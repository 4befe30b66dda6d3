"""deploy/grafana/hami-trio.json: generated, valid Grafana structure, only exported metric names.

The JSON is the output of deploy/grafana/dashboard.py (grafana-foundation-sdk, in the ``chart``
extra); the first test checks the committed file is that output byte for byte.

A renamed metric would silently empty a panel, so every metric name in every PromQL
expression (panel targets and template variable queries) must be one the agent really
exports.  The names are not a list kept by hand: a module fixture runs the agent in this
process exactly as ``hami-trio run`` assembles it (:func:`hami_trio.agent.service.serve_agent`: the
broker on, the pod watch against the fake API server of tests/pods/fake_kube.py, the
monitor over a v1 ``.cache`` file written by :mod:`hami_trio.testing.regions` for a pod that
has a MIG allocation, a fake NVML with one GPU), scrapes its ``/metrics`` and collects every
family and sample name.  Histograms are used through their ``_bucket``/``_sum``/``_count``
series and counters through ``_total``, which is what the scrape contains.  Only the default
names count (no ``--legacy-metrics``): the dashboard must work with the default settings.

The PromQL reader here is deliberately small: it removes strings, label matchers, range
selectors, grouping clauses and Grafana variables, then every identifier that is not a
function call or a keyword is a metric name.  Its own tests below show it finds names in the
shapes the dashboard uses and flags an unknown one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from hami_trio.agent.config import resolve_config
from hami_trio.agent.service import AgentHandle, serve_agent
from hami_trio.broker.protocol import encode_response
from hami_trio.cli.main import build_parser
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, write_region
from tests.agent.agent import http_get
from tests.broker.wire import exchange
from tests.metrics.fake_nvml import FakeGpu, FakeNvml
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import write_kubeconfig
from tests.sandbox import world_readable_dir

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hami-trio.json"
GENERATOR = DASHBOARD.with_name("dashboard.py")
REGENERATE = ".venv/bin/python deploy/grafana/dashboard.py"
GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
# Families the agent exports only in some states; the fixture reaches each of them.
STATEFUL = frozenset(
    {
        "hami_host_gpu_memory_used_bytes",  # NVML present
        "hami_host_gpu_utilization_ratio",
        "hami_host_gpu_memory_controller_utilization_ratio",
        "hami_vgpu_memory_used_bytes",  # a container of a known pod
        "hami_container_last_kernel_elapsed_seconds",  # v1 region with a kernel launched
        "hami_mig_device_info",  # a pod with a MIG allocation
        "hami_trio_container_blocked",
        "hami_trio_broker_exchanges_total",  # broker on
        "hami_trio_pod_watch_synced",  # Kubernetes on
    }
)
CONTAINER = ("namespace", "pod", "container")
DEVICE = (*CONTAINER, "vdevice_index", "device_uuid")


@dataclass(frozen=True)
class Exported:
    """What one scrape of the running agent contained."""

    types: dict[str, str]  # family name -> type
    samples: set[str]  # every sample name (counters' _total, histograms' _bucket, ...)
    pod_labelled: set[str]  # sample names that carry a tenant's ``pod`` label


async def _scrape_running_agent(base: Path) -> str:
    hook = base / "hook"
    mig = [
        {
            "containerIndex": 0,
            "deviceIndex": 0,
            "gpuUUID": GPU,
            "profile": "1g.10gb",
            "placement": {"start": 0, "size": 1},
            "migUUID": "MIG-1",
            "gpuInstanceID": 3,
            "computeInstanceID": 0,
        }
    ]
    async with trio.open_nursery() as nursery:
        fake = FakeKubeApi()
        await nursery.start(fake.serve)
        uid = fake.add_pod(
            "trainer-0",
            namespace="team-a",
            labels={"hami.io/vgpu-node": "node-a"},
            annotations={
                "hami.io/vgpu-mig-allocations": json.dumps(mig),
                "hami.io/vgpu-devices-allocated": f"{GPU},NVIDIA,8192,30:;",
            },
        )
        directory = hook / "containers" / f"{uid}_main"
        directory.mkdir(parents=True)
        write_region(
            directory / "abc.cache",
            RegionSpec(
                uuids=[GPU],
                limits=[8 << 30],
                procs=[ProcSlot(used=[MemoryUse(total=1 << 30)], util=[UtilUse(sm_util=30)])],
                last_kernel_time=int(time.time()) - 10,
            ),
        )
        argv = [
            "run",
            f"--hook-path={hook}",
            f"--mig-lock-path={base / 'mig' / 'lock'}",
            f"--broker-socket-path={base / 'hostpid' / 'broker.sock'}",
            "--metrics-bind-address=127.0.0.1:0",
            "--debug-bind-address=127.0.0.1:0",
            "--interval=0.05",
        ]
        env = {
            "NODE_NAME": "node-a",
            "KUBECONFIG": write_kubeconfig(base / "kc", f"http://127.0.0.1:{fake.port}"),
            "LIBVGPU_HOSTPID_BROKER": "1",
        }
        config = resolve_config(build_parser().parse_args(argv), env)
        nvml = FakeNvml(gpus=[FakeGpu(uuid=GPU)])
        handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
        assert handle.broker is not None
        assert await exchange(handle.broker.socket_path) == encode_response(os.getpid())
        with trio.fail_after(20):
            while True:
                _, text = await trio.to_thread.run_sync(http_get, handle.metrics_address.port)
                if "hami_mig_device_info{" in text and "hami_vgpu_memory_used_bytes{" in text:
                    break
                await trio.sleep(0.05)
        handle.request_stop()
        fake.stop()
    return text


@pytest.fixture(scope="module")
def exported() -> Exported:
    with pytest.MonkeyPatch.context() as patch, world_readable_dir("ht-dash-") as base:
        for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            patch.delenv(name, raising=False)
            patch.delenv(name.upper(), raising=False)
        text = trio.run(_scrape_running_agent, base)
    types: dict[str, str] = {}
    samples: set[str] = set()
    pod_labelled: set[str] = set()
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples.add(sample.name)
            if "pod" in sample.labels:
                pod_labelled.add(sample.name)
    return Exported(types, samples, pod_labelled)


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

# What the observability issue (14) asks the dashboard to show: allocated vs used, processes by
# state, blocking, core limit vs utilisation, export states, the monitor's age, pod metadata.
ISSUE_14 = frozenset(
    {
        "hami_trio_container_allocated_memory_bytes",
        "hami_trio_container_allocated_cores_ratio",
        "hami_trio_container_processes",
        "hami_trio_container_device_processes",
        "hami_trio_container_core_limit_ratio",
        "hami_trio_container_priority",
        "hami_trio_container_utilization_switch",
        "hami_trio_container_blocked_seconds_total",
        "hami_trio_container_blocks_total",
        "hami_trio_monitor_containers",
        "hami_trio_monitor_last_tick_timestamp_seconds",
        "hami_trio_pod_info",
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


def base_name(name: str, exported: Exported) -> str:
    """A histogram's family name for its ``_bucket``/``_sum``/``_count`` series, else ``name``."""
    for suffix in ("_bucket", "_sum", "_count"):
        stem = name.removesuffix(suffix)
        if stem != name and exported.types.get(stem) == "histogram":
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


# --- the generator ----------------------------------------------------------------------------


def load_generator() -> Any:
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        if os.environ.get("CI"):
            pytest.fail(
                f"the dashboard generator needs the 'chart' extra and CI installs it: {exc}"
            )
        pytest.skip(f"the dashboard generator needs grafana-foundation-sdk ('chart' extra): {exc}")
    spec = importlib.util.spec_from_file_location("hami_trio_dashboard", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_json_is_the_generators_output() -> None:
    generated: str = load_generator().render()
    committed = DASHBOARD.read_text()
    assert committed == generated, (
        f"{DASHBOARD.name} differs from deploy/grafana/dashboard.py's output: edit the"
        f" generator, not the JSON, and regenerate with: {REGENERATE}"
    )


def test_the_check_mode_reports_a_stale_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generator = load_generator()
    stale = tmp_path / "hami-trio.json"
    stale.write_text(generator.render().replace('"refresh": "30s"', '"refresh": "5s"'))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generator, "OUTPUT", stale)
        assert generator.main(["--check"]) == 1
        out, err = capsys.readouterr()
        assert '-  "refresh": "5s",' in out
        assert '+  "refresh": "30s",' in out
        assert "run python deploy/grafana/dashboard.py" in err
        assert generator.main([]) == 0  # regenerates
        assert generator.main(["--check"]) == 0
    assert stale.read_text() == DASHBOARD.read_text()


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


def test_an_unexported_name_is_caught(exported: Exported) -> None:
    used = metric_names('rate(hami_trio_broker_exchange_total{node=~"$node"}[5m])')
    assert [n for n in used if n not in exported.samples] == ["hami_trio_broker_exchange_total"]
    assert "hami_trio_monitor_mig_paused_bucket" not in exported.samples  # a gauge: no buckets
    assert "hami_trio_broker_exchanges_total" in exported.samples
    assert "hami_trio_monitor_tick_duration_seconds_count" in exported.samples
    assert "hami_trio_monitor_tick_duration_seconds" not in exported.samples
    assert base_name("hami_trio_monitor_tick_duration_seconds_bucket", exported) == (
        "hami_trio_monitor_tick_duration_seconds"
    )


def test_the_fixture_reaches_every_state_that_adds_families(exported: Exported) -> None:
    assert sorted(STATEFUL - exported.samples) == []
    assert exported.types["hami_trio_broker_exchange_duration_seconds"] == "histogram"
    assert "hami_vgpu_memory_used_bytes" in exported.pod_labelled
    assert "hami_build_info" not in exported.pod_labelled


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


def test_every_metric_name_is_exported_by_the_agent(
    dashboard: dict[str, Any], exported: Exported
) -> None:
    unknown = {}
    for where, expr in expressions(dashboard):
        names = metric_names(expr)
        assert names, f"{where} selects no metric: {expr}"
        for name in names:
            if name not in exported.samples:
                unknown[name] = where
    assert unknown == {}


def test_the_issue_7_panels_are_there(dashboard: dict[str, Any], exported: Exported) -> None:
    used = {
        base_name(n, exported) for _, expr in expressions(dashboard) for n in metric_names(expr)
    }
    assert used >= REQUIRED, f"missing: {sorted(REQUIRED - used)}"


def test_the_issue_14_panels_are_there(dashboard: dict[str, Any], exported: Exported) -> None:
    used = {
        base_name(n, exported) for _, expr in expressions(dashboard) for n in metric_names(expr)
    }
    assert used >= ISSUE_14, f"missing: {sorted(ISSUE_14 - used)}"


def test_every_selector_applies_the_node_and_pod_selection(
    dashboard: dict[str, Any], exported: Exported
) -> None:
    for where, expr in expressions(dashboard):
        if where == "variable node":
            continue  # the node list itself
        selectors = dict(_SELECTOR.findall(expr))
        for name in metric_names(expr):
            assert name in selectors, f"{where}: {name} has no label matchers"
            assert 'node=~"$node"' in selectors[name], f"{where}: {name} ignores $node"
            if name in exported.pod_labelled and not where.startswith("variable"):
                assert 'pod=~"$pod"' in selectors[name], f"{where}: {name} ignores $pod"
