"""The fuzz campaign runner: budgets, counting, failures, corpus replay, and every target.

The runner's own behaviour is checked with small synthetic properties; then each registered
target runs a handful of inputs, so a change in the code or in the strategies that breaks a
target shows up in the test suite, not first in the CI campaign.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from fuzz import campaign
from fuzz.campaign import Property, Target, run_property, run_target, select_targets
from fuzz.targets import all_targets
from tests.profiles import register_profiles

ROOT = Path(__file__).resolve().parents[2]

register_profiles()
PARENT = settings.get_profile("ci")


def _run(prop: Property, **kwargs: object) -> campaign.PropertyResult:
    options: dict[str, object] = {
        "parent": PARENT,
        "seconds": 30.0,
        "max_inputs": None,
        "rng": random.Random(0),
    }
    options.update(kwargs)
    return run_property("t", prop, **options)  # type: ignore[arg-type]


def test_example_budget_counts_every_checked_input() -> None:
    seen: list[int] = []
    prop = Property("ints", (st.integers(),), seen.append, examples=((1,), (2,)))
    result = _run(prop, max_inputs=250)
    assert result.ok
    assert result.replayed == 2
    assert result.inputs == len(seen)
    assert 250 <= result.inputs <= 252
    assert seen[:2] == [1, 2]


def test_time_budget_is_kept() -> None:
    def slow(_: int) -> None:
        time.sleep(0.002)

    start = time.monotonic()
    result = _run(Property("slow", (st.integers(),), slow), seconds=1.0)
    took = time.monotonic() - start
    assert result.ok
    assert result.batches >= 2
    assert 50 < result.inputs < 600
    assert 0.9 < took < 4.0


def test_failure_is_shrunk_reported_and_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(campaign, "CORPUS_ROOT", tmp_path)

    def short(data: bytes) -> None:
        assert len(data) < 5

    prop = Property("bytes", (st.binary(),), short, bytes_corpus=True)
    result = _run(prop)
    assert not result.ok
    assert "AssertionError" in (result.failure or "")
    assert result.failing_input == repr((bytes(5),))
    assert [p.read_bytes() for p in result.saved] == [bytes(5)]
    assert result.saved[0].parent == tmp_path / "t.bytes"

    # The next campaign replays the saved input before generating anything.
    again = _run(prop, max_inputs=1)
    assert again.replayed == 0
    assert again.inputs == 1
    assert not again.ok
    assert again.failing_input == repr((bytes(5),))


def test_regression_examples_fail_before_generation() -> None:
    def positive(value: int) -> None:
        assert value > 0

    prop = Property("pos", (st.integers(min_value=1),), positive, examples=((-3,),))
    result = _run(prop)
    assert not result.ok
    assert result.failing_input == repr((-3,))
    assert result.batches == 0


def test_slow_shrinking_is_cut_short() -> None:
    def slow_failure(value: int) -> None:
        time.sleep(0.01)
        assert value < 1000

    prop = Property("slow", (st.integers(),), slow_failure, shrink_seconds=0.3)
    start = time.monotonic()
    result = _run(prop)
    assert time.monotonic() - start < 10
    assert not result.ok
    assert "shrinking stopped" in (result.failure or "")
    assert result.failing_input is not None


def test_run_target_shares_the_budget_and_opens_the_session() -> None:
    events: list[str] = []

    class Session:
        def __enter__(self) -> None:
            events.append("open")

        def __exit__(self, *exc: object) -> None:
            events.append("close")

    target = Target(
        "demo",
        "two properties",
        (
            Property("a", (st.integers(),), lambda _: events.append("a")),
            Property("b", (st.integers(),), lambda _: events.append("b"), weight=3.0),
        ),
        ci_seconds=1.0,
        session=Session,
    )
    results = run_target(target, parent=PARENT, seconds=0.8, max_inputs=20, rng=random.Random(1))
    assert [r.name for r in results] == ["a", "b"]
    assert all(r.ok and r.inputs == 20 for r in results)
    assert events[0] == "open"
    assert events[-1] == "close"


def test_select_targets_refuses_unknown_names() -> None:
    targets = all_targets()
    assert select_targets(targets, []) == targets
    assert [t.name for t in select_targets(targets, ["codec"])] == ["codec"]
    with pytest.raises(KeyError, match="unknown target nope"):
        select_targets(targets, ["nope"])


def test_target_names_are_unique_and_budgets_fit_ci() -> None:
    targets = all_targets()
    assert len({t.name for t in targets}) == len(targets)
    for target in targets:
        assert len({p.name for p in target.properties}) == len(target.properties)
    # CI's campaign stays a few minutes (docs/fuzzing.md, .ci/run).
    assert sum(t.ci_seconds for t in targets) <= 240


@pytest.mark.parametrize("name", [t.name for t in all_targets()])
def test_every_target_runs_a_few_inputs(name: str) -> None:
    (target,) = select_targets(all_targets(), [name])
    results = run_target(
        target,
        parent=PARENT,
        seconds=20.0,
        max_inputs=3,
        rng=random.Random(7),
        save_failures=False,
    )
    for result in results:
        assert result.ok, result.failure
        assert result.inputs >= 3


def test_command_line_lists_and_refuses_bad_usage() -> None:
    run = [sys.executable, str(ROOT / "fuzz" / "run")]
    listed = subprocess.run([*run, "--list"], capture_output=True, text=True, check=True)
    for target in all_targets():
        assert target.name in listed.stdout
    bad = subprocess.run([*run, "--target", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "unknown target nope" in bad.stderr


def test_command_line_prints_inputs_per_target() -> None:
    run = [sys.executable, str(ROOT / "fuzz" / "run"), "--target", "codec", "--examples", "5"]
    done = subprocess.run([*run, "--seed", "3"], capture_output=True, text=True, check=True)
    assert "seed 3" in done.stdout
    summary = [line for line in done.stdout.splitlines() if line.startswith("codec ")]
    assert len(summary) == 1
    assert int(summary[0].split()[1]) >= 5 * 4
