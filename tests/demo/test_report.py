"""The summary: every check holds on a good run and fails on the defect it is about."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hami_trio.demo.report import CHECKS, RunRecord, WorkloadRecord, render_summary, summarize
from hami_trio.demo.scenario import default_workloads
from hami_trio.demo.scrape import AgentSample, ContainerMetrics

START = 100.0


def _final(windows: list[list[float]], episodes: list[list[float]]) -> dict[str, object]:
    blocked = sum(e - s for s, e in episodes)
    return {
        "type": "final",
        "launches": 50,
        "blocked_seconds": blocked,
        "episodes": episodes,
        "windows": windows,
        "peak_memory": 1 << 30,
    }


def good_record() -> RunRecord:
    """A 10 s run at a 0.5 s interval in which everything went as the scenario says."""
    inference, training, notebook = default_workloads(3)
    finals = {
        # Bursts at 10-30 % and 65-85 % of the run.
        "inference": _final([[101.0, 103.0], [106.5, 108.5]], []),
        "training": _final(
            [[100.0, 101.2], [103.8, 106.6], [108.9, 110.0]], [[101.2, 103.8], [106.6, 108.9]]
        ),
        "notebook": _final([[100.5, 102.0]], []),
    }
    workloads = []
    for n, spec in enumerate((inference, training, notebook)):
        w = WorkloadRecord(spec, f"pod-{n}", Path(f"/r/pod-{n}_{spec.name}"), 900 + n, 1000 + n)
        w.attached = {"type": "attached", "pid": 1, "uid": 65534, "host_pid": 1000 + n}
        w.attached |= {"reason": None, "detail": None, "broker_seconds": 0.001}
        w.final = finals[spec.name]
        w.exit_code = 0
        workloads.append(w)
    memory = {(w.pod_uid, w.spec.name): ContainerMetrics(1 << 30, 8 << 30, 50) for w in workloads}
    buckets = ((0.0001, 2), (0.00025, 3), (float("inf"), 3))
    samples = [
        AgentSample(100.5, memory, False, 1, {"ok": 3}, buckets, 0.0003),
        AgentSample(104.2, memory, True, 8, {"ok": 3}, buckets, 0.0003),
        AgentSample(105.5, memory, True, 8, {"ok": 3}, buckets, 0.0003),
        AgentSample(106.3, memory, False, 9, {"ok": 3}, buckets, 0.0003),
        AgentSample(109.0, memory, False, 14, {"ok": 3}, buckets, 0.0003),
    ]
    return RunRecord(
        workloads=workloads,
        duration=10.0,
        interval=0.5,
        root=Path("/r"),
        sandbox="test",
        metrics_url="http://127.0.0.1:1/metrics",
        start=START,
        mig_created=104.0,
        mig_removed=106.0,
        samples=samples,
    )


def test_a_good_run_passes_every_check() -> None:
    summary = summarize(good_record())
    assert summary["checks"] == dict.fromkeys(CHECKS, True)
    assert summary["ok"] is True
    json.dumps(summary)  # --summary-json writes it as it is
    training = next(row for row in summary["blocking"] if row["workload"] == "training")
    assert training["outranked_by"] == ["inference"]
    assert training["episodes"] == 2
    assert training["episode_times"] == [[1.2, 3.8], [6.6, 8.9]]
    assert training["blocked_seconds"] == pytest.approx(4.9)
    assert [w["pid_correct"] for w in summary["workloads"]] == [True, True, True]
    assert summary["mig"] == {
        "lock_created_at": 4.0,
        "lock_removed_at": 6.0,
        "paused_scrapes": 2,
        "ticks_while_paused": 0,
        "resumed_after_seconds": 0.3,
        "ticks_after_resume": 6,
    }
    assert summary["broker"]["exchanges"] == {"ok": 3}
    assert summary["broker"]["latency_mean_seconds"] == pytest.approx(0.0001)
    assert summary["broker"]["latency_p99_at_most_seconds"] == 0.00025
    lines = "\n".join(render_summary(summary))
    assert "PID 1 in its sandbox -> host PID 1001 (correct)" in lines
    assert "training     (priority 1) blocked 2 times, 4.9 s in all" in lines
    assert "notebook     (priority 1) never blocked" in lines
    assert "FAIL" not in lines


def _workload(record: RunRecord, name: str) -> WorkloadRecord:
    return next(w for w in record.workloads if w.spec.name == name)


def _set_final(name: str, **changes: object) -> Callable[[RunRecord], None]:
    def change(record: RunRecord) -> None:
        final = _workload(record, name).final
        assert final is not None
        final.update(changes)

    return change


def _wrong_pid(record: RunRecord) -> None:
    attached = _workload(record, "training").attached
    assert attached is not None
    attached["host_pid"] = 4242


def _no_namespace(record: RunRecord) -> None:
    attached = _workload(record, "notebook").attached
    assert attached is not None
    attached["pid"] = attached["host_pid"]


def _no_broker_answer(record: RunRecord) -> None:
    attached = _workload(record, "inference").attached
    assert attached is not None
    attached |= {"host_pid": None, "reason": "not_read_only", "detail": "x"}


def _not_exported(record: RunRecord) -> None:
    for sample in record.samples:
        del sample.containers[("pod-2", "notebook")]  # type: ignore[attr-defined]


def _ticks_while_paused(record: RunRecord) -> None:
    old = record.samples[2]
    record.samples[2] = AgentSample(old.t, old.containers, True, 9, old.exchanges)


def _never_paused(record: RunRecord) -> None:
    record.samples = [s for s in record.samples if not s.mig_paused]


def _never_resumed(record: RunRecord) -> None:
    record.samples = record.samples[:3]


def _stray(record: RunRecord) -> None:
    record.stray_processes.append("training workload (PID 1001)")


def _socket_left(record: RunRecord) -> None:
    record.socket_left = True


def _failed_exit(record: RunRecord) -> None:
    _workload(record, "notebook").exit_code = 1


@pytest.mark.parametrize(
    ("defect", "check"),
    [
        (_wrong_pid, "pids_correct"),
        (_no_namespace, "pids_correct"),
        (_no_broker_answer, "pids_correct"),
        (_set_final("training", episodes=[], blocked_seconds=0.0), "low_priority_blocked"),
        # Blocked while inference was idle (3-6.5 s, 2 s of grace), or blocked with nobody above it.
        (_set_final("training", episodes=[[101.2, 103.8], [105.2, 105.6]]), "blocking_explained"),
        (_set_final("notebook", episodes=[[101.0, 101.5]]), "blocking_explained"),
        # Never launched again after its last block.
        (_set_final("training", windows=[[100.0, 101.2], [103.8, 106.6]]), "unblocked_after"),
        (_not_exported, "metrics_served"),
        (_ticks_while_paused, "mig_paused"),
        (_never_paused, "mig_paused"),
        (_never_resumed, "mig_resumed"),
        (_stray, "clean_shutdown"),
        (_socket_left, "clean_shutdown"),
        (_failed_exit, "clean_shutdown"),
    ],
)
def test_each_defect_fails_its_check(defect: Callable[[RunRecord], None], check: str) -> None:
    record = good_record()
    record.samples = [
        AgentSample(s.t, dict(s.containers), s.mig_paused, s.ticks, s.exchanges)
        for s in record.samples
    ]
    defect(record)
    summary = summarize(record)
    assert summary["checks"][check] is False
    assert summary["ok"] is False
    assert f"  [FAIL] {CHECKS[check]}" in render_summary(summary)


def test_an_interrupted_run_is_not_ok() -> None:
    record = good_record()
    record.interrupted = True
    summary = summarize(record)
    assert summary["checks"] == dict.fromkeys(CHECKS, True)
    assert summary["ok"] is False
    assert any("interrupted" in line for line in render_summary(summary))
