"""The fuzz campaign runner: budgets, counting, failures, corpus replay, the mutation layer,
and every target.

The runner's own behaviour is checked with small synthetic properties; then each registered
target runs a handful of inputs, so a change in the code or in the strategies that breaks a
target shows up in the test suite, not first in the CI campaign.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from fuzz import campaign
from fuzz.campaign import Property, Target, run_property, run_target, select_targets
from fuzz.main import CI_SECONDS, ci_budgets
from fuzz.mutation import Mutator, MutatorResult, parse_artifact_name, replay, run_mutator
from fuzz.targets import all_targets
from hami_trio.broker.protocol import Request
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
        # property and mutator names share the corpus and --replay namespace
        names = [p.name for p in target.properties] + [m.name for m in target.mutators]
        assert len(set(names)) == len(names), target.name
    # CI's campaign stays a few minutes (docs/fuzzing.md, .ci/run); more is scaled down.
    assert sum(ci_budgets(targets).values()) <= CI_SECONDS + 1e-6


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
    properties, mutation, inputs = (int(v) for v in summary[0].split()[1:4])
    assert properties >= 5 * 4
    assert mutation >= 5 * 2
    assert inputs == properties + mutation


# -- the fast layer (fuzz/mutation.py) --------------------------------------------------------


def _mutator(check: Callable[[bytes], None], **kwargs: Any) -> Mutator:
    options: dict[str, Any] = {"seed_count": 20, "max_size": 32}
    options.update(kwargs)
    return Mutator("m", st.binary(min_size=1, max_size=12), check, **options)


def _mutate(mutator: Mutator, **kwargs: Any) -> MutatorResult:
    options: dict[str, Any] = {"seconds": 30.0, "max_inputs": 2000, "rng": random.Random(0)}
    options.update(kwargs)
    return run_mutator("t", mutator, **options)


def test_mutator_counts_each_new_input_once() -> None:
    seen: list[bytes] = []
    result = _mutate(_mutator(seen.append, examples=(b"HPID",)))
    assert result.ok
    assert result.inputs == len(seen) == 2000
    assert seen[0] == b"HPID"
    assert result.replayed == 1
    # every counted input is a new one, none grows past max_size, and the edits vary lengths
    assert len(set(seen)) == len(seen)
    assert max(len(data) for data in seen) <= 32
    assert len({len(data) for data in seen}) > 10


def test_same_seed_same_inputs() -> None:
    runs: list[list[bytes]] = [[], []]
    for run in runs:
        _mutate(_mutator(run.append), max_inputs=500, rng=random.Random(42))
    assert runs[0] == runs[1]
    other: list[bytes] = []
    _mutate(_mutator(other.append), max_inputs=500, rng=random.Random(43))
    assert other != runs[0]


def test_mutator_keeps_its_time_budget() -> None:
    start = time.monotonic()
    result = _mutate(_mutator(lambda _: None), seconds=0.5, max_inputs=None)
    took = time.monotonic() - start
    assert result.ok
    assert 0.4 < took < 3.0
    assert result.inputs > 1000


def test_an_exhausted_input_space_still_ends_on_time() -> None:
    seen: list[bytes] = []
    tiny = Mutator("tiny", st.binary(max_size=1), seen.append, max_size=1, seed_count=5)
    start = time.monotonic()
    result = _mutate(tiny, seconds=0.5, max_inputs=None)
    assert time.monotonic() - start < 3.0
    assert result.ok
    # b"" and the 256 one-byte inputs, each once
    assert len(seen) == len(set(seen)) == result.inputs <= 257
    assert result.skipped > 0


def test_planted_bug_is_found_saved_and_reproducible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAMI_FUZZ_ARTIFACTS", str(tmp_path))

    def no_version_two(data: bytes) -> None:
        # a "parser" that breaks on version 2 of an otherwise valid request
        assert not data.startswith(b"HPID\x00\x02"), "version 2 accepted"

    seeds = st.just(b"HPID\x00\x01\x00\x01")
    mutator = Mutator("planted", seeds, no_version_two, max_size=16, tokens=(b"HPID",))
    result = _mutate(mutator, max_inputs=200_000)
    assert not result.ok
    assert "version 2 accepted" in (result.failure or "")
    assert result.artifact is not None
    assert result.artifact.parent == tmp_path
    assert result.artifact.read_bytes().startswith(b"HPID\x00\x02")
    assert result.reproduce == f".venv/bin/python fuzz/run --replay {result.artifact}"
    assert parse_artifact_name(result.artifact) == ("t", "planted")
    again = replay("t", mutator, result.artifact.read_bytes())
    assert not again.ok
    assert again.inputs == 1


@pytest.mark.parametrize(
    ("module", "name", "mutator", "broken"),
    [
        # sums that wrap at 2**63 instead of 2**64
        ("hami_trio.monitor.snapshot", "_MASK64", "file_bytes", (1 << 63) - 1),
        # the mis-layout of 2008985 bytes accepted
        ("hami_trio.monitor.layout", "MISLAYOUT_SIZES", "header", frozenset({2008984})),
    ],
)
def test_layout_oracles_catch_planted_bugs(
    module: str,
    name: str,
    mutator: str,
    broken: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HAMI_FUZZ_ARTIFACTS", str(tmp_path))
    monkeypatch.setattr(importlib.import_module(module), name, broken)
    (target,) = select_targets(all_targets(), ["layout"])
    (found,) = [m for m in target.mutators if m.name == mutator]
    result = _mutate(found, max_inputs=300_000, rng=random.Random(2))
    assert not result.ok, f"{mutator} did not notice {module}.{name} = {broken!r}"
    assert "AssertionError" in (result.failure or "")


def test_codec_oracle_catches_a_planted_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    from fuzz.targets import codec

    real = codec.parse_request  # type: ignore[attr-defined]  # the name the target imported

    def accepts_command_0x80(data: bytes | bytearray | memoryview) -> Request:
        if len(data) >= 8 and data[6] == 0x80:
            return Request()
        return real(data)

    monkeypatch.setattr(codec, "parse_request", accepts_command_0x80)
    (found,) = [m for m in codec.TARGET.mutators if m.name == "request_bytes"]
    result = _mutate(found, max_inputs=300_000, rng=random.Random(2))
    assert not result.ok
    assert result.failing_input is not None


def test_parallel_layers_report_results_and_a_dead_worker() -> None:
    def crash(_: bytes) -> None:
        os._exit(3)  # a native crash in the code under test looks like this to the runner

    def target(check: Callable[[bytes], None]) -> Target:
        return Target(
            "two",
            "both layers",
            (Property("p", (st.integers(),), lambda _: None),),
            ci_seconds=1.0,
            mutators=(_mutator(check),),
        )

    for jobs in (1, 2):
        results = run_target(
            target(lambda _: None),
            parent=PARENT,
            seconds=0.6,
            max_inputs=100,
            rng=random.Random(1),
            jobs=jobs,
        )
        assert [(r.kind, r.name, r.ok, r.inputs) for r in results] == [
            ("property", "p", True, 100),
            ("mutation", "m", True, 100),
        ]
    results = run_target(
        target(crash), parent=PARENT, seconds=0.6, max_inputs=100, rng=random.Random(1), jobs=2
    )
    assert results[0].ok
    assert not results[-1].ok
    assert "ended abnormally: exit code 3" in (results[-1].failure or "")


def test_a_hung_mutation_worker_is_killed_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(campaign, "WORKER_GRACE_SECONDS", 0.5)

    def hang(_: bytes) -> None:
        time.sleep(3600)

    target = Target(
        "hang",
        "a check that never returns",
        (Property("p", (st.integers(),), lambda _: None),),
        ci_seconds=1.0,
        mutators=(_mutator(hang),),
    )
    start = time.monotonic()
    results = run_target(
        target, parent=PARENT, seconds=0.3, max_inputs=10, rng=random.Random(1), jobs=2
    )
    assert time.monotonic() - start < 10
    assert results[0].ok
    assert "still running long after its budget" in (results[-1].failure or "")


def test_mutators_need_a_check_or_a_setup() -> None:
    with pytest.raises(ValueError, match="either check or setup"):
        Mutator("none", st.binary())


def test_ci_budgets_never_exceed_the_ci_total() -> None:
    targets = all_targets()
    budgets = ci_budgets(targets)
    assert sum(budgets.values()) <= CI_SECONDS + 1e-6
    # room for more targets: they are scaled together, each keeps its share
    more = [*targets, *(dataclasses.replace(t, name=f"{t.name}2") for t in targets)]
    scaled = ci_budgets(more)
    assert sum(scaled.values()) == pytest.approx(CI_SECONDS)
    ratio = scaled["codec"] / scaled["layout"]
    assert ratio == pytest.approx(budgets["codec"] / budgets["layout"])


def test_replay_command_line(tmp_path: Path) -> None:
    run = [sys.executable, str(ROOT / "fuzz" / "run")]
    good = tmp_path / "codec.request_bytes-0000000000000000.bin"
    good.write_bytes(b"HPID\x00\x01\x00\x01")
    done = subprocess.run([*run, "--replay", str(good)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "codec.request_bytes ok" in done.stdout
    corpus = tmp_path / "codec.parse_request" / "x.bin"
    corpus.parent.mkdir()
    corpus.write_bytes(b"")
    done = subprocess.run([*run, "--replay", str(corpus)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = tmp_path / "codec.nothing-0000000000000000.bin"
    bad.write_bytes(b"")
    done = subprocess.run([*run, "--replay", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no mutator or bytes property 'nothing'" in done.stderr
