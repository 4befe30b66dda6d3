"""Every command, every path flag, an unusable path: one line naming the flag, never a traceback.

The walk runs ``python -m hami_trio`` as a real process for each path-taking flag of each
command (the table below must list all of them, checked against the parser) with two kinds of
unusable path: one below a regular file (``ENOTDIR``, for any user) and, as root, one on a
read-only filesystem (a ``tmpfs`` mounted read-only in a private mount namespace, ``EROFS``
even for root).  A command either refuses with exactly one ``hami-trio CMD:`` line on stderr
naming the flag (exit 1 or 2), or - for a path it only reads and may legitimately find
missing - runs normally.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_trio.cli.failure import PATH_METAVARS, Parser, describe, path_actions, path_values
from hami_trio.cli.main import build_parser
from hami_trio.errors import AgentError, BrokerStartupError, ConfigError
from tests.sandbox import world_readable_dir

# -- the pure core -------------------------------------------------------------------------


def test_an_os_error_on_a_given_path_names_its_flag() -> None:
    error = OSError(errno.EROFS, "Read-only file system", "/ro/run")
    failure = describe(error, [("--socket-path", "/ro/run/broker.sock")])
    assert failure is not None
    assert failure.status == 1
    assert failure.line == (
        "--socket-path /ro/run/broker.sock: [Errno 30] Read-only file system: '/ro/run'"
    )


def test_the_closest_given_path_wins_and_a_path_below_a_directory_matches() -> None:
    error = FileNotFoundError(errno.ENOENT, "No such file or directory", "/demo/root/logs")
    given = [("--summary-json", "/demo/out.json"), ("--root", "/demo/root")]
    failure = describe(error, given)
    assert failure is not None
    assert failure.line.startswith("--root /demo/root: [Errno 2]")


def test_an_error_without_a_file_name_lists_the_given_paths() -> None:
    failure = describe(OSError(errno.EROFS, "Read-only file system"), [("--root", "/r")])
    assert failure is not None
    assert failure.line == "[Errno 30] Read-only file system (paths given: --root /r)"


def test_a_group_of_expected_errors_is_one_line_and_a_config_error_exits_2() -> None:
    group = ExceptionGroup(
        "nursery",
        [ExceptionGroup("inner", [ConfigError("--interval: bad")]), OSError(errno.EIO, "I/O")],
    )
    failure = describe(group, [])
    assert failure is not None
    assert failure.status == 2
    assert failure.line == "--interval: bad; [Errno 5] I/O"


def test_an_agent_task_failing_on_a_path_names_the_task_and_the_flag() -> None:
    error = AgentError("broker", "broker failed to start: OSError: EROFS", started=False)
    error.__cause__ = OSError(errno.EROFS, "Read-only file system", "/ro/hostpid")
    failure = describe(error, [("--broker-socket-path", "/ro/hostpid/broker.sock")])
    assert failure is not None
    assert failure.line == (
        "broker failed to start: --broker-socket-path /ro/hostpid/broker.sock: [Errno 30] "
        "Read-only file system: '/ro/hostpid'"
    )


def test_a_refusal_starting_with_a_path_gets_its_flag_in_front() -> None:
    refusal = BrokerStartupError("/ro: cannot set mode 0711: Read-only file system")
    failure = describe(refusal, [("--socket-path", "/ro/broker.sock")])
    assert failure is not None
    assert failure.line == (
        "--socket-path /ro/broker.sock: /ro: cannot set mode 0711: Read-only file system"
    )
    named = BrokerStartupError("/ro/broker.sock: in use")
    assert describe(named, [("--socket-path", "/ro/broker.sock")]) == describe(
        BrokerStartupError("--socket-path /ro/broker.sock: in use"), []
    )


def test_anything_else_keeps_its_traceback() -> None:
    assert describe(ValueError("bug"), []) is None
    assert describe(ExceptionGroup("g", [OSError(1, "x"), KeyError("bug")]), []) is None


def test_path_values_are_the_path_metavars_given() -> None:
    parser = Parser()
    parser.add_argument("--out", metavar="PATH")
    parser.add_argument("--name", metavar="NAME")
    parser.add_argument("file", metavar="FILE")
    args = parser.parse_args(["--out", "/o", "--name", "/n", "/f"])
    assert path_values(parser, args) == [("--out", "/o"), ("", "/f")]


# -- the walk ------------------------------------------------------------------------------

#: Flags a command only reads, where a missing or unusable path is a state it reports (a
#: metric, the debug view), not a reason to stop: those runs must start and stop normally.
RUNS = "runs"
#: A flag that refuses: one ``hami-trio CMD:`` line naming the flag, exit 1 or 2.
REFUSES = "refuses"


@dataclass(frozen=True)
class Case:
    command: str
    flag: str
    expect: str
    #: The flag's value for this command's own base arguments (HOOK is the hook path, etc.).
    base: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    stdin: str | None = None
    #: The command creates or writes there (walked on a read-only filesystem too).
    writes: bool = False


_AGENT = ("--no-kubernetes", "--metrics-bind-address=127.0.0.1:0", "--debug-bind-address=off")
_BROKER_ON = (("LIBVGPU_HOSTPID_BROKER", "1"),)

WALK: tuple[Case, ...] = (
    *(
        c
        for command in ("run", "monitor")
        for c in (
            Case(command, "--hook-path", REFUSES, _AGENT),
            Case(command, "--kubeconfig", REFUSES, ("--node-name=n1", "--hook-path=HOOK")),
            Case(command, "--mig-lock-path", RUNS, (*_AGENT, "--hook-path=HOOK")),
            Case(command, "--lock-parent-path", RUNS, (*_AGENT, "--hook-path=HOOK")),
        )
    ),
    Case(
        "run",
        "--broker-socket-path",
        REFUSES,
        (*_AGENT, "--hook-path=HOOK"),
        _BROKER_ON,
        writes=True,
    ),
    Case(
        "run",
        "--broker-lock-path",
        REFUSES,
        (*_AGENT, "--hook-path=HOOK", "--broker-socket-path=SOCKET"),
        _BROKER_ON,
        writes=True,
    ),
    Case("broker", "--socket-path", REFUSES, writes=True),
    Case("broker", "--lock-path", REFUSES, ("--socket-path=SOCKET",), writes=True),
    Case("hostpid", "--socket-path", REFUSES, ("--ignore-switch",)),
    Case("inspect", "FILE", REFUSES),
    Case("prepare-lock-dir", "PATH", REFUSES, writes=True),
    Case("allocate", "--lock-parent", REFUSES, stdin="{}", writes=True),
    # The kubelet mounts it into the container; allocate only names it in the response.
    Case("allocate", "--broker-host-dir", RUNS, ("--lock-parent=LOCKS",), _BROKER_ON, "{}"),
    Case("demo", "--root", REFUSES, writes=True),
    Case("demo", "--summary-json", REFUSES, writes=True),
)


def _path_flags() -> set[tuple[str, str]]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for name, sub in subparsers.choices.items():
        for action in path_actions(sub):
            label = max(action.option_strings, key=len) if action.option_strings else name
            found.add((name, label if action.option_strings else str(action.metavar)))
    return found


def test_the_walk_covers_every_path_flag_of_every_command() -> None:
    assert {(c.command, c.flag) for c in WALK} == _path_flags()


def test_every_flag_that_takes_a_path_has_a_path_metavar() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if action.type is Path or (action.dest or "").endswith(("_path", "_dir")):
                assert action.metavar in PATH_METAVARS, (name, action.dest)


@dataclass
class Places:
    """The fixed paths of a walk, and where the unusable path goes."""

    base: Path
    bad: Path

    def arg(self, text: str) -> str:
        return (
            text.replace("HOOK", str(self.base / "hook"))
            .replace("SOCKET", str(self.base / "sock" / "broker.sock"))
            .replace("LOCKS", str(self.base / "locks"))
        )


@pytest.fixture
def places() -> Iterator[Path]:
    with world_readable_dir("ht-walk-") as base:
        (base / "hook" / "containers").mkdir(parents=True)
        (base / "a-file").write_text("not a directory\n")
        yield base


def _argv(case: Case, places: Places) -> list[str]:
    argv = [case.command, *(places.arg(a) for a in case.base)]
    bad = str(places.bad / ("x.json" if case.flag == "--summary-json" else "x"))
    if case.flag.startswith("--"):
        return [*argv, f"{case.flag}={bad}"]
    return [*argv, bad]


def _run(prefix: list[str], case: Case, places: Places) -> tuple[int, str]:
    """Run the command; a ``RUNS`` case is stopped with SIGTERM once it is up."""
    env = {k: v for k, v in os.environ.items() if k != "LIBVGPU_HOSTPID_BROKER"}
    env |= dict(case.env)
    err = places.base / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "hami_trio", *_argv(case, places)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            text=True,
            start_new_session=True,
        )
    try:
        assert proc.stdin is not None
        proc.stdin.write(case.stdin or "")
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if case.expect == RUNS and "agent ready" in err.read_text():
                os.killpg(proc.pid, signal.SIGTERM)
                break
            time.sleep(0.05)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, err.read_text()


def _check(case: Case, code: int, stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    ours = [line for line in stderr.splitlines() if line.startswith("hami-trio ")]
    if case.expect == RUNS:
        assert code == 0, stderr
        assert ours == [], stderr
        return
    assert code in (1, 2), stderr
    assert len(ours) == 1, stderr
    assert ours[0].startswith(f"hami-trio {case.command}: "), stderr
    # A positional is named by its value (the command line shows which argument it is).
    assert case.flag in ours[0] if case.flag.startswith("--") else "/x" in ours[0], stderr


def _id(case: Case) -> str:
    return f"{case.command} {case.flag}"


@pytest.mark.parametrize("case", WALK, ids=_id)
def test_a_path_below_a_regular_file(case: Case, places: Path) -> None:
    where = Places(places, places / "a-file")
    _check(case, *_run([], case, where))


#: Mounts a read-only tmpfs on "$0" (in the private mount namespace) and runs the command.
_READ_ONLY = 'mount -t tmpfs -o ro,mode=0755 tmpfs "$0" && exec "$@"'


@pytest.mark.root
@pytest.mark.parametrize("case", [c for c in WALK if c.writes], ids=_id)
def test_a_path_on_a_read_only_filesystem(case: Case, places: Path) -> None:
    read_only = places / "ro"
    read_only.mkdir()
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _READ_ONLY]
    prefix.append(str(read_only))
    where = Places(places, read_only)
    _check(case, *_run(prefix, case, where))
