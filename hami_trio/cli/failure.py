"""One line for an expected failure of a command: which flag, which path, what the OS said.

How this works: :func:`main <hami_trio.cli.main.main>` hands every exception a command raises
to :func:`describe`.  An :class:`OSError` (a path the command could not create, open, chmod
or write), an :class:`~hami_trio.errors.AgentError` caused by one, or an exception group made
only of such errors and :class:`~hami_trio.errors.HamiTrioError` (what a trio nursery
raises) becomes one :class:`Failure`: the exit status and one line naming the flag and its
value whose path the error is about; a refusal of hami-trio's own that starts with the path it
is about gets the flag in front.  Anything else (a bug) is None and keeps its traceback.
Which flag a path belongs to (every path option has a metavar of :data:`PATH_METAVARS`):
docs/architecture.md (A failure on the command line).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from hami_trio.errors import AgentError, ConfigError, HamiTrioError

__all__ = [
    "PATH_METAVARS",
    "Failure",
    "Parser",
    "describe",
    "flagged",
    "path_actions",
    "path_values",
]

#: The metavars of path-taking flags and positionals; the error's path is matched against them.
PATH_METAVARS: Final = frozenset({"PATH", "DIR", "FILE"})


@dataclass(frozen=True, slots=True)
class Failure:
    """What the command line prints and returns for an expected failure."""

    status: int
    line: str


class Parser(argparse.ArgumentParser):
    """An argument parser that keeps what it was given where the error handling can read it
    (argparse keeps it only in private attributes): every :meth:`add_argument` action, and
    the subcommands' parsers once the top level sets :attr:`commands`.  A subcommand's
    parser takes its parent's class, so every parser of the command line is one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arguments: list[argparse.Action] = []  # before argparse adds -h
        self.commands: Mapping[str, argparse.ArgumentParser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action


def path_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The path-taking options and positionals of one (sub)command's :class:`Parser`."""
    if not isinstance(parser, Parser):
        raise TypeError(f"{parser.prog}: not a hami_trio.cli.failure.Parser")
    return [a for a in parser.arguments if a.metavar in PATH_METAVARS]


def _label(action: argparse.Action) -> str:
    """The longest option string; empty for a positional (the command line shows which)."""
    return max(action.option_strings, key=len) if action.option_strings else ""


def path_values(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    env: Mapping[str, str] | None = None,
    env_names: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """``(flag, path)`` for every path the command was given.

    Args:
        parser: the subcommand's parser.
        args: what it parsed.
        env: the environment (for flags that fall back to a variable).
        env_names: the variable of each destination that has one.
    """
    given: list[tuple[str, str]] = []
    for action in path_actions(parser):
        value = getattr(args, action.dest, None)
        label = _label(action)
        if value is None and env is not None and env_names is not None:
            name = env_names.get(action.dest)
            if name is not None and env.get(name):
                value, label = env[name], name
        if value is not None and str(value) != "":
            given.append((label, os.fspath(value)))
    return given


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _os_error(exc: BaseException) -> OSError | None:
    """The OS error ``exc`` is, or (an agent task's failure) is caused by."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, AgentError) and isinstance(exc.__cause__, OSError):
        return exc.__cause__
    return None


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _owner(filename: str, given: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """The given path the OS error's file name belongs to (the closest one)."""
    target = os.path.abspath(filename)
    best: tuple[int, tuple[str, str]] | None = None
    for label, value in given:
        path = os.path.abspath(value)
        if path == target:
            return label, value
        if _inside(path, target) or _inside(target, path):
            distance = abs(path.count("/") - target.count("/"))
            if best is None or distance < best[0]:
                best = (distance, (label, value))
    return None if best is None else best[1]


def _os_line(error: OSError, given: Sequence[tuple[str, str]], prefix: str = "") -> str:
    what = error.strerror or str(error)
    if error.errno is not None:
        what = f"[Errno {error.errno}] {what}"
    names = [os.fsdecode(n) for n in (error.filename, error.filename2) if n is not None]
    if names:
        shown = f"{what}: {names[0]!r}" + (f" -> {names[1]!r}" if len(names) > 1 else "")
        owner = _owner(names[0], given)
        if owner is not None and owner[0]:
            return f"{prefix}{owner[0]} {owner[1]}: {shown}"
        return f"{prefix}{shown}"
    if given:
        listed = ", ".join(f"{f} {v}" if f else v for f, v in given)
        return f"{prefix}{what} (paths given: {listed})"
    return f"{prefix}{what}"


def flagged(message: str, given: Sequence[tuple[str, str]]) -> str:
    """A refusal naming a path (``/run/x: not a directory``, ``unsafe_mode: /run: ...``) with
    the flag and value that path belongs to in front, unless the message names the flag."""
    for word in message.split():
        word = word.strip(":,;()'\"")
        if not word.startswith("/"):
            continue
        owner = _owner(word, given)
        if owner is None:
            continue
        label, value = owner
        if not label or label.split()[0] in message:
            return message
        if value in (w.strip(":,;()'\"") for w in message.split()):
            return message.replace(value, f"{label} {value}", 1)
        return f"{label} {value}: {message}"
    return message


def describe(exc: BaseException, given: Sequence[tuple[str, str]]) -> Failure | None:
    """The one line and exit status for an expected failure; None for anything else.

    Args:
        exc: what the command raised.
        given: ``(flag, path)`` the command was given (:func:`path_values`).
    """
    leaves = _leaves(exc)
    if not all(isinstance(leaf, (OSError, HamiTrioError)) for leaf in leaves):
        return None
    lines: list[str] = []
    status = 1
    for leaf in leaves:
        error = _os_error(leaf)
        if error is not None:
            prefix = ""
            if isinstance(leaf, AgentError):
                prefix = f"{leaf.task} {'failed' if leaf.started else 'failed to start'}: "
            line = _os_line(error, given, prefix)
        else:
            line = flagged(str(leaf), given)
            if isinstance(leaf, ConfigError):
                status = 2
        if line not in lines:
            lines.append(line)
    return Failure(status, "; ".join(lines))
