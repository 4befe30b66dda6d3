"""``bench/all``: run every release benchmark and write one combined report.

How this works: one results directory ``bench/results/all-<time>-<rev>/`` holds the report
and, under ``runs/``, the results directory of each benchmark, which is run as its own
command (``--results-root .../runs``) with its output streamed to the console and kept.
Afterwards the headline figures are read back from each ``summary.json`` into ``report.md``
(followed by each benchmark's own ``summary.md``), and the whole tree is sealed with one
``SHA256SUMS`` (each benchmark's directory also keeps its own).

``--quick`` (the default) keeps the whole run to a few minutes on a small machine;
``--full`` runs the release configuration (more repetitions, N up to 2000 containers).  The
storm benchmarks need root (namespaces, bind mounts); without it they are skipped and the
report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._results import Results, markdown_table

__all__ = ["BENCHMARKS", "main"]

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    """One benchmark command: its script and its quick/full arguments."""

    name: str
    script: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    needs_root: bool = False


BENCHMARKS = (
    Benchmark("broker_load", "broker_load.py", ("--quick",), ()),
    Benchmark(
        "client_storm",
        "client_storm.py",
        ("--sizes", "300", "1000", "--runs", "3"),
        ("--sizes", "300", "1000", "--runs", "7"),
        needs_root=True,
    ),
    Benchmark(
        "concurrent_start",
        "concurrent_start.py",
        ("--runs", "1"),
        ("--runs", "3"),
        needs_root=True,
    ),
    Benchmark(
        "monitor_scale",
        "monitor_scale.py",
        ("--n", "100", "1000", "--ticks", "11"),
        ("--n", "100", "1000", "2000", "--ticks", "21"),
    ),
)


def _summary(runs: Path, name: str) -> tuple[Path | None, dict[str, Any]]:
    """The newest results directory of ``name`` under ``runs`` and its figures."""
    found = sorted(runs.glob(f"{name}-*"))
    if not found:
        return None, {}
    path = found[-1]
    try:
        return path, json.loads((path / "summary.json").read_text())["figures"]
    except (OSError, ValueError, KeyError):
        return path, {}


def _fmt(value: object, unit: str = "") -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float):
        return f"{value:g}{unit}"
    return f"{value}{unit}"


def headline(figures: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The figures the release note quotes, one row each: what, value, where from."""
    broker = figures.get("broker_load", {})
    storm = figures.get("client_storm", {})
    start = figures.get("concurrent_start", {})
    monitor = figures.get("monitor_scale", {})
    slowloris = {k: v for k, v in broker.items() if k.startswith("slowloris")}
    rows = [
        [
            "broker / C reference, exchanges/s at c=64 (target >= 0.7)",
            _fmt(broker.get("c64_threads_rate_ratio"), "x"),
            "broker_load",
        ],
        [
            "broker / C reference, p99 at c=64 (target <= 2)",
            _fmt(broker.get("c64_threads_p99_ratio"), "x"),
            "broker_load",
        ],
    ]
    rows += [
        [f"broker {key.replace('_', ' ')}", _fmt(value), "broker_load"]
        for key, value in slowloris.items()
    ]
    rows.append(
        [
            "storm: 1000 C clients at once, median wall (target < 1 s)",
            _fmt(storm.get("storm_n1000_median_wall_ms"), " ms"),
            "client_storm",
        ]
    )
    for size in (50, 300, 1000):
        rows.append(
            [
                f"concurrent start N={size}: broker (C client) wall vs fallback model "
                f"({start.get('hold_ms', '?')} ms/process)",
                f"{_fmt(start.get(f'broker-c_n{size}_wall_ms'), ' ms')} vs "
                f"{_fmt(start.get(f'fallback_n{size}_wall_ms'), ' ms')}: speed-up "
                f"{_fmt(start.get(f'speedup_broker-c_n{size}'), 'x')}",
                "concurrent_start",
            ]
        )
    rows.append(
        [
            "concurrent start N=1000: broker (Python client) wall, speed-up",
            f"{_fmt(start.get('broker-py_n1000_wall_ms'), ' ms')}, "
            f"{_fmt(start.get('speedup_broker-py_n1000'), 'x')}",
            "concurrent_start",
        ]
    )
    rows += [
        [
            "monitor tick, N=1000 static / churn (target <= 25 ms)",
            f"{_fmt(monitor.get('static_n1000_tick_median_ms'), ' ms')} / "
            f"{_fmt(monitor.get('churn_n1000_tick_median_ms'), ' ms')}",
            "monitor_scale",
        ],
        [
            "monitor peak RSS, N=1000 (target <= 150 MB)",
            _fmt(monitor.get("static_n1000_peak_rss_mb"), " MB"),
            "monitor_scale",
        ],
        [
            "monitor tick ratio N=2000 / N=1000 (target <= 2.2)",
            _fmt(monitor.get("static_tick_ratio_n2000_n1000"), "x"),
            "monitor_scale",
        ],
        [
            "/metrics scrape at N=1000, median / p99",
            f"{_fmt(monitor.get('static_n1000_scrape_median_ms'), ' ms')} / "
            f"{_fmt(monitor.get('static_n1000_scrape_p99_ms'), ' ms')}",
            "monitor_scale",
        ],
    ]
    return rows


def write_report(res: Results, runs: Path, outcomes: dict[str, str], full: bool) -> Path:
    """Write ``report.md`` from the benchmarks' results directories."""
    figures: dict[str, dict[str, Any]] = {}
    sections: list[str] = []
    for bench in BENCHMARKS:
        path, figs = _summary(runs, bench.name)
        figures[bench.name] = figs
        sections.append(f"## {bench.name}: {outcomes.get(bench.name, 'not run')}\n")
        if path is None:
            sections.append("No results directory.\n")
            continue
        sections.append(f"Results directory: `{path.relative_to(res.path)}`\n")
        summary = path / "summary.md"
        if summary.is_file():
            # Demote the benchmark's own title below this report's section heading.
            sections.append(summary.read_text().replace("# ", "### ", 1))
    env = res.environment
    lines = [
        f"# hami-trio release benchmarks ({'full' if full else 'quick'})\n",
        f"- command: `{' '.join(res.argv)}`",
        f"- source: {res.git.label()} on {res.git.branch} (`{res.git.revision}`), hami-trio "
        f"{env['hami_trio_version']}",
        f"- machine: {env['cpu_model']} x{env['cpu_count']}, {env['memory_gib']} GiB, "
        f"{env['distribution']}, {env['kernel']}",
        f"- Python {env['python'].split()[0]}; GPU: {env['gpus']}",
        f"- load average at start: {env['loadavg_start']} (a shared machine makes single "
        "figures noisy; compare ratios from the same run)",
        "- every benchmark's raw output, commands and environment are under `runs/`; "
        "`sha256sum -c SHA256SUMS` in this directory verifies every file",
        "",
        "## Headline figures\n",
        markdown_table(["figure", "value", "benchmark"], headline(figures)),
        *sections,
    ]
    out = res.path / "report.md"
    out.write_text("\n".join(lines))
    res.write_json("summary.json", {"benchmark": "all", "figures": figures})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/all", description="Run every release benchmark; write one report."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few minutes in all (default)")
    mode.add_argument("--full", action="store_true", help="the release configuration")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[b.name for b in BENCHMARKS],
        help="run only these benchmarks",
    )
    parser.add_argument(
        "--results-root", type=Path, help="where the results directory goes (bench/results)"
    )
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    outcomes: dict[str, str] = {}
    with Results("all", root=args.results_root) as res, res.tee():
        runs = res.path / "runs"
        runs.mkdir()
        print(f"bench/all ({'full' if args.full else 'quick'}): results in {res.path}")
        for bench in chosen:
            if bench.needs_root and os.geteuid() != 0:
                outcomes[bench.name] = "skipped (needs root)"
                print(f"\n=== {bench.name}: skipped (needs root)")
                continue
            extra = bench.full if args.full else bench.quick
            command = [sys.executable, str(HERE / bench.script), *extra, "--results-root", runs]
            print(f"\n=== {bench.name}: {' '.join(map(str, command))}", flush=True)
            status = res.stream(command, name=bench.name, cwd=HERE.parent)
            outcomes[bench.name] = "finished" if status == 0 else f"exit status {status}"
        report = write_report(res, runs, outcomes, args.full)
        print(f"\nreport: {report}")
        print(report.read_text().split("## Headline figures", 1)[1].split("\n## ", 1)[0])
    failed = [name for name, outcome in outcomes.items() if outcome.startswith("exit")]
    return 1 if failed else 0
