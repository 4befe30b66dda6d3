"""Command line of the fuzz campaign (``fuzz/run``).

How this works: pick the targets (all, or ``--target`` ones), give each a time budget - its
``ci_seconds`` with ``--ci`` (scaled down together when they add up to more than
:data:`CI_SECONDS`, so a new target never makes CI longer), else ``--minutes`` shared by the
targets' weights - and run them one after the other with :func:`fuzz.campaign.run_target`:
each target's hypothesis properties, then its byte mutators (``fuzz/mutation.py``).  One
line per property or mutator is printed as it finishes, then a table with the number of
inputs each target ran in each layer.  The campaign seed is printed first: ``--seed`` with
the same value draws the same batch seeds and the same mutated inputs in the same order
(how many run depends on the clock, and the live broker's inputs on its timing).

``--replay FILE`` checks one saved input again: a mutator's artifact
(``fuzz/artifacts/<target>.<mutator>-<sha>.bin``) or a corpus file
(``fuzz/corpus/<target>.<name>/...``).

Exit status: 0 when every property and mutator held, 1 when one failed (its input and
traceback are printed; bytes inputs are also saved: shrunk property inputs into
``fuzz/corpus/``, mutator inputs into ``fuzz/artifacts/`` with the command that replays
them), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from hypothesis import settings

from fuzz.campaign import PropertyResult, Result, Target, run_target, select_targets
from fuzz.mutation import MutatorResult, parse_artifact_name, replay
from fuzz.targets import all_targets
from tests.profiles import register_profiles

__all__ = ["CI_SECONDS", "ci_budgets", "main"]

#: The whole ``--ci`` campaign's budget in seconds.
CI_SECONDS = 180.0
_CI_DEFAULT_NOTE = f"{CI_SECONDS / 60:.0f} minutes in all"


def ci_budgets(targets: Sequence[Target], total: float = CI_SECONDS) -> dict[str, float]:
    """Each target's ``--ci`` budget: its ``ci_seconds``, all scaled by the same factor
    when they add up to more than ``total``."""
    wanted = sum(t.ci_seconds for t in targets)
    scale = min(1.0, total / wanted) if wanted > 0 else 1.0
    return {t.name: t.ci_seconds * scale for t in targets}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fuzz/run",
        description="Run hami-trio's hypothesis fuzz campaign (see docs/fuzzing.md).",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--ci",
        action="store_true",
        help=f"the bounded CI campaign: each target's own budget ({_CI_DEFAULT_NOTE})",
    )
    mode.add_argument(
        "--minutes",
        type=float,
        help="a long campaign of this many minutes, shared by the targets' weights",
    )
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this target (repeatable); see --list",
    )
    parser.add_argument(
        "--examples",
        type=int,
        metavar="N",
        help="stop each property after N inputs (an example budget; the time budget still "
        "applies unless --minutes is large)",
    )
    parser.add_argument("--seed", type=int, help="campaign seed (default: random, printed)")
    parser.add_argument(
        "--no-save",
        action="store_true",
        help="do not write failing bytes inputs into fuzz/corpus/",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        choices=(1, 2),
        default=2 if (os.cpu_count() or 1) >= 2 else 1,
        help="2: run each target's mutators in a second process beside its properties, "
        "each layer with the whole budget (default on 2 or more CPUs); 1: one after the other",
    )
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument(
        "--replay",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="check one saved input again (a fuzz/artifacts/ or fuzz/corpus/ file; repeatable)",
    )
    return parser


def _print_result(result: Result) -> None:
    status = "ok" if result.ok else "FAILED"
    extra = (
        f"(replayed {result.replayed}, {result.seeds} seeds, {result.skipped} repeats skipped, "
        f"{result.cpu_seconds:.1f} CPU s)"
        if isinstance(result, MutatorResult)
        else f"(replayed {result.replayed})"
    )
    print(
        f"  {result.target:11} {result.kind:8} {result.name:24} inputs={result.inputs:9d} "
        f"{result.seconds:6.1f} s  {status}  {extra}",
        flush=True,
    )
    if result.ok:
        return
    print(f"\n--- {result.target}.{result.name} failed ---")
    if isinstance(result, PropertyResult):
        if result.failing_input is not None:
            print(f"failing input (shrunk): {result.failing_input}")
        if result.first_failing_input not in (None, result.failing_input):
            print(f"first failing input: {result.first_failing_input}")
        for path in result.saved:
            print(f"saved as a regression input: {path}")
    else:
        print(f"failing input: {result.failing_input}")
        if result.artifact is not None:
            print(f"saved as {result.artifact}")
            print(f"reproduce: {result.reproduce}")
    print(result.failure)


def _replay(targets: Sequence[Target], paths: Sequence[Path]) -> int:
    failed = False
    for path in paths:
        try:
            target_name, name = parse_artifact_name(path)
            (target,) = select_targets(targets, [target_name])
            data = path.read_bytes()
        except (ValueError, KeyError, OSError) as exc:
            print(f"fuzz/run: --replay {path}: {exc}", file=sys.stderr)
            return 2
        mutators = {m.name: m for m in target.mutators}
        properties = {p.name: p for p in target.properties if p.bytes_corpus}
        if name in mutators:
            with contextlib.ExitStack() as stack:
                if target.session is not None:
                    stack.enter_context(target.session())
                result = replay(target.name, mutators[name], data)
            failure = result.failure
        elif name in properties:
            try:
                properties[name].check(data)
                failure = None
            except Exception:
                failure = traceback.format_exc()
        else:
            known = ", ".join(sorted([*mutators, *properties])) or "none"
            print(
                f"fuzz/run: --replay {path}: {target.name} has no mutator or bytes property "
                f"{name!r} (known: {known})",
                file=sys.stderr,
            )
            return 2
        print(f"{path}: {target.name}.{name} {'ok' if failure is None else 'FAILED'}")
        if failure is not None:
            print(failure)
            failed = True
    return 1 if failed else 0


def _summary(
    chosen: Sequence[Target],
    results: Sequence[Result],
    walls: dict[str, float],
    elapsed: float,
    seed: int,
) -> None:
    """The table at the end: inputs per target and layer, wall time, mutation rate."""
    print(
        f"\n{'target':11} {'properties':>11} {'mutation':>11} {'inputs':>11} {'wall s':>7} "
        f"{'mutation/s':>10}  result"
    )
    for target in chosen:
        mine = [r for r in results if r.target == target.name]
        by_property = sum(r.inputs for r in mine if isinstance(r, PropertyResult))
        mutated = [r for r in mine if isinstance(r, MutatorResult)]
        by_mutation = sum(r.inputs for r in mutated)
        mutation_seconds = sum(r.seconds for r in mutated)
        rate = f"{by_mutation / mutation_seconds:10.0f}" if mutation_seconds > 0 else f"{'-':>10}"
        failed = [r.name for r in mine if not r.ok]
        verdict = "ok" if not failed else "FAILED: " + ", ".join(failed)
        print(
            f"{target.name:11} {by_property:11d} {by_mutation:11d} {by_property + by_mutation:11d} "
            f"{walls.get(target.name, 0.0):7.1f} {rate}  {verdict}"
        )
    total = sum(r.inputs for r in results)
    print(f"{'total':11} {'':11} {'':11} {total:11d} {elapsed:7.1f} {'':10}  (seed {seed})")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the campaign; returns the exit status."""
    args = _parser().parse_args(argv)
    targets = all_targets()
    if args.list:
        for target in targets:
            props = ", ".join(p.name for p in target.properties)
            print(f"{target.name:11} ci {target.ci_seconds:5.0f} s  {target.description}")
            print(f"{'':11} properties: {props or '-'}")
            print(f"{'':11} mutators:   {', '.join(m.name for m in target.mutators) or '-'}")
        return 0
    if args.replay:
        return _replay(targets, args.replay)
    try:
        chosen = select_targets(targets, args.target)
    except KeyError as exc:
        print(f"fuzz/run: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.examples is not None and args.examples < 1:
        print("fuzz/run: --examples must be at least 1", file=sys.stderr)
        return 2
    if args.minutes is not None and not args.minutes > 0:
        print("fuzz/run: --minutes must be positive", file=sys.stderr)
        return 2

    register_profiles()
    profile = "ci" if args.ci or args.minutes is None else "fuzz"
    parent = settings.get_profile(profile)
    campaign_seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(campaign_seed)
    if args.minutes is not None:
        total_weight = sum(t.weight for t in chosen)
        budgets = {t.name: args.minutes * 60 * t.weight / total_weight for t in chosen}
    else:
        budgets = ci_budgets(chosen)
    print(
        f"fuzz campaign: profile {profile}, seed {campaign_seed}, "
        f"budget {sum(budgets.values()):.0f} s over {len(chosen)} targets"
        + (f", at most {args.examples} inputs per property" if args.examples else "")
        + f", {args.jobs} process{'es' if args.jobs > 1 else ''}"
        + f" (pid {os.getpid()})",
        flush=True,
    )
    started = time.monotonic()
    results: list[Result] = []
    walls: dict[str, float] = {}
    for target in chosen:
        target_start = time.monotonic()
        print(f"{target.name}: {target.description} (budget {budgets[target.name]:.0f} s)")
        results += run_target(
            target,
            parent=parent,
            seconds=budgets[target.name],
            max_inputs=args.examples,
            rng=rng,
            save_failures=not args.no_save,
            report=_print_result,
            jobs=args.jobs,
        )
        walls[target.name] = time.monotonic() - target_start
    elapsed = time.monotonic() - started

    _summary(chosen, results, walls, elapsed, campaign_seed)
    return 0 if all(r.ok for r in results) else 1
