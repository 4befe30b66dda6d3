"""Mutation testing of the pure cores: ``tools/mutation/run [MODULE ...]``.

How this works: for each module (all of :data:`tools.mutation.modules.MODULES`, the ones
named, or with ``--changed`` those a change touches) the tool copies the repository's
``hami_trio``, ``tests`` and ``docs`` into a scratch directory and runs two passes there:

1. mutmut (``mutmut run``, pinned in the ``mutation`` extra) over the module with its
   covering test files only.  Every mutant mutmut leaves alive is run again in a fresh
   ``python -m pytest`` process over all the covering files (mutmut runs only the tests its
   coverage pass linked to the function, and hypothesis draws differently each run); only a
   mutant that passes that too is a survivor.
2. The constants pass (``tools/mutation/constants.py``): each module- or class-level
   literal changed in turn, the covering files run against it in a fresh process.

Survivors are sorted by ``tools/mutation/report.py`` against the reviewed equivalents
(``tools/mutation/equivalent.toml``); the last lines printed are the table, and with
``--show`` the diff of every survivor.  Exit status: 0 when every mutant of every module run
is killed or a reviewed equivalent, 1 when a gap remains (its diff is printed), 2 on bad
usage or when mutmut is missing or the clean tests fail.  How to read it: docs/testing.md.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tools.mutation.constants import constant_mutants
from tools.mutation.modules import MODULES, Target, targets_touched
from tools.mutation.report import (
    ModuleReport,
    Outcome,
    classify,
    diff_key,
    function_of,
    load_equivalents,
    message_only,
    render_table,
)

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS = ROOT / "tools" / "mutation" / "equivalent.toml"
_COPIED = ("hami_trio", "tests", "docs")
_COPIED_FILES = ("pyproject.toml", "README.md")
_IGNORED = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc", ".pytest_cache")
#: mutmut's exit codes that mean "the tests noticed" (killed, pytest internal error, timeout).
_KILLED_CODES = frozenset({1, 3, -24, 24, 152, 255, 36, -9, -11})


def _log(message: str) -> None:
    print(message, flush=True)


def _copy_tree(destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        shutil.copytree(ROOT / name, destination / name, ignore=_IGNORED)
    for name in _COPIED_FILES:
        shutil.copy2(ROOT / name, destination / name)


def _mutmut_config(target: Target, tests: list[str]) -> str:
    quoted = ", ".join(json.dumps(t) for t in tests)
    return textwrap.dedent(
        f"""

        [tool.mutmut]
        source_paths = ["hami_trio"]
        only_mutate = [{json.dumps(target.path)}]
        pytest_add_cli_args_test_selection = [{quoted}]
        pytest_add_cli_args = ["-p", "no:cacheprovider"]
        also_copy = ["docs", "README.md"]
        use_git_change_detection = false
        """
    )


def _pytest(cwd: Path, tests: list[str], env: dict[str, str], timeout: float) -> int:
    """Run the covering tests in a fresh interpreter; a timeout counts as a kill (rc 124)."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, timeout=timeout, capture_output=True, check=False
        )
    except subprocess.TimeoutExpired:
        return 124
    return done.returncode


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONDONTWRITEBYTECODE="1", **extra)
    env.pop("PYTHONPATH", None)
    return env


# A line and its end, as the parser splits source lines (not str.splitlines: no form feed).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def _segment(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """``ast.get_source_segment`` of ``node`` over the source's lines, split once.

    The stdlib function splits the whole source again, a character at a time in Python, on
    every call: on mutmut's rewritten module (a copy of a function per mutant: 2.2 MB and
    1,179 functions for ``monitor/snapshot.py``) that was 0.74 s a call, 15 minutes a module.
    """
    if node.end_lineno is None or node.end_col_offset is None:
        return None
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset : node.end_col_offset].decode()
    head = lines[first].encode()[node.col_offset :].decode()
    tail = lines[last].encode()[: node.end_col_offset].decode()
    return head + "".join(lines[first + 1 : last]) + tail


def _functions(path: Path) -> dict[str, str]:
    """Every function of mutmut's rewritten module by name, as source text."""
    source = path.read_text()
    tree = ast.parse(source)
    lines = _LINE.findall(source)
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            segment = _segment(lines, node)
            if segment is not None:
                out[node.name] = textwrap.dedent(" " * node.col_offset + segment)
    return out


def _plain(code: str, mangled: str, name: str) -> str:
    return code.replace(f"def {mangled}(", f"def {name}(", 1)


def _diff(original: str, mutant: str) -> str:
    return "\n".join(
        difflib.unified_diff(
            original.splitlines(), mutant.splitlines(), "original", "mutant", lineterm=""
        )
    )


class _OverBudget(Exception):
    """The time budget ran out while a module was being measured."""


def _mutmut_pass(
    target: Target,
    work: Path,
    tests: list[str],
    jobs: int,
    timeout: float,
    deadline: float | None,
) -> tuple[list[Outcome], str]:
    mutmut = Path(sys.executable).with_name("mutmut")
    if not mutmut.exists():
        raise SystemExit(f"no mutmut next to {sys.executable}: pip install -e '.[mutation]'")
    with (work / "pyproject.toml").open("a") as config:
        config.write(_mutmut_config(target, tests))
    log = work / "mutmut.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(mutmut), "run", "--max-children", str(jobs)],
            cwd=work,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = process.wait(
                timeout=None if deadline is None else deadline - time.monotonic()
            )
        except subprocess.TimeoutExpired:
            # mutmut forks a worker per mutant: stop the whole session it leads.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise _OverBudget from None
    meta = work / "mutants" / (target.path + ".meta")
    if returncode != 0 or not meta.exists():
        tail = log.read_text(errors="replace").replace("\r", "\n").splitlines()[-30:]
        raise SystemExit(f"mutmut failed on {target.module} (see {log}):\n" + "\n".join(tail))
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    functions = _functions(work / "mutants" / target.path)
    outcomes: list[Outcome] = []
    rerun: list[tuple[str, str, str, str]] = []
    for name, code in sorted(codes.items()):
        local = name.rpartition(".")[2]
        mangled = local.partition("__mutmut_")[0]
        function = function_of(name)
        plain_name = function.rpartition(".")[2]
        orig_name = mangled + "__mutmut_orig"
        original = _plain(functions.get(orig_name, ""), orig_name, plain_name)
        mutant = _plain(functions.get(local, ""), local, plain_name)
        diff = _diff(original, mutant)
        key = diff_key(function, diff)
        if code in _KILLED_CODES:
            outcomes.append(Outcome(name, key, "killed", diff))
        else:
            kind = "message-only" if message_only(original, mutant) else "real"
            rerun.append((name, key, diff, kind))
    # The second look: the mutant alive after mutmut's run, all covering files, fresh process.
    mutants_dir = work / "mutants"

    def again(item: tuple[str, str, str, str]) -> Outcome:
        name, key, diff, kind = item
        if deadline is not None and time.monotonic() > deadline:
            raise _OverBudget  # checked before each re-run: a phase of hundreds of them
        rc = _pytest(mutants_dir, tests, _env(MUTANT_UNDER_TEST=name), timeout)
        if rc != 0:
            return Outcome(name, key, "killed", diff, f"killed on the re-run (rc {rc})")
        return Outcome(name, key, kind, diff)  # type: ignore[arg-type]

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes.extend(pool.map(again, rerun))
    summary = f"mutmut: {len(codes)} mutants, {len(rerun)} re-run"
    return outcomes, summary


def _constants_pass(
    target: Target,
    work: Path,
    tests: list[str],
    jobs: int,
    timeout: float,
    deadline: float | None,
) -> list[Outcome]:
    source = (ROOT / target.path).read_text()
    mutants = constant_mutants(source)
    copies = [work / f"constants-{i}" for i in range(max(1, min(jobs, len(mutants))))]
    for copy in copies:
        _copy_tree(copy)
    free: list[Path] = list(copies)

    def one(index: int) -> Outcome:
        mutant = mutants[index]
        if deadline is not None and time.monotonic() > deadline:
            raise _OverBudget
        copy = free.pop()
        try:
            module = copy / target.path
            module.write_text(mutant.source)
            rc = _pytest(copy, tests, _env(), timeout)
            module.write_text(source)
        finally:
            free.append(copy)
        diff = f"line {mutant.line}: {mutant.target} = ... {mutant.before} ... -> {mutant.after}"
        name = f"{target.dotted}:constant_{index + 1}"
        key = f"<constant> {mutant.key}"
        if rc != 0:
            return Outcome(name, key, "killed", diff)
        return Outcome(name, key, "real", diff)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(copies)) as pool:
        return list(pool.map(one, range(len(mutants))))


def run_module(
    target: Target,
    scratch: Path,
    jobs: int,
    deadline: float | None = None,
    *,
    constants: bool = True,
) -> ModuleReport:
    """Both passes over one module, classified (see the module docstring); a module the
    ``deadline`` (a ``time.monotonic()`` value) interrupts is reported as not finished."""
    tests = [t for t in target.tests if (ROOT / t).exists()]
    if not tests:
        return ModuleReport(target.module, note="no covering test file")
    work = scratch / target.module.replace("/", "__")
    shutil.rmtree(work, ignore_errors=True)
    _copy_tree(work)
    start = time.monotonic()
    clean = _pytest(work, tests, _env(), 600)
    baseline = time.monotonic() - start
    if clean != 0:
        raise SystemExit(f"{target.module}: the covering tests fail unmutated (rc {clean})")
    timeout = max(60.0, 10 * baseline)
    try:
        outcomes, summary = _mutmut_pass(target, work, tests, jobs, timeout, deadline)
        if constants:
            outcomes.extend(_constants_pass(target, work, tests, jobs, timeout, deadline))
    except _OverBudget:
        _log(f"    stopped: over the budget after {time.monotonic() - start:.0f} s")
        return ModuleReport(target.module, note="not finished within the budget")
    equivalents = load_equivalents(EQUIVALENTS.read_text()) if EQUIVALENTS.exists() else []
    classified, stale = classify(target.module, outcomes, equivalents)
    report = ModuleReport(
        target.module, classified, stale, "" if constants else "no constants pass"
    )
    _log(f"    {summary}; {report.total} in all, {time.monotonic() - start:.0f} s")
    return report


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:  # no git at all: nothing to compare
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def changed_files() -> tuple[set[str] | None, str]:
    """Files the change touches, and against what.

    The base is the merge base with ``origin/main`` (or ``main``) when that is not HEAD
    itself, else the previous commit; a clone with a single commit (shallow or new) has
    nothing to compare against and returns None.  Uncommitted changes to tracked files
    count too.
    """
    head = _git("rev-parse", "--verify", "-q", "HEAD")
    if head is None:
        return None, "no commit"
    base = None
    for ref in ("origin/main", "main"):
        if _git("rev-parse", "--verify", "-q", ref) is not None:
            merge_base = _git("merge-base", "HEAD", ref)
            if merge_base is not None and merge_base != head:
                base = merge_base
                break
    if base is None:
        base = _git("rev-parse", "--verify", "-q", "HEAD~1")
    if base is None:
        return None, "a single commit (nothing to compare against)"
    names = _git("diff", "--name-only", base, "--")
    if names is None:
        return None, f"git diff against {base[:12]} failed"
    return {line for line in names.splitlines() if line}, f"changes since {base[:12]}"


def _select(args: argparse.Namespace) -> list[Target]:
    by_name = {t.module: t for t in MODULES}
    if args.changed:
        changed, against = changed_files()
        if changed is None:
            print(f"mutation: no base to compare with ({against}); nothing to run", file=sys.stderr)
            return []
        chosen = targets_touched(changed)
        print(f"mutation: {against}: {len(chosen)} pure module(s) touched", file=sys.stderr)
        return chosen
    if not args.modules:
        return list(MODULES)
    unknown = [m for m in args.modules if m.removeprefix("hami_trio/") not in by_name]
    if unknown:
        raise SystemExit(f"unknown module(s) {unknown}; known: {', '.join(by_name)}")
    return [by_name[m.removeprefix("hami_trio/")] for m in args.modules]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/mutation/run", description=__doc__.split("\n\n", 1)[0]
    )
    parser.add_argument("modules", nargs="*", help="modules below hami_trio/ (default: all)")
    parser.add_argument("--changed", action="store_true", help="only modules a change touches")
    parser.add_argument("--list", action="store_true", help="print the selection and stop")
    parser.add_argument("--jobs", type=int, default=1, help="parallel mutants (default 1)")
    parser.add_argument(
        "--budget",
        type=float,
        default=0,
        help="seconds for the whole run; a module not finished by then is reported, not failed",
    )
    parser.add_argument(
        "--no-constants", action="store_true", help="mutmut's pass only (a quicker look)"
    )
    parser.add_argument("--show", action="store_true", help="print every survivor's diff")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    parser.add_argument("--scratch", type=Path, help="work directory (default: a temp dir)")
    args = parser.parse_args(argv)
    targets = _select(args)
    if args.list:
        for target in targets:
            print(target.module)
        return 0
    if not targets:
        return 0
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="hami-trio-mutation-"))
    start = time.monotonic()
    deadline = start + args.budget if args.budget else None
    reports: list[ModuleReport] = []
    for target in targets:
        if deadline is not None and time.monotonic() > deadline:
            reports.append(ModuleReport(target.module, note="not reached within the budget"))
            continue
        _log(f"==> {target.module} ({', '.join(target.tests)})")
        reports.append(
            run_module(
                target, scratch, max(1, args.jobs), deadline, constants=not args.no_constants
            )
        )
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    failed = False
    for report in reports:
        for entry in report.stale:
            _log(f"stale equivalent entry ({report.module}): {entry.key}")
        for outcome in report.outcomes:
            if outcome.kind in ("message-only", "real") or (args.show and outcome.kind != "killed"):
                _log(f"\n-- {outcome.kind}: {outcome.name}\n   key: {outcome.key}")
                if outcome.note:
                    _log(f"   reason: {outcome.note}")
                _log(textwrap.indent(outcome.diff, "   "))
        failed = failed or bool(report.gaps)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "module": r.module,
                        "note": r.note,
                        "outcomes": [dataclasses.asdict(o) for o in r.outcomes],
                    }
                    for r in reports
                ],
                indent=1,
            )
        )
    print()
    print(render_table(reports))
    print(f"\n{time.monotonic() - start:.0f} s in all")
    return 1 if failed else 0
