"""The ``hami-trio`` command line.

Each command lives in its own module (``hami_trio/cli/<command>.py``), which exposes
``register(subparsers)``; this module only assembles them, runs the chosen one and turns
expected errors into one clear line and an exit status: 0 success; 1 the command ran and
failed (:class:`~hami_trio.errors.HamiTrioError`, or an :class:`OSError` on a path it was
given, named with its flag by :mod:`hami_trio.cli.failure`, also inside an exception group);
2 bad usage or configuration (argparse errors, :class:`~hami_trio.errors.ConfigError`; a bad
value of a subcommand prints that subcommand's usage).  The exit statuses:
docs/operations.md.  A command function takes the parsed ``argparse.Namespace`` and returns
the exit status.  A run imports only the module of the command it names (:data:`COMMANDS`);
``--help``, no command or an unknown one build the full parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, cast

from hami_trio._version import __version__
from hami_trio.cli.failure import Parser, describe, path_values

__all__ = ["COMMANDS", "IMAGE_INFO", "build_parser", "image_lines", "main"]

CommandFunc = Callable[[argparse.Namespace], int]
#: A command's ``paths`` default: ``(flag, path)`` of every path it uses.
PathsFunc = Callable[[argparse.Namespace], list[tuple[str, str]]]

# Modules that contribute subcommands, in the order they appear in --help.
_COMMAND_MODULES: tuple[str, ...] = (
    "hami_trio.cli.run",
    "hami_trio.cli.broker",
    "hami_trio.cli.hostpid",
    "hami_trio.cli.allocate",
    "hami_trio.cli.monitor",
    "hami_trio.cli.status",
    "hami_trio.cli.demo",
)
#: The module that registers each command (tests/cli/test_main.py checks it against the full
#: parser): a run of one command imports only its module, so ``hami-trio hostpid`` or
#: ``hami-trio allocate`` does not load the agent.
COMMANDS: Final[Mapping[str, str]] = {
    "run": "hami_trio.cli.run",
    "broker": "hami_trio.cli.broker",
    "hostpid": "hami_trio.cli.hostpid",
    "prepare-lock-dir": "hami_trio.cli.allocate",
    "allocate": "hami_trio.cli.allocate",
    "inspect": "hami_trio.cli.monitor",
    "monitor": "hami_trio.cli.monitor",
    "status": "hami_trio.cli.status",
    "demo": "hami_trio.cli.demo",
}


class _Registrar(Protocol):
    # Any: the parsers are Parsers (a subcommand takes its parent's class); the modules'
    # register functions are typed for any ArgumentParser.
    def register(self, subparsers: argparse._SubParsersAction[Any]) -> None:
        """Add this module's subcommands; each sets ``func`` with ``set_defaults``."""


#: Where deploy/Dockerfile writes its OCI labels (version, revision, source, base) in the image.
IMAGE_INFO: Final = "/usr/share/hami-trio/image.json"


def image_lines(path: str = IMAGE_INFO) -> list[str]:
    """What the image's labels say, as ``version`` prints it; nothing outside the image."""
    import json

    try:
        with open(path, encoding="utf-8") as file:
            info = json.load(file)
    except (OSError, ValueError):
        return []
    if not isinstance(info, dict):
        return []
    fields = ("version", "revision", "source", "base")
    return [f"image {field} {info.get(field, 'unknown')}" for field in fields]


def _cmd_version(args: argparse.Namespace) -> int:
    """Print hami-trio's version, its image's labels when it runs in the image, and the
    versions of the libraries it runs on (for bug reports)."""
    from importlib import metadata

    print(f"hami-trio {__version__}")
    for line in image_lines():
        print(line)
    print(f"python {sys.version.split()[0]}")
    for dist in ("trio", "prometheus-client", "kubernetes-asyncio", "trio-asyncio", "h11"):
        try:
            print(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            print(f"{dist} not installed")
    return 0


def build_parser(command: str | None = None) -> Parser:
    """The full parser with every feature's subcommands.

    Args:
        command: ``version`` or a name of :data:`COMMANDS`: only the module of that command
            registers (the others' commands are then absent); None: every module.
    """
    parser = Parser(
        prog="hami-trio",
        description="Node agent for HAMi GPU sharing: host PID broker, vGPU monitor, metrics.",
    )
    parser.add_argument("--version", action="version", version=f"hami-trio {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = subparsers.choices
    version = subparsers.add_parser("version", help="print versions of hami-trio and its libraries")
    version.set_defaults(func=_cmd_version)
    if command is None:
        modules = _COMMAND_MODULES
    else:
        modules = () if command == "version" else (COMMANDS[command],)
    for name in modules:
        cast(_Registrar, importlib.import_module(name)).register(subparsers)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, if it is ``version`` or one of :data:`COMMANDS`; None for
    anything else (no command, ``--help`` before it, a typo), which the full parser handles."""
    for arg in argv:
        if arg in ("-h", "--help", "--version"):
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS or arg == "version" else None
    return None


_TOP_LEVEL_OPTIONS: Final = frozenset({"-h", "--help", "--version"})


def _parse(parser: Parser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; an unknown option is named (before the command: not "COMMAND is
    required"; after it: with the subcommand's usage, not the top level's)."""
    for arg in argv:
        if not arg.startswith("-"):
            break
        if arg.split("=", 1)[0] not in _TOP_LEVEL_OPTIONS:
            parser.error(f"unrecognized arguments: {arg}")
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _given_paths(parser: Parser, args: argparse.Namespace) -> list[tuple[str, str]]:
    """The paths an error is matched against: the command's own list (``set_defaults(paths=
    ...)``: derived defaults too, e.g. the broker's lock), then its path flags' values."""
    own = cast("PathsFunc | None", getattr(args, "paths", None))
    listed = [] if own is None else own(args)
    return listed + path_values(parser.commands[args.command], args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hami-trio`` console script; returns the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(_command_of(argv))
    args = _parse(parser, argv)
    func = cast(CommandFunc, args.func)
    try:
        return func(args)
    except Exception as exc:
        failure = describe(exc, _given_paths(parser, args))
        if failure is None:
            raise
        print(f"hami-trio {args.command}: {failure.line}", file=sys.stderr)
        return failure.status


if __name__ == "__main__":
    sys.exit(main())
