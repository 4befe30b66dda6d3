"""The constants pass: mutants of module- and class-level constants, which mutmut 3 skips.

How this works: mutmut 3 mutates only code inside functions (it swaps whole functions through
a trampoline), so ``MAX_ENTRIES: Final = 512`` or an enum member's value is never changed by
it.  :func:`constant_mutants` walks every assignment at module level and in class bodies
(nested classes included, functions never) and makes one mutant per literal in its value, the
way mutmut mutates literals: an ``int`` or ``float`` plus one, a ``bool`` negated, a ``str``
or ``bytes`` wrapped in ``XX``.  ``__all__``, ``__slots__`` and ``__match_args__`` are left
alone (names, not behaviour), and so are the literals of f-strings.  Each mutant is the whole
module's source with that one literal replaced; the caller runs the covering tests against it.
Pure: source text in, mutants out.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["ConstantMutant", "constant_mutants", "mutate_literal"]

_SKIPPED_TARGETS = frozenset({"__all__", "__slots__", "__match_args__"})


@dataclass(frozen=True, slots=True)
class ConstantMutant:
    """One changed literal: ``key`` names it stably (``target: before -> after``, with an
    occurrence number when the same literal appears more than once in one target)."""

    target: str
    before: str
    after: str
    occurrence: int
    line: int
    source: str

    @property
    def key(self) -> str:
        suffix = f" #{self.occurrence + 1}" if self.occurrence else ""
        return f"{self.target}: {self.before} -> {self.after}{suffix}"


def mutate_literal(value: object) -> object | None:
    """The mutated literal, or None when mutmut has no mutation for it (None, Ellipsis)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str):
        return "XX" + value + "XX"
    if isinstance(value, bytes):
        return b"XX" + value + b"XX"
    return None


def _targets(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names: list[str] = []
    for target in targets:
        names.extend(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        names.extend(n.attr for n in ast.walk(target) if isinstance(n, ast.Attribute))
    return names


def _literals(value: ast.expr) -> list[ast.Constant]:
    """The literal nodes of an expression, in source order, f-string parts excluded."""
    inside_fstrings = {
        id(part)
        for node in ast.walk(value)
        if isinstance(node, ast.JoinedStr)
        for part in ast.walk(node)
    }
    found = [
        node
        for node in ast.walk(value)
        if isinstance(node, ast.Constant) and id(node) not in inside_fstrings
    ]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _assignments(body: list[ast.stmt], prefix: str) -> list[tuple[str, ast.expr]]:
    found: list[tuple[str, ast.expr]] = []
    for statement in body:
        if isinstance(statement, ast.ClassDef):
            found.extend(_assignments(statement.body, f"{prefix}{statement.name}."))
        elif isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            names = _targets(statement)
            if not names or set(names) & _SKIPPED_TARGETS:
                continue
            found.append((prefix + ",".join(names), statement.value))
        elif isinstance(statement, ast.If | ast.Try):
            # Constants defined under a module-level condition (rare, but keep them).
            found.extend(_assignments(statement.body, prefix))
            found.extend(_assignments(statement.orelse, prefix))
    return found


def _offsets(source: str) -> list[int]:
    """Character offset of the start of each line (index 0 is line 1)."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _char_column(line: str, byte_column: int) -> int:
    """ast's col_offset counts UTF-8 bytes; convert it to a character index in ``line``."""
    return len(line.encode("utf-8")[:byte_column].decode("utf-8"))


def constant_mutants(source: str) -> list[ConstantMutant]:
    """Every constant mutant of one module's source (see the module docstring)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    starts = _offsets(source)
    mutants: list[ConstantMutant] = []
    for target, value in _assignments(tree.body, ""):
        seen: dict[str, int] = {}
        for node in _literals(value):
            mutated = mutate_literal(node.value)
            if mutated is None:
                continue
            assert node.end_lineno is not None
            assert node.end_col_offset is not None
            start = starts[node.lineno - 1] + _char_column(lines[node.lineno - 1], node.col_offset)
            end = starts[node.end_lineno - 1] + _char_column(
                lines[node.end_lineno - 1], node.end_col_offset
            )
            before = repr(node.value)
            occurrence = seen.get(before, 0)
            seen[before] = occurrence + 1
            mutants.append(
                ConstantMutant(
                    target=target,
                    before=before,
                    after=repr(mutated),
                    occurrence=occurrence,
                    line=node.lineno,
                    source=source[:start] + repr(mutated) + source[end:],
                )
            )
    return mutants
