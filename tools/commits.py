"""Commit message check: ``python -m tools.commits [--base REV] [--repo DIR]``.

Every commit in ``BASE..HEAD`` needs an imperative-looking subject of at most 72 characters
and, unless it is trivial, a body after a blank line (docs/testing.md, "Commit messages").
``BASE`` defaults to the commit the rule started at; a clone that does not have it as an
ancestor of ``HEAD`` (a shallow clone, another history) skips the check and says so.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The last commit before the rule: commits after it are checked.
BASE = "402fd27"
MAX_SUBJECT = 72
# A change of at most this many lines (added plus removed), or a merge, may go without a body.
TRIVIAL_LINES = 10

# An optional "room: " before the verb ("docs: add the coverage figure"); after it the verb
# may be lower case.
_PREFIX = re.compile(r"^[\w./-]+: ")
# Words that start a description, never an instruction.
_NOT_VERBS = frozenset({"a", "an", "the", "this", "these", "that", "its", "their", "our"})
# First words that read as a report, not an instruction, but end like one.
_NOT_REPORTS = frozenset(
    {"embed", "feed", "need", "seed", "shed", "speed", "bring", "ring", "string", "sing"}
)


@dataclass(frozen=True)
class Commit:
    sha: str
    message: str
    parents: int
    changed_lines: int | None  # None: a binary file changed (size unknown: not trivial)


def first_word_problem(subject: str) -> str | None:
    """Why the subject's first word does not look imperative, or None."""
    rest = _PREFIX.sub("", subject, count=1)
    word = rest.split(" ", 1)[0]
    lower = word.lower()
    prefixed = rest != subject
    letters = word.replace("-", "")  # "Type-check", "Re-read"
    if not letters.isalpha() or lower in _NOT_VERBS or not (prefixed or word[0].isupper()):
        return f"subject should start with a capitalised verb, not {word!r}"
    if lower in _NOT_REPORTS:
        return None
    if lower.endswith(("ed", "ing")):
        return f"subject should say what to do ({word!r} reads as a report)"
    if lower.endswith("s") and not lower.endswith(("ss", "us", "is")):
        return f"subject should say what to do ({word!r} reads as a report)"
    return None


def problems(commit: Commit) -> list[str]:
    """What is wrong with one commit's message (empty: nothing)."""
    lines = commit.message.strip("\n").split("\n")
    subject = lines[0]
    found: list[str] = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"subject is {len(subject)} characters (at most {MAX_SUBJECT})")
    if subject.endswith("."):
        found.append("subject ends with a full stop")
    if commit.parents < 2 and (word := first_word_problem(subject)) is not None:
        found.append(word)
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line between subject and body")
    has_body = any(line.strip() for line in lines[1:])
    trivial = commit.parents > 1 or (
        commit.changed_lines is not None and commit.changed_lines <= TRIVIAL_LINES
    )
    if not has_body and not trivial:
        found.append(
            f"no body: say why in a body (only a merge or a change of at most "
            f"{TRIVIAL_LINES} lines may go without one)"
        )
    return found


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )


def parse_log(text: str) -> list[Commit]:
    """Parse ``git log --numstat`` output in the format :func:`read_commits` asks for."""
    commits: list[Commit] = []
    for record in text.split("\x1e")[1:]:
        sha, parents, message, stat = record.split("\x00")
        changed: int | None = 0
        for line in stat.strip().splitlines():
            added, removed, _ = line.split("\t", 2)
            if added == "-" or changed is None:
                changed = None
            else:
                changed += int(added) + int(removed)
        commits.append(Commit(sha, message, len(parents.split()), changed))
    return commits


def read_commits(repo: Path, base: str) -> list[Commit] | None:
    """The commits in ``base..HEAD``, or None when ``base`` is not an ancestor of HEAD."""
    if _git(repo, "merge-base", "--is-ancestor", base, "HEAD").returncode != 0:
        return None
    log = _git(repo, "log", "--numstat", "--format=%x1e%H%x00%P%x00%B%x00", f"{base}..HEAD")
    if log.returncode != 0:
        raise RuntimeError(f"git log failed: {log.stderr.strip()}")
    return parse_log(log.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.commits", description=__doc__)
    parser.add_argument("--base", default=BASE, help=f"check BASE..HEAD (default {BASE})")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the repository")
    args = parser.parse_args(argv)
    commits = read_commits(args.repo, args.base)
    if commits is None:
        print(f"commit messages: {args.base} is not an ancestor of HEAD here: skipped")
        return 0
    failed = 0
    for commit in commits:
        found = problems(commit)
        if found:
            failed += 1
            subject = commit.message.split("\n", 1)[0]
            print(f"{commit.sha[:12]} {subject}")
            for problem in found:
                print(f"    {problem}")
    print(f"commit messages: {len(commits)} checked since {args.base}, {failed} to fix")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
