"""The docs speak to operators: no references a reader cannot follow, samples the code prints.

A reference a reader of this repository cannot follow - an issue number of the project's own
tracker, a requirement number, a design document that is not in the repository - is refused in
docs/, the READMEs and every command's ``--help``; an upstream issue is named with its URL.
Samples that the code can generate are compared with what it prints: the demo's live table
and the status table headers, and every ``hami-trio CMD [...]`` usage line.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hami_trio.agent.status import format_status
from hami_trio.cli.main import build_parser
from hami_trio.demo.view import render_frame
from tests.demo.test_report import good_record

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "bench" / "README.md"]

#: What a reader cannot follow.  An upstream issue ("HAMi issue 1662") is allowed in the
#: Markdown only as a link to it.
INTERNAL = {
    "an issue of this project": re.compile(r"(?<!HAMi )(?<!HAMi-core )\b[Ii]ssues? #?\d+"),
    "a requirement number": re.compile(r"\bSPEC\b|\bV#\d+|\b[A-Z]-\d+\b(?!\w)"),
    "a design document outside the repository": re.compile(
        r"\(seed\b|\bseed,? section|UPSTREAM\.md|SPEC\.md|USERS\.md|STYLE\.md|LAYOUT\.md"
    ),
}
_UPSTREAM = re.compile(r"\[?(HAMi(?:-core)? issue (\d+))(\]\(https://github\.com/[^)]*/\2\))?")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _texts() -> list[tuple[str, str]]:
    texts = [(str(p.relative_to(ROOT)), p.read_text()) for p in DOCS]
    for name, sub in _subparsers(build_parser()).items():
        texts.append((f"hami-trio {name} --help", sub.format_help()))
    return texts


@pytest.mark.parametrize(("what", "pattern"), list(INTERNAL.items()))
def test_no_internal_references(what: str, pattern: re.Pattern[str]) -> None:
    found = [
        f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for where, text in _texts()
        for m in pattern.finditer(text)
    ]
    assert found == [], f"{what}: {found}"


def test_upstream_issues_are_links() -> None:
    unlinked = [
        f"{p.name}: {m.group(1)}"
        for p in DOCS
        for m in _UPSTREAM.finditer(p.read_text())
        if m.group(3) is None
    ]
    assert unlinked == []


def test_the_patterns_catch_what_they_are_for() -> None:
    for sample in ("issue 15's targets", "(issue 3)", "V#130", "(seed, section 7)", "SPEC B-3"):
        assert any(p.search(sample) for p in INTERNAL.values()), sample
    assert not any(p.search("HAMi issue 1662 and HAMi-core issue 243") for p in INTERNAL.values())


def _block_after(text: str, marker: str) -> list[str]:
    start = text.index("```\n", text.index(marker)) + 4
    return text[start : text.index("\n```", start)].splitlines()


def test_demo_sample_table_header_is_what_the_demo_prints() -> None:
    sample = _block_after((ROOT / "docs" / "demo.md").read_text(), "## What you see")
    printed = render_frame(good_record(), None, 0.0)
    header = next(line for line in printed if line.startswith("CONTAINER"))
    assert header in sample


def test_status_sample_header_and_summary_are_what_status_prints() -> None:
    text = (ROOT / "docs" / "debug.md").read_text()
    sample = _block_after(text, "From the demo (`hami-trio demo")
    document = {
        "node": "vm",
        "version": "0.1.0",
        "monitor": {"ticks": 1, "interval_seconds": 0.2},
        "pods": {"source": "static"},
        "broker": None,
        "containers": [{"namespace": "", "pod_uid": "u", "container": "c", "devices": []}],
    }
    printed = format_status(document).splitlines()
    header = next(line for line in printed if line.startswith("CONTAINER"))
    shown = next(line for line in sample if line.startswith("CONTAINER"))
    assert shown.split() == header.split()
    assert sample[0] == printed[0]
    # Every row has a value for BLOCKED and PROCS (the view knows them; "?" is "not known").
    rows = [line.split() for line in sample if line.startswith("-/")]
    assert rows
    assert all(row[7] in ("no", "yes") for row in rows), rows
    assert all("?" not in row[8] for row in rows), rows


def _usage(parser: argparse.ArgumentParser) -> str:
    text = " ".join(parser.format_usage().split())
    return text.removeprefix("usage: ").replace(" [-h]", "")


def test_usage_lines_in_the_docs_are_the_commands_own() -> None:
    usages = {f"hami-trio {n}": _usage(p) for n, p in _subparsers(build_parser()).items()}
    found = 0
    for path in DOCS:
        for line in re.findall(r"`(hami-trio [a-z-]+ \[[^`]*)`", path.read_text()):
            command = " ".join(line.split()[:2])
            assert line == usages[command], path.name
            found += 1
    assert found >= 2
