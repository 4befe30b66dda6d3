"""The mutation tool's pure parts: the constants pass, survivor keys and classes, the table."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tools.mutation.constants import constant_mutants, mutate_literal
from tools.mutation.main import _functions
from tools.mutation.modules import MODULES, targets_touched
from tools.mutation.report import (
    Equivalent,
    ModuleReport,
    Outcome,
    classify,
    diff_key,
    function_of,
    load_equivalents,
    message_only,
    render_table,
)

SOURCE = '''\
"""Doc."""
from typing import Final
__all__ = ["LIMIT"]
LIMIT: Final = 64 * 1024
NAME = "caf\\u00e9"  # é
FLAGS = (True, b"HP", 1.5, None)
TEXT = f"{LIMIT} x"


class Kind:
    __slots__ = ("a",)
    A = 1

    class Inner:
        B = -2

    def method(self) -> int:
        return 7
'''


def test_mutate_literal_follows_mutmut() -> None:
    assert mutate_literal(True) is False
    assert mutate_literal(0) == 1
    assert mutate_literal(1.5) == 2.5
    assert mutate_literal("a") == "XXaXX"
    assert mutate_literal(b"a") == b"XXaXX"
    assert mutate_literal(None) is None


def test_constant_mutants_cover_module_and_class_literals_only() -> None:
    mutants = constant_mutants(SOURCE)
    assert [m.key for m in mutants] == [
        "LIMIT: 64 -> 65",
        "LIMIT: 1024 -> 1025",
        "NAME: 'café' -> 'XXcaféXX'",
        "FLAGS: True -> False",
        "FLAGS: b'HP' -> b'XXHPXX'",
        "FLAGS: 1.5 -> 2.5",
        "Kind.A: 1 -> 2",
        "Kind.Inner.B: 2 -> 3",
    ]
    for mutant in mutants:
        ast.parse(mutant.source)  # every mutant is valid Python
        assert mutant.source != SOURCE
    assert "LIMIT: Final = 65 * 1024" in mutants[0].source
    # Columns are counted in characters even after a non-ASCII literal on the line.
    assert "NAME = 'XXcaféXX'  # é" in mutants[2].source
    assert "B = -3" in mutants[7].source


def test_repeated_literals_are_numbered() -> None:
    keys = [m.key for m in constant_mutants("PAIR = (1, 1)\n")]
    assert keys == ["PAIR: 1 -> 2", "PAIR: 1 -> 2 #2"]


def test_function_names_of_mutmut_mutants() -> None:
    assert function_of("hami_trio.pods.allocated.x__number__mutmut_12") == "_number"
    assert function_of(
        "hami_trio.broker.protocol.x\u01c1Response\u01c1__post_init____mutmut_3"
    ) == ("Response.__post_init__")


def test_diff_key_is_the_changed_text_without_numbers() -> None:
    diff = "--- original\n+++ mutant\n@@ -1,3 +1,3 @@\n def f():\n-    return  a  > 1\n"
    diff += "+    return a >= 1\n"
    assert diff_key("f", diff) == "f: return a > 1 -> return a >= 1"


def test_message_only_sees_only_raised_text() -> None:
    original = 'def f(x):\n    if x:\n        raise ValueError(f"bad {x}")\n    return "ok"\n'
    reworded = original.replace('f"bad {x}"', '"XXbadXX"')
    returned = original.replace('"ok"', '"XXokXX"')
    assert message_only(original, reworded)
    assert not message_only(original, returned)
    assert not message_only(original, original.replace("if x", "if not x"))
    assert not message_only(original, original)


def test_equivalents_are_read_and_checked() -> None:
    text = '[[equivalent]]\nmodule = "m.py"\nkey = "f: a -> b"\nreason = "same"\n'
    assert load_equivalents(text) == [Equivalent("m.py", "f: a -> b", "same")]
    with pytest.raises(ValueError, match="empty reason"):
        load_equivalents(text.replace('"same"', '" "'))
    with pytest.raises(ValueError, match="listed twice"):
        load_equivalents(text + text)
    with pytest.raises(ValueError, match="missing 'reason'"):
        load_equivalents(text.replace('reason = "same"\n', ""))


def test_classify_and_table() -> None:
    outcomes = [
        Outcome("m1", "f: a -> b", "real"),
        Outcome("m2", "f: c -> d", "message-only"),
        Outcome("m3", "f: e -> f", "killed"),
    ]
    reviewed = [Equivalent("m.py", "f: a -> b", "same"), Equivalent("m.py", "g: x -> y", "old")]
    classified, stale = classify("m.py", outcomes, reviewed)
    assert [o.kind for o in classified] == ["equivalent", "message-only", "killed"]
    assert classified[0].note == "same"
    assert [e.key for e in stale] == ["g: x -> y"]
    report = ModuleReport("m.py", classified)
    assert [o.name for o in report.gaps] == ["m2"]
    assert render_table([report, ModuleReport("n.py", note="not reached")]).splitlines() == [
        "| module | mutants | killed | score | survivors: equivalent / message-only / real |",
        "|---|---|---|---|---|",
        "| m.py | 3 | 1 | 33.3 % | 1 / 1 / 0 |",
        "| n.py | 0 | 0 | 100.0 % | 0 / 0 / 0 (not reached) |",
    ]


def test_targets_touched_by_module_or_covering_test() -> None:
    assert targets_touched({"README.md", "hami_trio/agent/service.py"}) == []
    chosen = targets_touched({"hami_trio/goparse.py", "tests/pods/test_allocated.py"})
    assert [t.module for t in chosen] == ["goparse.py", "pods/allocated.py"]
    assert {t.module for t in MODULES} >= {"broker/protocol.py", "monitor/snapshot.py"}
    assert all(t.path.startswith("hami_trio/") and t.tests for t in MODULES)


def test_every_covering_test_file_and_module_exists() -> None:
    root = Path(__file__).resolve().parents[2]
    for target in MODULES:
        assert (root / target.path).is_file(), target.path
        for test in target.tests:
            assert (root / test).is_file(), test


def test_functions_are_cut_out_as_get_source_segment_cuts_them(tmp_path: Path) -> None:
    # The tool splits the rewritten module into lines once; each function's text must be
    # what ast.get_source_segment gives (the reviewed keys are made from it).
    source = (
        "def a(x):\r\n    return x  # kept? no: after the node\r\n"
        "class C:\n    async def b(self, y='é'):\n        z = (y,\n             1)\n"
        "        return z\n\n\x0cdef one(): return 1\n"
        "def last():\n    pass"
    )
    path = tmp_path / "m.py"
    path.write_bytes(source.encode())
    got = _functions(path)
    tree = ast.parse(path.read_text())
    want = {
        node.name: textwrap.dedent(
            " " * node.col_offset + (ast.get_source_segment(path.read_text(), node) or "")
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert got == want
    assert got["a"] == "def a(x):\n    return x"
    assert got["b"] == "async def b(self, y='é'):\n    z = (y,\n         1)\n    return z"
    assert got["one"] == "def one(): return 1"
    assert got["last"] == "def last():\n    pass"
