"""Command line of the fuzz campaign (``fuzz/run``).

How this works: pick the targets (all, or ``--target`` ones), give each a time budget - its
``ci_seconds`` with ``--ci``, else ``--minutes`` shared by the targets' weights - and run
them one after the other with :func:`fuzz.campaign.run_target`.  One line per property is
printed as it finishes, then a table with the number of inputs each target ran.  The campaign
seed is printed first: ``--seed`` with the same value draws the same batch seeds (inputs then
differ only where a property's own timing does, e.g. the live broker).

Exit status: 0 when every property held, 1 when one failed (its shrunk input and traceback are
printed; bytes inputs are also saved into ``fuzz/corpus/``), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence

from hypothesis import settings

from fuzz.campaign import PropertyResult, run_target, select_targets
from fuzz.targets import all_targets
from tests.profiles import register_profiles

__all__ = ["main"]

_CI_DEFAULT_NOTE = "about 3 minutes in all"


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
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    return parser


def _print_result(result: PropertyResult) -> None:
    status = "ok" if result.ok else "FAILED"
    print(
        f"  {result.target:11} {result.name:28} inputs={result.inputs:8d} "
        f"(replayed {result.replayed}) {result.seconds:6.1f} s  {status}",
        flush=True,
    )
    if not result.ok:
        print(f"\n--- {result.target}.{result.name} failed ---")
        if result.failing_input is not None:
            print(f"failing input (shrunk): {result.failing_input}")
        if result.first_failing_input not in (None, result.failing_input):
            print(f"first failing input: {result.first_failing_input}")
        for path in result.saved:
            print(f"saved as a regression input: {path}")
        print(result.failure)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the campaign; returns the exit status."""
    args = _parser().parse_args(argv)
    targets = all_targets()
    if args.list:
        for target in targets:
            props = ", ".join(p.name for p in target.properties)
            print(f"{target.name:11} ci {target.ci_seconds:5.0f} s  {target.description}")
            print(f"{'':11} properties: {props}")
        return 0
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
        budgets = {t.name: t.ci_seconds for t in chosen}
    print(
        f"fuzz campaign: profile {profile}, seed {campaign_seed}, "
        f"budget {sum(budgets.values()):.0f} s over {len(chosen)} targets"
        + (f", at most {args.examples} inputs per property" if args.examples else "")
        + f" (pid {os.getpid()})",
        flush=True,
    )
    started = time.monotonic()
    results: list[PropertyResult] = []
    for target in chosen:
        print(f"{target.name}: {target.description} (budget {budgets[target.name]:.0f} s)")
        results += run_target(
            target,
            parent=parent,
            seconds=budgets[target.name],
            max_inputs=args.examples,
            rng=rng,
            save_failures=not args.no_save,
            report=_print_result,
        )
    elapsed = time.monotonic() - started

    print(f"\n{'target':11} {'inputs':>10} {'seconds':>8}  result")
    for target in chosen:
        mine = [r for r in results if r.target == target.name]
        inputs = sum(r.inputs for r in mine)
        seconds = sum(r.seconds for r in mine)
        failed = [r.name for r in mine if not r.ok]
        verdict = "ok" if not failed else "FAILED: " + ", ".join(failed)
        print(f"{target.name:11} {inputs:10d} {seconds:8.1f}  {verdict}")
    total = sum(r.inputs for r in results)
    print(f"{'total':11} {total:10d} {elapsed:8.1f}  (seed {campaign_seed})")
    return 0 if all(r.ok for r in results) else 1
