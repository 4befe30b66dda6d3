"""The summary: every check holds on a good run and fails on the defect it is about."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
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
    inference, training, notebook, no_broker, crashed = default_workloads(5)
    finals = {
        # Bursts at 10-30 % and 65-85 % of the run.
        "inference": _final([[101.0, 103.0], [106.5, 108.5]], []),
        "training": _final(
            [[100.0, 101.2], [103.8, 106.6], [108.9, 110.0]], [[101.2, 103.8], [106.6, 108.9]]
        ),
        "notebook": _final([[100.5, 102.0]], []),
    }
    # no-broker runs on its own GPU all along; crashed dies at 30 % (103.0).
    finals["no-broker"] = _final([[100.5, 109.5]], [])
    finals["crashed"] = _final([[100.5, 103.0]], []) | {"crashed": True, "t": 103.0}
    workloads = []
    for n, spec in enumerate((inference, training, notebook, no_broker, crashed)):
        w = WorkloadRecord(spec, f"pod-{n}", Path(f"/r/pod-{n}_{spec.name}"), 900 + n, 1000 + n)
        w.attached = {"type": "attached", "pid": 1, "uid": 65534, "host_pid": 1000 + n}
        w.attached |= {"reason": None, "detail": None, "broker_seconds": 0.001}
        if not spec.broker:
            w.attached |= {"host_pid": None, "reason": "disabled", "detail": "switch off"}
        w.final = finals[spec.name]
        w.exit_code = 0
        workloads.append(w)

    def agent_view(t: float) -> dict[tuple[str, str], ContainerMetrics]:
        """What the agent exports at ``t``: the no-broker process unknown, the crashed one
        exited once it died (its memory still counted), training's blocks counted."""
        view = {}
        for w in workloads:
            state = "running"
            if not w.spec.broker:
                state = "unknown"
            elif w.spec.exits_at is not None and t > 103.0:
                state = "exited"
            processes = dict.fromkeys(("running", "exited", "unknown"), 0) | {state: 1}
            blocks = 2 if w.spec.name == "training" and t > 108.9 else 0
            view[(w.pod_uid, w.spec.name)] = ContainerMetrics(
                1 << 30, 8 << 30, 50, processes=processes, core_limit=w.spec.sm_limit, blocks=blocks
            )
        return view

    buckets = ((0.0001, 2), (0.00025, 3), (float("inf"), 3))
    samples = [
        AgentSample(t, agent_view(t), paused, ticks, {"ok": 4}, buckets, 0.0003, True)
        for t, paused, ticks in (
            (100.5, False, 1),
            (104.2, True, 8),
            (105.5, True, 8),
            (106.3, False, 9),
            (109.0, False, 14),
        )
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
    assert [w["pid_correct"] for w in summary["workloads"]] == [True] * 5
    explained = {row["workload"]: row for row in summary["explained"]["workloads"]}
    assert summary["explained"]["liveness_checked"] is True
    assert explained["no-broker"]["unknown_seen"] is True
    assert explained["crashed"]["crashed_at"] == 3.0
    assert explained["crashed"]["exited_seen_after_crash"] is True
    assert explained["crashed"]["memory_after_crash"] == 1 << 30
    assert explained["training"]["agent_blocks"] == 2
    assert explained["inference"]["core_limit"] == 60
    assert summary["mig"] == {
        "lock_created_at": 4.0,
        "lock_removed_at": 6.0,
        "paused_scrapes": 2,
        "ticks_while_paused": 0,
        "resumed_after_seconds": 0.3,
        "ticks_after_resume": 6,
    }
    assert summary["broker"]["exchanges"] == {"ok": 4}
    assert summary["broker"]["latency_mean_seconds"] == pytest.approx(0.0001)
    assert summary["broker"]["latency_p99_at_most_seconds"] == 0.00025
    lines = "\n".join(render_summary(summary))
    assert "PID 1 in its sandbox -> host PID 1001 (correct)" in lines
    assert "training     (priority 1) blocked 2 times, 4.9 s in all" in lines
    # Why blocked time exceeds the higher priority's active time:
    assert "lasts until the monitor's next ticks see no recent kernel" in lines
    assert "notebook     (priority 1) never blocked" in lines
    assert "no answer: disabled - switch off" in lines
    assert "no-broker    processes 1 unknown; core limit 50% <- no broker" in lines
    assert "crashed      processes 1 exited; core limit 50% <- died at 3.0 s; its slot" in lines
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
    record.samples[2] = AgentSample(
        old.t, old.containers, True, 9, old.exchanges, liveness_checked=True
    )


def _processes(name: str, **states: int) -> Callable[[RunRecord], None]:
    """The agent shows ``name``'s processes as ``states`` in every scrape."""

    def change(record: RunRecord) -> None:
        w = _workload(record, name)
        for sample in record.samples:
            key = (w.pod_uid, name)
            metrics = sample.containers[key]
            sample.containers[key] = replace(  # type: ignore[index]
                metrics, processes=dict.fromkeys(("running", "exited", "unknown"), 0) | states
            )

    return change


def _memory_gone_after_crash(record: RunRecord) -> None:
    w = _workload(record, "crashed")
    for sample in record.samples:
        key = (w.pod_uid, "crashed")
        if sample.t > 103.0:
            sample.containers[key] = replace(sample.containers[key], memory_used=0)  # type: ignore[index]


def _blocks_not_counted(record: RunRecord) -> None:
    w = _workload(record, "training")
    for sample in record.samples:
        key = (w.pod_uid, "training")
        sample.containers[key] = replace(sample.containers[key], blocks=0)  # type: ignore[index]


def _broker_asked_without_switch(record: RunRecord) -> None:
    attached = _workload(record, "no-broker").attached
    assert attached is not None
    attached |= {"host_pid": 1003, "reason": None}


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
        (_broker_asked_without_switch, "pids_correct"),
        (_processes("no-broker", running=1), "host_pid_unknown_shown"),
        (_processes("crashed", running=1), "exited_process_shown"),
        (_memory_gone_after_crash, "exited_process_shown"),
        (_blocks_not_counted, "blocking_counted"),
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
        AgentSample(
            s.t, dict(s.containers), s.mig_paused, s.ticks, s.exchanges, liveness_checked=True
        )
        for s in record.samples
    ]
    defect(record)
    summary = summarize(record)
    assert summary["checks"][check] is False
    assert summary["ok"] is False
    assert f"  [FAIL] {CHECKS[check]}" in render_summary(summary)


def test_where_liveness_cannot_be_checked_a_dead_process_shows_as_running() -> None:
    record = good_record()
    record.samples = [
        AgentSample(
            s.t, dict(s.containers), s.mig_paused, s.ticks, s.exchanges, liveness_checked=False
        )
        for s in record.samples
    ]
    _processes("crashed", running=1)(record)
    summary = summarize(record)
    assert summary["checks"]["exited_process_shown"] is True
    assert summary["explained"]["liveness_checked"] is False
    assert "NO liveness check here" in "\n".join(render_summary(summary))


def test_an_interrupted_run_is_not_ok() -> None:
    record = good_record()
    record.interrupted = True
    summary = summarize(record)
    assert summary["checks"] == dict.fromkeys(CHECKS, True)
    assert summary["ok"] is False
    assert any("interrupted" in line for line in render_summary(summary))
