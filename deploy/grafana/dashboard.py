"""The hami-trio Grafana dashboard, as code: writes deploy/grafana/hami-trio.json.

The JSON next to this file is generated; change the dashboard here, then regenerate it:

    .venv/bin/python deploy/grafana/dashboard.py          # rewrite hami-trio.json
    .venv/bin/python deploy/grafana/dashboard.py --check  # exit 1 if it is out of date

It uses grafana-foundation-sdk (Grafana's typed dashboard builder, pinned in the ``chart``
extra so that the output is the same byte for byte everywhere). Every query runs on the
data source chosen in the ``datasource`` variable and selects ``node=~"$node"`` (and, for the
per-container families, ``namespace``/``pod``): the ``node`` label is the one the chart's
ServiceMonitor adds. tests/deploy/test_dashboard.py checks every metric name against a scrape
of the real agent and that the committed JSON is this module's output.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).resolve().with_name("hami-trio.json")
COMMAND = "python deploy/grafana/dashboard.py"

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Label matchers: every agent family / the per-container families.
N = '{node=~"$node"}'
C = '{node=~"$node", namespace=~"$namespace", pod=~"$pod"}'
CONTAINER = "{{namespace}}/{{pod}}/{{container}}"
RATE = "[$__rate_interval]"

Target = tuple[str, str]  # (PromQL, legend)


def _query(ref_id: str, expr: str, legend: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .ref_id(ref_id)
        .expr(expr)
        .legend_format(legend)
        .range()
    )


def _thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in steps])
    )


def stat_panel(
    panel_id: int,
    title: str,
    description: str,
    expr: str,
    alert_color: str | None,
    *,
    width: int = 4,
) -> stat.Panel:
    """A single number, green unless it is at least 1 (then ``alert_color``)."""
    steps: list[tuple[float | None, str]] = [(None, "green")]
    if alert_color is not None:
        steps.append((1, alert_color))
    return (
        stat.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(4)
        .span(width)
        .with_target(_query("A", expr, ""))
        .unit("none")
        .mappings([])
        .thresholds(_thresholds(*steps))
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .justify_mode(cm.BigValueJustifyMode.AUTO)
        .orientation(cm.VizOrientation.AUTO)
        .text_mode(cm.BigValueTextMode.AUTO)
    )


def series_panel(
    panel_id: int,
    title: str,
    description: str,
    targets: Sequence[Target],
    *,
    unit: str = "none",
    width: int = 8,
    maximum: float | None = None,
    stacked: bool = False,
    bars: bool = False,
) -> timeseries.Panel:
    """A time series per target, legend as a table with the last and the highest value."""
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(8)
        .span(width)
        .unit(unit)
        .min(0)
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
        .draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(30 if stacked else 10)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(
            cb.StackingConfig()
            .mode(cm.StackingMode.NORMAL if stacked else cm.StackingMode.NONE)
            .group("A")
        )
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    if maximum is not None:
        panel.max(maximum)
    for ref_id, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
        panel.with_target(_query(ref_id, expr, legend))
    return panel


def dashed(panel: timeseries.Panel, *ref_ids: str) -> timeseries.Panel:
    """The series of targets ``ref_ids`` dashed and unfilled: a limit or grant beside a use."""
    for ref_id in ref_ids:
        panel.override_by_query(
            ref_id,
            [
                dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                dm.DynamicConfigValue("custom.fillOpacity", 0),
            ],
        )
    return panel


def matching(selector: str, matcher: str) -> str:
    """``selector`` (one of the matcher sets above) with one more label matcher."""
    return f"{selector[:-1]}, {matcher}}}"


def quantiles(histogram: str) -> list[Target]:
    """p50 and p99 per node of a histogram family."""
    return [
        (
            f"histogram_quantile({q}, sum by (node, le) (rate({histogram}_bucket{N}{RATE})))",
            f"{{{{node}}}} p{round(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def selector(name: str, label: str, query: str) -> db.QueryVariable:
    """A multi-value variable (All by default) over a label of the agents' series."""
    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({query}, {name})")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        .multi(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .options([])
        .hide(dm.VariableHide.DONT_HIDE)
        .regex("")
    )


def section(
    dash: db.Dashboard, row_id: int, title: str, panels: Sequence[Builder[dm.Panel]]
) -> None:
    """A row (expanded), then its panels left to right, wrapping at the grid's 24 columns."""
    dash.with_row(db.Row(title).id(row_id))
    for panel in panels:
        dash.with_panel(panel)


def build() -> db.Dashboard:
    dash = (
        db.Dashboard("hami-trio")
        .uid("hami-trio-node-agent")
        .description(
            "hami-trio node agent: vGPU containers, host PID broker, monitor loop, pod watch,"
            " host GPUs, agent health. Node/namespace/pod selectors need the node label the"
            " chart's ServiceMonitor adds. Generated by deploy/grafana/dashboard.py."
        )
        .tags(["hami", "gpu", "vgpu", "hami-trio"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("")
        .annotation(
            db.AnnotationQuery()
            .built_in(1)
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .name("Annotations & Alerts")
            .type("dashboard")
        )
        .with_variable(
            db.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .hide(dm.VariableHide.DONT_HIDE)
            .regex("")
        )
        .with_variable(selector("node", "Node", "hami_build_info"))
        .with_variable(selector("namespace", "Namespace", f"hami_vgpu_memory_limit_bytes{N}"))
        .with_variable(
            selector(
                "pod",
                "Pod",
                'hami_vgpu_memory_limit_bytes{node=~"$node", namespace=~"$namespace"}',
            )
        )
    )

    section(
        dash,
        1,
        "Overview",
        [
            stat_panel(
                2,
                "Agents reporting",
                "Agents whose /metrics was scraped, from hami_build_info.",
                f"count(hami_build_info{N})",
                None,
            ),
            stat_panel(
                3,
                "Blocked containers",
                "Containers the monitor currently blocks (recent_kernel = -1) because a"
                " higher-priority task is active on a shared GPU.",
                f"sum(hami_trio_container_blocked{C}) or vector(0)",
                "red",
            ),
            stat_panel(
                4,
                "Nodes paused for MIG",
                "Nodes whose monitor loop is paused by the MIG lock file.",
                f"sum(hami_trio_monitor_mig_paused{N}) or vector(0)",
                "orange",
            ),
            stat_panel(
                5,
                "Pod watch not synced",
                "Nodes whose pod watch has no current list of the node's pods (leftover"
                " directories are not cleaned meanwhile).",
                f"count(hami_trio_pod_watch_synced{N} == 0) or vector(0)",
                "red",
            ),
            stat_panel(
                29,
                "Nodes refusing allocations",
                "Nodes whose shared lock parent (--lock-parent-path) is unsafe: the next"
                " allocation there is refused. The agent's warning names the reason and the"
                " command that repairs it.",
                f"count(hami_trio_lock_parent_ok{N} == 0) or vector(0)",
                "red",
            ),
            stat_panel(
                30,
                "MIG lock directory refused",
                "Nodes whose MIG lock directory is refused as unsafe: locks in it are ignored,"
                " so MIG applies do not pause the monitor.",
                f"sum(hami_trio_monitor_mig_lock_dir_unsafe{N}) or vector(0)",
                "orange",
            ),
        ],
    )

    per_gpu = f"{CONTAINER} gpu{{{{vdevice_index}}}}"
    memory = dashed(
        series_panel(
            7,
            "vGPU memory used vs limit",
            "Device memory each container uses on each of its vGPUs (solid) against the limit"
            " HAMi-core enforces (dashed).",
            [
                (f"hami_vgpu_memory_used_bytes{C}", f"{per_gpu} used"),
                (f"hami_vgpu_memory_limit_bytes{C}", f"{per_gpu} limit"),
            ],
            unit="bytes",
            width=12,
        ),
        "B",
    )
    section(
        dash,
        6,
        "Containers (vGPU)",
        [
            memory,
            series_panel(
                8,
                "vGPU memory used / limit",
                "Share of its memory limit each container uses; at 100% its allocations fail.",
                [(f"hami_vgpu_memory_used_bytes{C} / hami_vgpu_memory_limit_bytes{C}", per_gpu)],
                unit="percentunit",
                width=12,
            ),
            series_panel(
                9,
                "SM utilisation",
                "Streaming-multiprocessor utilisation of each container's processes on each vGPU"
                " (percent, summed over processes).",
                [(f"hami_container_device_utilization_ratio{C}", per_gpu)],
                unit="percent",
                width=12,
            ),
            series_panel(
                10,
                "Seconds since last kernel",
                "Time since each container last launched a kernel (reported only once it"
                " launched one).",
                [(f"hami_container_last_kernel_elapsed_seconds{C}", per_gpu)],
                unit="s",
                width=12,
            ),
            series_panel(
                11,
                "Blocked containers",
                "1 while the monitor blocks the container's kernel launches (a higher-priority"
                " task is active on one of its GPUs).",
                [(f"hami_trio_container_blocked{C}", CONTAINER)],
                width=24,
                maximum=1,
            ),
        ],
    )

    why(dash, per_gpu)

    duration = "hami_trio_broker_exchange_duration_seconds"
    section(
        dash,
        12,
        "Host PID broker",
        [
            series_panel(
                13,
                "Broker exchanges by outcome",
                "Exchanges per second by outcome: ok, invalid request, timeout, eof (short"
                " request), rejected_full (limit reached), evicted, peer_error.",
                [
                    (
                        f"sum by (node, outcome) (rate(hami_trio_broker_exchanges_total{N}{RATE}))",
                        "{{node}} {{outcome}}",
                    )
                ],
                unit="reqps",
                stacked=True,
            ),
            series_panel(
                14,
                "Broker exchange latency",
                "Whole request-response exchange time, from the broker's histogram.",
                [
                    *quantiles(duration),
                    (
                        f"sum by (node) (rate({duration}_sum{N}{RATE}))"
                        f" / sum by (node) (rate({duration}_count{N}{RATE}))",
                        "{{node}} mean",
                    ),
                ],
                unit="s",
            ),
            series_panel(
                15,
                "Broker exchanges in flight",
                "Exchanges running at once; connections beyond the limit are closed (outcome"
                " rejected_full).",
                [(f"hami_trio_broker_exchanges_in_flight{N}", "{{node}}")],
            ),
        ],
    )

    tick = "hami_trio_monitor_tick_duration_seconds"
    section(
        dash,
        16,
        "Monitor",
        [
            series_panel(
                17,
                "Monitor tick duration",
                "Time of one feedback tick (refresh the container list, then observe and write"
                " priorities).",
                [
                    *quantiles(tick),
                    (f"sum by (node) (rate({tick}_count{N}{RATE}))", "{{node}} ticks/s"),
                ],
                unit="s",
            ),
            series_panel(
                18,
                "MIG pause",
                "1 while the MIG lock file exists and the monitor loop is paused.",
                [(f"hami_trio_monitor_mig_paused{N}", "{{node}}")],
                maximum=1,
            ),
            series_panel(
                19,
                "Containers by export state",
                "Container directories by export state: exported, paused (MIG lock; frozen "
                "values), no_pod (pod unknown, not labelled for this node, or no such "
                "container), completed (pod Succeeded/Failed, or an init container), "
                "rejected (file refused), no_cache_file (no cuInit yet).",
                [(f"sum by (node, state) (hami_trio_monitor_containers{N})", "{{node}} {{state}}")],
            ),
            series_panel(
                20,
                "Rejected .cache files by reason",
                "Files the monitor refused to load (too small, bad magic, unknown version, not a"
                " regular file, ...), per second.",
                [
                    (
                        "sum by (node, reason) "
                        f"(rate(hami_trio_monitor_files_rejected_total{N}{RATE}))",
                        "{{node}} {{reason}}",
                    )
                ],
                unit="reqps",
                width=24,
                stacked=True,
            ),
        ],
    )

    section(
        dash,
        21,
        "Pod watch",
        [
            series_panel(
                22,
                "Pod watch synced",
                "1 once the node's pod list is complete and current; 0 while the API server is"
                " unreachable or relisting.",
                [(f"hami_trio_pod_watch_synced{N}", "{{node}}")],
                width=12,
                maximum=1,
            ),
            series_panel(
                23,
                "Pod watch relists",
                "Full relists of the node's pods (after a watch expired or failed).",
                [
                    (
                        f"sum by (node) (increase(hami_trio_pod_watch_relists_total{N}{RATE}))",
                        "{{node}}",
                    )
                ],
                width=12,
                bars=True,
            ),
        ],
    )

    host_gpu = "{{node}} gpu{{device_index}} {{device_type}}"
    section(
        dash,
        24,
        "Host GPUs (NVML)",
        [
            series_panel(
                25,
                "GPU memory used",
                "Device memory in use on each physical GPU, from NVML.",
                [(f"hami_host_gpu_memory_used_bytes{N}", host_gpu)],
                unit="bytes",
                width=12,
            ),
            series_panel(
                26,
                "GPU utilisation",
                "Physical GPU utilisation from NVML.",
                [(f"hami_host_gpu_utilization_ratio{N}", host_gpu)],
                unit="percent",
                width=12,
                maximum=100,
            ),
        ],
    )

    section(
        dash,
        31,
        "Agent health",
        [
            series_panel(
                32,
                "Scrape parts left out by phase",
                "Parts of a scrape left out because of the data they hold: container (one"
                " container's rows, per scrape), mig (one pod's MIG rows), pods (the pod list"
                " failed), host (NVML failed). A warning names the container or pod.",
                [
                    (
                        "sum by (node, phase) "
                        f"(increase(hami_trio_collector_errors_total{N}{RATE}))",
                        "{{node}} {{phase}}",
                    )
                ],
                bars=True,
            ),
            series_panel(
                33,
                "Metrics-port connections ended by outcome",
                "Connections to /metrics that ended, per second: closed (normal), evicted (at"
                " the connection cap), header_timeout (slowloris), response_timeout (client not"
                " reading), bad_request, accept_failed (e.g. EMFILE).",
                [
                    (
                        f"sum by (node, outcome) (rate(hami_trio_http_connections_total{N}{RATE}))",
                        "{{node}} {{outcome}}",
                    )
                ],
                unit="cps",
                stacked=True,
            ),
            series_panel(
                34,
                "Metrics-port connections open",
                "Connections open now (at most --metrics-max-connections) and the bytes of"
                " rendered answers not yet sent (right axis).",
                [
                    (f"hami_trio_http_connections_open{N}", "{{node}} open"),
                    (f"hami_trio_http_response_bytes_held{N}", "{{node}} bytes held"),
                ],
            ).override_by_query(
                "B",
                [
                    dm.DynamicConfigValue("unit", "bytes"),
                    dm.DynamicConfigValue("custom.axisPlacement", "right"),
                ],
            ),
            series_panel(
                35,
                "Gone pods' directories removed",
                "Removals of the directories of pods that are gone, by outcome (removed,"
                " failed); failures are logged with the path.",
                [
                    (
                        "sum by (node, outcome) "
                        f"(increase(hami_trio_monitor_removals_total{N}{RATE}))",
                        "{{node}} {{outcome}}",
                    )
                ],
                bars=True,
            ),
            series_panel(
                36,
                "Lock parent safe",
                "1 while the shared lock parent (--lock-parent-path) is safe or not created"
                " yet; 0 while allocations on the node would be refused (the reason is in"
                " hami_trio_lock_parent_unsafe and the agent's warning).",
                [(f"hami_trio_lock_parent_ok{N}", "{{node}}")],
                maximum=1,
            ),
            series_panel(
                37,
                "MIG lock directory refused",
                "1 while the MIG lock's directory is refused as unsafe (locks in it are"
                " ignored), and the times it started being refused, by reason.",
                [
                    (f"hami_trio_monitor_mig_lock_dir_unsafe{N}", "{{node}} unsafe"),
                    (
                        "sum by (node, reason) "
                        f"(increase(hami_trio_monitor_mig_lock_refusals_total{N}{RATE}))",
                        "{{node}} refused: {{reason}}",
                    ),
                ],
            ),
        ],
    )

    versions = (
        table.Panel()
        .id(28)
        .title("Agent versions")
        .description("hami-trio, Python and trio versions per node.")
        .datasource(DATASOURCE)
        .height(6)
        .span(24)
        .with_target(
            prometheus.Dataquery()
            .datasource(DATASOURCE)
            .ref_id("A")
            .expr(f"hami_build_info{N}")
            .legend_format("")
            .instant()
            .format(PromQueryFormat.TABLE)
        )
        .show_header(True)
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": dict.fromkeys(
                        (
                            *("Time", "Value", "__name__", "job", "instance", "endpoint"),
                            *("service", "namespace", "pod", "container"),
                        ),
                        True,
                    ),
                    "indexByName": {
                        "node": 0,
                        "version": 1,
                        "python_version": 2,
                        "trio_version": 3,
                    },
                },
            )
        )
    )
    section(dash, 27, "Agents", [versions])
    return dash


def why(dash: db.Dashboard, per_gpu: str) -> None:
    """The row that answers operators' questions: what was granted, which processes HAMi-core
    knows, which limits and priorities act, and why a container is not exported."""
    processes = "hami_trio_container_processes"
    unknown, exited = matching(C, 'state="unknown"'), matching(C, 'state="exited"')
    not_exported = matching(N, 'state!~"exported|paused"')
    section(
        dash,
        38,
        "Why a share behaves as it does",
        [
            stat_panel(
                39,
                "Containers with host PID unknown",
                "Containers with processes whose host PID HAMi-core never learned: their SM"
                " utilisation reads 0. The host PID broker fixes it (docs/troubleshooting.md).",
                f"count({processes}{unknown} > 0) or vector(0)",
                "orange",
                width=8,
            ),
            stat_panel(
                40,
                "Containers with exited processes",
                "Containers with slots of processes that no longer exist: upstream still counts"
                " their memory, so usage stays at its peak (--exclude-exited-processes).",
                f"count({processes}{exited} > 0) or vector(0)",
                "orange",
                width=8,
            ),
            stat_panel(
                41,
                "Containers not exported",
                "Container directories whose rows are not on /metrics (no pod, completed,"
                " rejected file, no .cache file yet); the reasons are in the panel below.",
                f"sum(hami_trio_monitor_containers{not_exported}) or vector(0)",
                "orange",
                width=8,
            ),
            dashed(
                series_panel(
                    42,
                    "vGPU memory allocated vs used",
                    "Device memory HAMi's scheduler allocated to each container (dashed, from the"
                    " pod's hami.io/vgpu-devices-allocated, there before any use) against what"
                    " it uses.",
                    [
                        (f"hami_vgpu_memory_used_bytes{C}", f"{per_gpu} used"),
                        (f"hami_trio_container_allocated_memory_bytes{C}", f"{per_gpu} allocated"),
                    ],
                    unit="bytes",
                    width=12,
                ),
                "B",
            ),
            dashed(
                series_panel(
                    43,
                    "SM utilisation vs core limit",
                    "SM utilisation of each container on each vGPU against the core limit"
                    " HAMi-core enforces (CUDA_DEVICE_SM_LIMIT, 0 = none) and the cores the"
                    " scheduler allocated (both dashed).",
                    [
                        (f"hami_container_device_utilization_ratio{C}", f"{per_gpu} used"),
                        (f"hami_trio_container_core_limit_ratio{C}", f"{per_gpu} limit"),
                        (f"hami_trio_container_allocated_cores_ratio{C}", f"{per_gpu} allocated"),
                    ],
                    unit="percent",
                    width=12,
                ),
                "B",
                "C",
            ),
            series_panel(
                44,
                "Processes by state",
                "Process slots by the state of their host PID: running, exited (no such"
                " process; still summed) and unknown (host PID 0: SM utilisation reads 0).",
                [
                    (
                        f"sum by (namespace, pod, container, state) ({processes}{C})",
                        f"{CONTAINER} {{{{state}}}}",
                    )
                ],
            ),
            series_panel(
                45,
                "Processes per vGPU",
                "Slots using each device: fewer than the processes NVML shows on the GPU means"
                " work outside HAMi-core (e.g. LD_PRELOAD bypassed).",
                [(f"hami_trio_container_device_processes{C}", per_gpu)],
            ),
            series_panel(
                46,
                "Priority and utilisation switch",
                "CUDA_TASK_PRIORITY (lower wins) and the utilisation switch the monitor last"
                " wrote (1: HAMi-core holds the container to its core limit).",
                [
                    (f"hami_trio_container_priority{C}", f"{CONTAINER} priority"),
                    (f"hami_trio_container_utilization_switch{C}", f"{CONTAINER} switch"),
                ],
            ),
            series_panel(
                47,
                "Time held by priority blocking",
                "Share of the time the monitor blocked each container's kernel launches because"
                " a higher-priority task was active on its GPU.",
                [(f"rate(hami_trio_container_blocked_seconds_total{C}{RATE})", CONTAINER)],
                unit="percentunit",
                width=12,
                maximum=1,
            ),
            series_panel(
                48,
                "Blocking episodes",
                "Times priority blocking began for each container.",
                [(f"increase(hami_trio_container_blocks_total{C}{RATE})", CONTAINER)],
                width=12,
                bars=True,
            ),
            series_panel(
                49,
                "Containers not exported, by reason",
                "Container directories whose rows are not exported: no_pod (pod unknown or not"
                " labelled for this node), completed, rejected (file refused), no_cache_file.",
                [
                    (
                        f"sum by (node, state) (hami_trio_monitor_containers{not_exported})",
                        "{{node}} {{state}}",
                    )
                ],
                stacked=True,
            ),
            series_panel(
                50,
                "Age of the container values",
                "Seconds since the monitor's latest completed tick: the age of every container"
                " value on /metrics (grows while the monitor is stuck or paused for MIG).",
                [(f"time() - hami_trio_monitor_last_tick_timestamp_seconds{N}", "{{node}}")],
                unit="s",
            ),
            series_panel(
                51,
                "Pods by phase",
                "The node's vGPU pods (label hami.io/vgpu-node) the pod watch knows, by phase;"
                " Succeeded and Failed pods are no longer exported.",
                [(f"count by (node, phase) (hami_trio_pod_info{C})", "{{node}} {{phase}}")],
                stacked=True,
            ),
        ],
    )


def render() -> str:
    """The dashboard's JSON, exactly as committed."""
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 if {OUTPUT.name} is not this output"
    )
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        OUTPUT.write_text(text)
        return 0
    current = OUTPUT.read_text() if OUTPUT.exists() else ""
    if current == text:
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"{OUTPUT.name} (committed)",
            f"{OUTPUT.name} (generated)",
        )
    )
    print(f"{OUTPUT.name} is out of date: run {COMMAND}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
