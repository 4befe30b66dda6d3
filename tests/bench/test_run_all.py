"""bench/all's combined report, from results directories (no benchmark is run here)."""

from __future__ import annotations

import json
from pathlib import Path

from bench._results import Results, verify
from bench.run_all import BENCHMARKS, headline, write_report


def _fake_run(runs: Path, name: str, figures: dict[str, object]) -> None:
    with Results(name, argv=[f"bench/{name}.py"], root=runs) as res:
        res.summary(f"{name} title", headers=["x"], rows=[[1]], figures=figures)


def test_report_quotes_the_headline_figures_and_each_summary(tmp_path: Path) -> None:
    with Results("all", argv=["bench/all"], root=tmp_path) as res:
        runs = res.path / "runs"
        _fake_run(runs, "broker_load", {"c64_threads_rate_ratio": 0.78})
        _fake_run(runs, "client_storm", {"storm_n1000_median_wall_ms": 113.2})
        _fake_run(
            runs,
            "concurrent_start",
            {
                "hold_ms": 60,
                "broker-c_n1000_wall_ms": 190.3,
                "fallback_n1000_wall_ms": 60336.5,
                "speedup_broker-c_n1000": 317.1,
            },
        )
        report = write_report(res, runs, {"broker_load": "finished"}, full=False)
    text = report.read_text()
    assert text.startswith("# hami-trio release benchmarks (quick)")
    assert "| broker / C reference, exchanges/s at c=64 (target >= 0.7) | 0.78x |" in text
    assert "113.2 ms" in text
    assert "190.3 ms vs 60336.5 ms: speed-up 317.1x" in text
    assert "## monitor_scale: not run" in text
    assert "### concurrent_start title" in text  # each benchmark's summary, demoted
    combined = json.loads((res.path / "summary.json").read_text())
    assert combined["figures"]["client_storm"] == {"storm_n1000_median_wall_ms": 113.2}
    assert verify(res.path) == []  # the nested runs are sealed by the top-level SHA256SUMS


def test_missing_figures_read_as_not_measured() -> None:
    rows = headline({})
    assert len(rows) >= 8
    assert all("not measured" in row[1] for row in rows)
    assert {b.name for b in BENCHMARKS} == {
        "broker_load",
        "client_storm",
        "concurrent_start",
        "monitor_scale",
    }
