"""The fuzz campaign runner behind ``fuzz/run``: hypothesis properties under a time budget.

How this works: a *target* (``codec``, ``broker``, ...) is a list of *properties*; a property
is a check function plus the hypothesis strategies of its arguments, all taken from
``tests/strategies`` (or, where the test suite already states the property, the test's own
body via ``test.hypothesis.inner_test``), so the campaign explores exactly the input space
the tests describe, only for much longer.

Hypothesis has no time budget, so each property runs as a sequence of ordinary hypothesis
runs ("batches"), each with its own random seed drawn from the campaign seed and a
``max_examples`` sized from the speed of the previous batch so that the budget is kept to
within a few seconds.  Every call of the check is counted: that count is the "inputs" figure
printed per property and per target (it includes the calls hypothesis makes while shrinking a
failure).

Before generating anything a property replays its regression inputs: the examples listed
with the property (``Property.examples``) and, for properties of one ``bytes`` argument, every
file under ``fuzz/corpus/<target>.<property>/``.  A failure found by generation is shrunk by
hypothesis, printed (falsifying example, ``@reproduce_failure`` blob, traceback) and, for a
bytes property, saved into that corpus directory so every later campaign replays it; for
other properties, add the printed example to ``Property.examples`` (or as ``@example`` to the
test whose body the property reuses).

Settings: the base is a hypothesis profile from ``tests/profiles.py`` (``ci`` for
``--ci``, ``fuzz`` otherwise); the campaign replaces ``max_examples`` per batch, turns the
example database off (each campaign is fresh; reproduce with ``--seed``) and suppresses the
health checks, which judge how a *test* is written, not whether the code is right.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fuzz.mutation import Mutator, MutatorResult, run_mutator

__all__ = [
    "CORPUS_ROOT",
    "Mutator",
    "Property",
    "PropertyResult",
    "Result",
    "Target",
    "run_property",
    "run_target",
]

#: Where regression inputs of bytes properties live: ``<target>.<property>/<sha256>.bin``.
CORPUS_ROOT = Path(__file__).resolve().parent / "corpus"

# A batch never plans more than this many seconds, so a budget is overrun by at most about
# that much (plus one slow example).
_MAX_BATCH_SECONDS = 3.0
_FIRST_BATCH = 10
#: How long past its budget a mutation worker may run before it counts as hung and is killed.
WORKER_GRACE_SECONDS = 120.0
_MAX_BATCH = 20_000


class _TimeUp(BaseException):
    """Raised from the check when the property's time budget is spent mid-batch.

    A ``BaseException`` so hypothesis stops the batch at once instead of treating it as a
    failure; it keeps a budget to within one input even when inputs grow slower as a batch
    goes on (the batch size is only an estimate).
    """


class _ShrinkBudgetSpent(BaseException):
    """Raised from the check once shrinking a failure took too long.

    A ``BaseException`` on purpose: hypothesis treats ``Exception`` as a failing input to
    shrink further, but lets other exceptions through, which ends the run at once.  The
    smallest failing input seen so far is then the result.
    """


@dataclass(frozen=True)
class Property:
    """One property: ``check(*args)`` must not raise for any ``args`` the strategies draw.

    Attributes:
        name: short name, unique within its target.
        strategies: one strategy per positional argument of ``check``.
        check: raises (``AssertionError`` or anything else) when the property is violated.
        examples: regression inputs (argument tuples) replayed before generation.
        weight: share of the target's budget relative to its other properties.
        bytes_corpus: the property takes one ``bytes`` argument: replay and save corpus files.
        shrink_seconds: how long hypothesis may shrink a failure before the smallest failing
            input found so far is reported (slow properties, e.g. a live broker, would
            otherwise shrink for many minutes).
    """

    name: str
    strategies: tuple[st.SearchStrategy[Any], ...]
    check: Callable[..., None]
    examples: tuple[tuple[Any, ...], ...] = ()
    weight: float = 1.0
    bytes_corpus: bool = False
    shrink_seconds: float = 60.0


@dataclass(frozen=True)
class Target:
    """A named group of properties and mutators with a share of the campaign's budget.

    Attributes:
        name: what ``fuzz/run --target`` takes.
        description: one line for ``--list``.
        properties: the hypothesis properties, run in order.
        ci_seconds: this target's budget in ``--ci`` mode (scaled down with every other
            target's when the targets' sum exceeds the CI total, ``fuzz.main.CI_SECONDS``).
        weight: share of the total in ``--minutes`` mode.
        session: opens what the properties need for the whole target (a live broker) and
            closes it afterwards; ``None`` when they need nothing.  Mutators run outside it
            (a mutator that needs state has its own ``setup``).
    """

    name: str
    description: str
    properties: tuple[Property, ...]
    ci_seconds: float
    weight: float = 1.0
    session: Callable[[], AbstractContextManager[None]] | None = None
    #: the fast layer (``fuzz/mutation.py``): byte-mutation loops run after the properties,
    #: sharing the target's budget with them by weight.
    mutators: tuple[Mutator, ...] = ()


@dataclass
class PropertyResult:
    """What one property's run produced."""

    target: str
    name: str
    inputs: int = 0
    replayed: int = 0
    batches: int = 0
    seconds: float = 0.0
    failure: str | None = None
    failing_input: str | None = None
    first_failing_input: str | None = None
    saved: list[Path] = field(default_factory=list)
    kind: str = "property"

    @property
    def ok(self) -> bool:
        return self.failure is None


def corpus_dir(target: str, prop: Property) -> Path:
    """The corpus directory of a bytes property."""
    return CORPUS_ROOT / f"{target}.{prop.name}"


def _corpus_files(target: str, prop: Property) -> list[Path]:
    if not prop.bytes_corpus:
        return []
    directory = corpus_dir(target, prop)
    return sorted(p for p in directory.glob("*") if p.is_file()) if directory.is_dir() else []


def save_corpus_input(target: str, prop: Property, data: bytes) -> Path:
    """Store a failing input of a bytes property where every later campaign replays it."""
    directory = corpus_dir(target, prop)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


def run_property(  # noqa: C901 - one closure counts both phases; not split yet
    target: str,
    prop: Property,
    *,
    parent: settings,
    seconds: float,
    max_inputs: int | None,
    rng: random.Random,
    save_failures: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> PropertyResult:
    """Replay a property's regression inputs, then generate inputs until the budget is spent.

    Args:
        target: the target's name (for messages and the corpus path).
        prop: the property.
        parent: the hypothesis settings each batch starts from (a profile).
        seconds: time budget for generation (replay comes first and is not cut short).
        max_inputs: stop after this many checked inputs (``None``: only the time counts).
        rng: source of the batch seeds (seeded from the campaign seed).
        save_failures: write a failing input of a bytes property into its corpus directory.
        clock: monotonic seconds (injectable for tests).

    Returns:
        The counts, and the failure (traceback text) if the property was violated; the run
        stops at the first failure.
    """
    result = PropertyResult(target, prop.name)
    failing: list[tuple[Any, ...]] = []
    first_failure: list[float] = []
    last_traceback: list[str] = []

    stop_at: list[float] = []

    def counted(args: tuple[Any, ...]) -> None:
        if first_failure:
            if clock() - first_failure[0] > prop.shrink_seconds:
                raise _ShrinkBudgetSpent
        elif stop_at and clock() > stop_at[0]:
            raise _TimeUp
        result.inputs += 1
        try:
            prop.check(*args)
        except Exception:
            # While shrinking, hypothesis only tries smaller inputs: the last failing one is
            # the smallest so far.
            failing.append(args)
            first_failure[:] = first_failure or [clock()]
            last_traceback[:] = [traceback.format_exc()]
            raise

    start = clock()
    try:
        for args in prop.examples:
            counted(args)
            result.replayed += 1
        for path in _corpus_files(target, prop):
            counted((path.read_bytes(),))
            result.replayed += 1
    except Exception:
        result.failure = traceback.format_exc()
        result.failing_input = repr(failing[-1]) if failing else None
        result.seconds = clock() - start
        return result

    generate_start = clock()
    stop_at.append(generate_start + seconds)
    batch = _FIRST_BATCH
    while True:
        left = seconds - (clock() - generate_start)
        if left <= 0 or (max_inputs is not None and result.inputs >= max_inputs):
            break
        planned = batch if max_inputs is None else max(1, min(batch, max_inputs - result.inputs))
        test = given(st.tuples(*prop.strategies))(counted)
        test = settings(
            parent,
            max_examples=planned,
            database=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        )(test)
        test = seed(rng.getrandbits(64))(test)
        before, batch_start = result.inputs, clock()
        try:
            test()
        except _TimeUp:
            break
        except (Exception, _ShrinkBudgetSpent) as exc:
            result.failure = traceback.format_exc()
            if isinstance(exc, _ShrinkBudgetSpent):
                result.failure = (
                    f"(shrinking stopped after {prop.shrink_seconds:.0f} s; smallest failing "
                    f"input so far)\n{last_traceback[0] if last_traceback else ''}"
                )
            if failing:
                # Hypothesis replays the shrunk example last: the last failing call is it.
                # The first one is kept too: where a failure leaves state behind (a leak in
                # a live server), later inputs fail because of it and shrink to trivia.
                result.failing_input = repr(failing[-1])
                result.first_failing_input = repr(failing[0])
                data = failing[-1][0] if len(failing[-1]) == 1 else None
                if save_failures and prop.bytes_corpus and isinstance(data, bytes):
                    result.saved.append(save_corpus_input(target, prop, data))
            break
        finally:
            result.batches += 1
        took = clock() - batch_start
        ran = max(result.inputs - before, 1)
        per_input = max(took / ran, 1e-6)
        remaining = seconds - (clock() - generate_start)
        batch = int(max(1.0, min(remaining, _MAX_BATCH_SECONDS) / per_input))
        batch = min(batch, _MAX_BATCH)
    result.seconds = clock() - start
    return result


@contextlib.contextmanager
def _no_session() -> Iterator[None]:
    yield


#: What :func:`run_target` reports per property or mutator.
Result = PropertyResult | MutatorResult


def run_target(
    target: Target,
    *,
    parent: settings,
    seconds: float,
    max_inputs: int | None,
    rng: random.Random,
    save_failures: bool = True,
    report: Callable[[Result], None] | None = None,
    jobs: int = 1,
) -> list[Result]:
    """Run every property, then every mutator, of a target.

    With ``jobs=1`` the properties and mutators share ``seconds`` by weight, one after the
    other.  With ``jobs >= 2`` and both layers present, the mutators run in a forked worker
    process at the same time as the properties run here, and each layer has the whole
    ``seconds`` (split by weight within the layer): two cores, twice the inputs, the same
    wall time.  A target without mutators (or without properties) runs in this process only,
    so a target that needs the second core itself (the live broker) has it.

    Args:
        target: the target.
        parent: base hypothesis settings (a profile).
        seconds: the target's whole time budget.
        max_inputs: per-property (and per-mutator) cap on checked inputs (``None``: time).
        rng: source of batch seeds and mutation seeds.
        save_failures: see :func:`run_property` and :func:`fuzz.mutation.run_mutator`.
        report: called with each result as soon as it is known.
        jobs: processes to use (1 or 2).

    Returns:
        One result per property, then one per mutator, in order.  A failure of one does not
        stop the others; a session that cannot be opened raises.
    """
    # Drawn first, so the mutated inputs are the same whatever ``jobs`` is.
    mutation_rng = random.Random(rng.getrandbits(64))
    parallel = jobs >= 2 and bool(target.properties) and bool(target.mutators)
    prop_weight = sum(p.weight for p in target.properties)
    mut_weight = sum(m.weight for m in target.mutators)
    if parallel:
        prop_total, mut_total = prop_weight or 1.0, mut_weight or 1.0
    else:
        prop_total = mut_total = (prop_weight + mut_weight) or 1.0
    results: list[Result] = []

    def mutators() -> list[Result]:
        done: list[Result] = []
        for mutator in target.mutators:
            done.append(
                run_mutator(
                    target.name,
                    mutator,
                    seconds=seconds * mutator.weight / mut_total,
                    max_inputs=max_inputs,
                    rng=mutation_rng,
                    save_failures=save_failures,
                )
            )
        return done

    worker = _start_worker(mutators) if parallel else None
    opener = target.session or _no_session
    with opener():
        for prop in target.properties:
            result: Result = run_property(
                target.name,
                prop,
                parent=parent,
                seconds=seconds * prop.weight / prop_total,
                max_inputs=max_inputs,
                rng=rng,
                save_failures=save_failures,
            )
            results.append(result)
            if report is not None:
                report(result)
    # Mutators never run inside the target's session (in the worker they could not share
    # it anyway); one that needs state has its own ``setup``.
    if worker is None:
        mutated = mutators()
    else:
        deadline = time.monotonic() + seconds + WORKER_GRACE_SECONDS
        mutated = _finish_worker(worker, target, deadline=deadline)
    for result in mutated:
        results.append(result)
        if report is not None:
            report(result)
    return results


def _start_worker(job: Callable[[], list[Result]]) -> tuple[Any, Any]:
    """Fork a process that runs ``job`` and sends its results back through a pipe."""
    context = multiprocessing.get_context("fork")
    # the child would flush what is still buffered here a second time
    sys.stdout.flush()
    sys.stderr.flush()
    receiver, sender = context.Pipe(duplex=False)

    def child() -> None:
        receiver.close()
        try:
            sender.send(("ok", job()))
        except BaseException:
            sender.send(("error", traceback.format_exc()))
        finally:
            sender.close()

    process = context.Process(target=child, name="fuzz-mutators", daemon=True)
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks (an idle thread a live-broker
        # target left in trio's cache): the child only runs the mutators' pure-Python loop
        # and needs no lock another thread could hold.
        warnings.simplefilter("ignore", DeprecationWarning)
        process.start()
    sender.close()
    return process, receiver


def _finish_worker(worker: tuple[Any, Any], target: Target, *, deadline: float) -> list[Result]:
    """The worker's results; a worker that died (a crash in native code, a kill), raised or
    is still running at ``deadline`` (a check that hangs) is one failed result saying so."""
    process, receiver = worker
    message: tuple[str, Any] | None = None
    try:
        if receiver.poll(max(0.0, deadline - time.monotonic())):
            message = receiver.recv()
        else:
            process.kill()
            message = ("error", "still running long after its budget (a check that hangs?)")
    except EOFError:
        message = None
    finally:
        receiver.close()
    process.join()
    if message is not None and message[0] == "ok":
        done: list[Result] = message[1]
        return done
    why = message[1] if message is not None else f"exit code {process.exitcode}"
    return [
        MutatorResult(
            target.name,
            "mutators",
            failure=f"the mutation worker of {target.name} ended abnormally: {why}",
        )
    ]


def select_targets(targets: Sequence[Target], names: Sequence[str]) -> list[Target]:
    """The targets named (all when ``names`` is empty), in registry order.

    Raises:
        KeyError: a name that is no target (the message lists the known ones).
    """
    known = {t.name for t in targets}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown target {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [t for t in targets if not names or t.name in names]
