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
from pathlib import Path

import hami_trio

#: The rooms the package namespace may re-export from (docs/architecture.md).
PUBLIC_ROOMS = frozenset({"agent", "broker", "allocation", "errors", "goparse", "monitor"})


def export_problems(module: types.ModuleType, source: str) -> list[str]:
    problems: list[str] = []
    tree = ast.parse(source)
    static_all: list[str] | None = None
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            static_all = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom) and node.module not in (None, "__future__"):
            for alias in node.names:
                bound[alias.asname or alias.name] = str(node.module)
    if static_all is None:
        return ["no literal __all__"]
    runtime_all = list(getattr(module, "__all__", []))
    if static_all != runtime_all:
        problems.append("__all__ at run time differs from the literal in the source")
    if len(set(static_all)) != len(static_all):
        problems.append("__all__ has duplicates")
    for name in static_all:
        if name not in bound:
            problems.append(f"{name} is exported but no import statement binds it")
            continue
        if not hasattr(module, name):
            problems.append(f"{name} is exported but missing at run time")
            continue
        home = bound[name]
        parts = home.split(".")
        if len(parts) > 1 and parts[1] not in PUBLIC_ROOMS and home != "hami_trio._version":
            problems.append(f"{name} comes from {home}, not a public room")
        home_module = importlib.import_module(home)
        if name != "__version__" and name not in getattr(home_module, "__all__", ()):
            problems.append(f"{name} is not in {home}.__all__ (re-exporting a private name)")
        if getattr(module, name) is not getattr(home_module, name, None):
            problems.append(f"{name} is not the object {home} defines")
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value) or name == "annotations":
            continue
        if name not in static_all:
            problems.append(f"{name} is public in the namespace but not exported")
    return problems


def test_the_namespace_exports_exactly_its_public_api() -> None:
    source = Path(hami_trio.__file__).read_text(encoding="utf-8")
    assert export_problems(hami_trio, source) == []


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
