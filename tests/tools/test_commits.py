"""The commit message check: the rule on one message, and the check on a real repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.commits import MAX_SUBJECT, TRIVIAL_LINES, Commit, first_word_problem, main, problems

BODY = "Say why.\n\nWith figures."


def commit(message: str, *, parents: int = 1, changed: int | None = 50) -> Commit:
    return Commit("0" * 40, message, parents, changed)


@pytest.mark.parametrize(
    "subject",
    [
        "Answer 503 with Retry-After when the render queue is full",
        "Pass the deadline through",
        "Focus the soak on the attack",
        "docs: Add the coverage figure",
        "README: name tools/ and the mutation step",
        "Embed the layout table",
        "Bring the watch back on ERROR",
        "Type-check the tests with mypy --strict",
    ],
)
def test_imperative_subjects_pass(subject: str) -> None:
    assert first_word_problem(subject) is None
    assert problems(commit(f"{subject}\n\n{BODY}")) == []


@pytest.mark.parametrize(
    ("subject", "word"),
    [
        ("Added the coverage run", "'Added'"),
        ("Adds the coverage run", "'Adds'"),
        ("Fixing the lister", "'Fixing'"),
        ("Tests: the mutation tests follow the decoders", "'the'"),
        ("The decoders in one place", "'The'"),
        ("Watch: fixed the lister", "'fixed'"),
        ("add the coverage run", "'add'"),
        ("2 fixes", "'2'"),
    ],
)
def test_report_like_subjects_fail(subject: str, word: str) -> None:
    found = problems(commit(f"{subject}\n\n{BODY}"))
    assert len(found) == 1
    assert word in found[0]


def test_subject_length_bound() -> None:
    at = "Pin " + "x" * (MAX_SUBJECT - 4)
    assert problems(commit(f"{at}\n\n{BODY}")) == []
    assert problems(commit(f"{at}x\n\n{BODY}")) == [
        f"subject is {MAX_SUBJECT + 1} characters (at most {MAX_SUBJECT})"
    ]


def test_full_stop_and_missing_blank_line() -> None:
    assert problems(commit(f"Pin the bound.\n\n{BODY}")) == ["subject ends with a full stop"]
    assert problems(commit(f"Pin the bound\n{BODY}")) == ["no blank line between subject and body"]


def test_body_needed_unless_trivial() -> None:
    assert problems(commit("Pin the bound\n", changed=TRIVIAL_LINES)) == []
    assert problems(commit("Merge branch 'ci6'\n", parents=2, changed=900)) == []
    for changed in (TRIVIAL_LINES + 1, None):  # None: a binary file changed
        [found] = problems(commit("Pin the bound\n", changed=changed))
        assert found.startswith("no body")
    assert problems(commit("Pin the bound\n\n\n", changed=500))[0].startswith("no body")


def test_merge_subject_need_not_be_imperative() -> None:
    assert problems(commit("Merged the branch\n", parents=2)) == []


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def add_commit(repo: Path, message: str, lines: int) -> str:
    path = repo / "f.txt"
    old = path.read_text() if path.exists() else ""
    path.write_text(old + "line\n" * lines)
    (repo / "blob.bin").write_bytes(b"\0" * (len(old) + 1))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def test_checks_the_commits_after_base_in_a_real_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git(tmp_path, "init", "-q")
    base = add_commit(tmp_path, "fixed everything, added everything", 500)  # before: not checked
    good = add_commit(tmp_path, f"Pin the bound\n\n{BODY}", 20)
    assert main(["--repo", str(tmp_path), "--base", base]) == 0
    assert capsys.readouterr().out.endswith(f"1 checked since {base}, 0 to fix\n")

    bad = add_commit(tmp_path, "Fixed the bound", 20)
    assert main(["--repo", str(tmp_path), "--base", base]) == 1
    out = capsys.readouterr().out
    assert f"{bad[:12]} Fixed the bound" in out
    assert good[:12] not in out
    assert "no body" in out  # a binary file changed too: never trivial
    assert out.endswith(f"2 checked since {base}, 1 to fix\n")


def test_skips_when_base_is_not_an_ancestor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git(tmp_path, "init", "-q")
    add_commit(tmp_path, "bad", 500)
    assert main(["--repo", str(tmp_path), "--base", "402fd27"]) == 0
    assert "not an ancestor of HEAD here: skipped" in capsys.readouterr().out
