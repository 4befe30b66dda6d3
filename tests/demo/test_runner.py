"""The runner around an agent that fails: before it is ready, and in the middle of the run."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from hami_trio.demo.runner import AgentSettings, DemoOptions, run_demo
from hami_trio.errors import AgentError, BrokerStartupError


class _FakeAgent:
    metrics_url = "http://127.0.0.1:9/metrics"  # nothing listens: every scrape fails
    command = "fake"
    debug_address = None

    def __init__(self) -> None:
        self.stop = trio.Event()

    def request_stop(self) -> None:
        self.stop.set()


def _make_dir(path: Path) -> None:
    path.mkdir(mode=0o711)


async def _refuses(settings: AgentSettings, *, task_status: trio.TaskStatus[Any]) -> None:
    raise BrokerStartupError(f"{settings.paths.socket_path}: refused for the test")


async def test_an_agent_that_cannot_start_is_the_whole_answer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    out = io.StringIO()
    options = DemoOptions(duration=3, interval=0.2, root=root)
    with pytest.raises(BrokerStartupError, match="refused for the test"):
        await run_demo(options, serve_agent=_refuses, out=out)
    # No workload was started; the kept root holds only what the demo prepared.
    assert sorted(os.listdir(root)) == ["hook", "logs"]
    assert os.listdir(root / "logs") == []


async def test_the_temporary_root_goes_even_when_the_start_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(BrokerStartupError):
        await run_demo(
            DemoOptions(duration=3, interval=0.2), serve_agent=_refuses, out=io.StringIO()
        )
    assert os.listdir(tmp_path) == []


@pytest.mark.root
async def test_an_agent_failing_mid_run_ends_the_run_and_is_reported(tmp_path: Path) -> None:
    async def fails_later(settings: AgentSettings, *, task_status: trio.TaskStatus[Any]) -> None:
        _make_dir(settings.paths.broker_dir)  # a broker directory without a broker in it
        agent = _FakeAgent()
        task_status.started(agent)
        with trio.move_on_after(1.5):
            await agent.stop.wait()
        raise AgentError("monitor", "monitor failed: for the test", started=True)

    out = io.StringIO()
    with trio.fail_after(30):
        summary = await run_demo(
            DemoOptions(duration=20, interval=0.2), serve_agent=fails_later, out=out
        )
    assert summary["cleanup"]["agent_error"] == "monitor failed: for the test"
    assert summary["cleanup"]["stray_processes"] == []
    assert summary["checks"]["clean_shutdown"] is False
    assert summary["ok"] is False
    # No broker in this test: every workload fell back, like HAMi-core without one (the one
    # without the switch did not even look).
    reasons = {w["name"]: w["broker_reason"] for w in summary["workloads"]}
    assert reasons.pop("no-broker") == "disabled"
    assert set(reasons.values()) == {"missing"}
    assert summary["checks"]["pids_correct"] is False
    assert all(w["exit_code"] == 0 for w in summary["workloads"])
    assert "agent FAILED: monitor failed: for the test" in out.getvalue()
