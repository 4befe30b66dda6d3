"""The README opens with two commands; CI must run the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)[:2]


def test_readme_starts_with_two_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert all("\n" not in c and c.startswith("python3 -m venv .venv") for c in commands)


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci.splitlines()


def test_readme_names_every_package_ci_installs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    installed = set(re.search(r"for pkg in ([\w ]+); do", ci).group(1).split())  # type: ignore[union-attr]
    installed |= set(re.findall(r"apt-get download (\w+)", ci))
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("apt-get install "))
    assert installed | {"gcc", "make"} <= set(line.split()[2:])
    assert "podman rmi" in readme
    assert "/tmp/pytest-of-" in readme


def test_readme_lists_every_command() -> None:
    from hami_trio.cli.main import COMMANDS

    readme = (ROOT / "README.md").read_text()
    for command in (*COMMANDS, "version"):
        assert f"`hami-trio {command}" in readme, command
