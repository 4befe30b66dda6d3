"""Survivors sorted and counted: the reviewed equivalents, message-only changes, the table.

How this works: every mutant of a run ends up as an :class:`Outcome` (killed or survived,
with a key that names the change stably: ``function: removed line -> added line`` for
mutmut's, ``target: before -> after`` for the constants pass).  A survivor whose key is in
the reviewed list (``tools/mutation/equivalent.toml``) is *equivalent*: no test can tell it
from the original, and the list says why in one line.  Any other survivor is a gap: it is
*message-only* when the mutant differs from the original only in the text of what a
``raise`` raises (:func:`message_only`), else *real*.  Both kinds count as failures of the
run.  Pure: no files, no processes (the caller reads the list and runs the tests).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Equivalent",
    "ModuleReport",
    "Outcome",
    "diff_key",
    "function_of",
    "load_equivalents",
    "message_only",
    "render_table",
]

Kind = Literal["killed", "equivalent", "message-only", "real"]


@dataclass(frozen=True, slots=True)
class Equivalent:
    """One reviewed equivalent mutant: where, which change, and why no test can see it."""

    module: str
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """One mutant's result; ``diff`` is what a reader needs to see the change."""

    name: str
    key: str
    kind: Kind
    diff: str = ""
    note: str = ""


@dataclass(slots=True)
class ModuleReport:
    """A module's outcomes, and the reviewed entries no mutant matched (stale entries)."""

    module: str
    outcomes: list[Outcome] = field(default_factory=list)
    stale: list[Equivalent] = field(default_factory=list)
    note: str = ""

    def count(self, kind: Kind) -> int:
        return sum(1 for outcome in self.outcomes if outcome.kind == kind)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def gaps(self) -> list[Outcome]:
        """Survivors that are not reviewed equivalents (the run fails while there are any)."""
        return [o for o in self.outcomes if o.kind in ("message-only", "real")]

    @property
    def score(self) -> float:
        """Killed over all mutants, in percent (100 for a module without mutants)."""
        return 100.0 * self.count("killed") / self.total if self.total else 100.0


def load_equivalents(text: str) -> list[Equivalent]:
    """Read the reviewed list: ``[[equivalent]]`` tables with module, key and reason.

    Raises:
        ValueError: an entry lacks a field, has an empty reason, or is listed twice.
    """
    data = tomllib.loads(text)
    entries: list[Equivalent] = []
    seen: set[tuple[str, str]] = set()
    for index, raw in enumerate(data.get("equivalent", [])):
        try:
            entry = Equivalent(str(raw["module"]), str(raw["key"]), str(raw["reason"]).strip())
        except KeyError as exc:
            raise ValueError(f"equivalent entry {index}: missing {exc.args[0]!r}") from None
        if not entry.reason:
            raise ValueError(f"equivalent entry {index} ({entry.key}): empty reason")
        if (entry.module, entry.key) in seen:
            raise ValueError(f"equivalent entry {index} ({entry.key}): listed twice")
        seen.add((entry.module, entry.key))
        entries.append(entry)
    return entries


def function_of(mutant_name: str) -> str:
    """``pkg.mod.xǁCǁm__mutmut_3`` -> ``C.m``; ``pkg.mod.x_f__mutmut_1`` -> ``f``."""
    mangled = mutant_name.partition("__mutmut_")[0].rpartition(".")[2]
    if "ǁ" in mangled:
        _, class_name, method = mangled.split("ǁ", 2)
        return f"{class_name}.{method}"
    return mangled.removeprefix("x_")


def diff_key(function: str, diff: str) -> str:
    """A stable name for a mutmut mutant: its function and its changed lines, stripped.

    Line numbers and mutant numbers change whenever the module is edited; the changed text
    does not, so the reviewed list stays valid until the code it reviewed changes.
    """
    removed: list[str] = []
    added: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("---", "+++", "@@")):
            continue
        if line.startswith("-"):
            removed.append(" ".join(line[1:].split()))
        elif line.startswith("+"):
            added.append(" ".join(line[1:].split()))
    return f"{function}: {' / '.join(removed)} -> {' / '.join(added)}"


class _BlankRaisedText(ast.NodeTransformer):
    """Blank every string literal and f-string inside a ``raise`` statement."""

    def visit_Raise(self, node: ast.Raise) -> ast.Raise:
        return _BlankStrings().visit(node)  # type: ignore[no-any-return]


class _BlankStrings(ast.NodeTransformer):
    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.Constant:
        return ast.Constant("")

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return ast.Constant("") if isinstance(node.value, str) else node


def _shape(code: str) -> str:
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.name = "f"
    return ast.dump(_BlankRaisedText().visit(tree))


def message_only(original: str, mutant: str) -> bool:
    """True when two functions differ only in the text a ``raise`` raises."""
    try:
        return _shape(original) == _shape(mutant) and original != mutant
    except SyntaxError:
        return False


def classify(
    module: str, survivors: Iterable[Outcome], equivalents: Sequence[Equivalent]
) -> tuple[list[Outcome], list[Equivalent]]:
    """Mark reviewed survivors equivalent; returns the outcomes and the unmatched entries."""
    reviewed = {e.key: e for e in equivalents if e.module == module}
    used: set[str] = set()
    out: list[Outcome] = []
    for outcome in survivors:
        entry = reviewed.get(outcome.key)
        if outcome.kind != "killed" and entry is not None:
            used.add(entry.key)
            out.append(Outcome(outcome.name, outcome.key, "equivalent", outcome.diff, entry.reason))
        else:
            out.append(outcome)
    stale = [entry for key, entry in reviewed.items() if key not in used]
    return out, stale


def render_table(reports: Sequence[ModuleReport], notes: Mapping[str, str] | None = None) -> str:
    """The markdown table: module | mutants | killed | score | survivors (eq / msg / real)."""
    lines = [
        "| module | mutants | killed | score | survivors: equivalent / message-only / real |",
        "|---|---|---|---|---|",
    ]
    for report in reports:
        note = (notes or {}).get(report.module) or report.note
        survivors = (
            f"{report.count('equivalent')} / {report.count('message-only')} / "
            f"{report.count('real')}"
        )
        if note:
            survivors += f" ({note})"
        lines.append(
            f"| {report.module} | {report.total} | {report.count('killed')} | "
            f"{report.score:.1f} % | {survivors} |"
        )
    return "\n".join(lines)
