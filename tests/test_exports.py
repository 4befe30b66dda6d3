"""The package namespace re-exports the public API, all of it and nothing else.

Like trio's ``test_exports``: what a static tool reads from ``hami_trio/__init__.py`` (the
``__all__`` literal, the names its imports bind) must match what the package holds at run
time, and every exported object must be a public name of the module that defines it.  The
checker takes the module and its source as arguments, so the last test can show it failing.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import hami_trio

#: The rooms the package namespace may re-export from (docs/architecture.md).
PUBLIC_ROOMS = frozenset({"agent", "broker", "allocation", "errors", "goparse", "monitor"})
#: What the namespace binds for its own use: ``from __future__ import annotations`` and the
#: ``TYPE_CHECKING`` switch of its lazy re-exports.
_NOT_API = frozenset({"annotations", "TYPE_CHECKING"})


def _top_level(tree: ast.Module) -> Iterator[tuple[ast.stmt, bool]]:
    """Each top-level statement, and those under ``if TYPE_CHECKING:`` (flagged True)."""
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
        ):
            for inner in node.body:
                yield inner, True
        else:
            yield node, False


def _lazy_map(tree: ast.Module) -> dict[str, str]:
    """name -> module of the literal map handed to ``lazy_exports`` (empty if none)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.lstrip("_") == "lazy_exports"
        ):
            homes = ast.literal_eval(node.args[1])
            found.update({name: module for module, names in homes.items() for name in names})
    return found


def export_problems(module: types.ModuleType, source: str) -> list[str]:
    problems: list[str] = []
    tree = ast.parse(source)
    # Names bound only for the type checker must be exactly the ones loaded on first use.
    typing_only: dict[str, str] = {}
    lazy_map = _lazy_map(tree)
    static_all: list[str] | None = None
    bound: dict[str, str] = {}
    for node, lazy in _top_level(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            static_all = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom) and node.module not in (None, "__future__"):
            for alias in node.names:
                bound[alias.asname or alias.name] = str(node.module)
                if lazy:
                    typing_only[alias.asname or alias.name] = str(node.module)
    if static_all is None:
        return ["no literal __all__"]
    if typing_only != lazy_map:
        problems.append(
            "the TYPE_CHECKING imports and the lazy_exports map differ: "
            f"{sorted(set(typing_only.items()) ^ set(lazy_map.items()))}"
        )
    runtime_all = list(getattr(module, "__all__", []))
    if static_all != runtime_all:
        problems.append("__all__ at run time differs from the literal in the source")
    if len(set(static_all)) != len(static_all):
        problems.append("__all__ has duplicates")
    for name in static_all:
        problems += _name_problems(module, name, bound.get(name))
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value) or name in _NOT_API:
            continue
        if name not in static_all:
            problems.append(f"{name} is public in the namespace but not exported")
    return problems


def _name_problems(module: types.ModuleType, name: str, home: str | None) -> list[str]:
    """What is wrong with one exported ``name`` that an import from ``home`` binds."""
    if home is None:
        return [f"{name} is exported but no import statement binds it"]
    if not hasattr(module, name):
        return [f"{name} is exported but missing at run time"]
    problems: list[str] = []
    parts = home.split(".")
    if len(parts) > 1 and parts[1] not in PUBLIC_ROOMS and home != "hami_trio._version":
        problems.append(f"{name} comes from {home}, not a public room")
    home_module = importlib.import_module(home)
    if name != "__version__" and name not in getattr(home_module, "__all__", ()):
        problems.append(f"{name} is not in {home}.__all__ (re-exporting a private name)")
    if getattr(module, name) is not getattr(home_module, name, None):
        problems.append(f"{name} is not the object {home} defines")
    return problems


@pytest.mark.parametrize("package", ["hami_trio", "hami_trio.broker", "hami_trio.monitor"])
def test_the_namespace_exports_exactly_its_public_api(package: str) -> None:
    """The package namespace and the lazily re-exporting subpackages."""
    module = importlib.import_module(package)
    assert module.__file__ is not None
    source = Path(module.__file__).read_text(encoding="utf-8")
    assert export_problems(module, source) == []
    assert set(module.__all__) <= set(dir(module))


def test_everything_exported_is_importable_by_name() -> None:
    namespace: dict[str, object] = {}
    exec("from hami_trio import *", namespace)
    assert sorted(name for name in namespace if name != "__builtins__") == sorted(hami_trio.__all__)


def test_the_checker_fails_on_a_broken_namespace() -> None:
    source = (
        "from hami_trio.errors import ConfigError, HamiTrioError\n"
        "from hami_trio.pods.source import PodInfo\n"
        "from hami_trio.monitor.loop import logger\n"
        "__all__ = ['ConfigError', 'Gone', 'PodInfo', 'logger', 'ConfigError']\n"
    )
    fake = types.ModuleType("fake")
    exec(source, fake.__dict__)
    assert export_problems(fake, source) == [
        "__all__ has duplicates",
        "Gone is exported but no import statement binds it",
        "PodInfo comes from hami_trio.pods.source, not a public room",
        "logger is not in hami_trio.monitor.loop.__all__ (re-exporting a private name)",
        "HamiTrioError is public in the namespace but not exported",
    ]


def test_the_checker_fails_when_the_lazy_map_and_the_typing_imports_differ() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from hami_trio.errors import ConfigError, HamiTrioError\n"
        "else:\n"
        "    from hami_trio._lazy import lazy_exports as _lazy_exports\n"
        "    __getattr__, __dir__ = _lazy_exports(\n"
        "        globals(),\n"
        "        {'hami_trio.errors': ('ConfigError',), 'hami_trio.goparse': ('BindAddress',)},\n"
        "    )\n"
        "__all__ = ['ConfigError', 'HamiTrioError']\n"
    )
    fake = types.ModuleType("fake")
    exec(source, fake.__dict__)
    assert export_problems(fake, source) == [
        "the TYPE_CHECKING imports and the lazy_exports map differ: "
        "[('BindAddress', 'hami_trio.goparse'), ('HamiTrioError', 'hami_trio.errors')]",
        "HamiTrioError is exported but missing at run time",
    ]
