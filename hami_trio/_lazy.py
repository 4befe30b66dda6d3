"""Lazy re-exports for a package namespace (PEP 562): a name's module loads on first use.

A package that re-exports its API would otherwise import every module behind it as soon as
any of its submodules is imported - ``import hami_trio.broker.client`` would load the trio
server, ``import hami_trio.cli.main`` the whole agent.  The package lists its re-exports
under ``if TYPE_CHECKING:`` (what mypy and readers see) and, at run time, hands the same
names to :func:`lazy_exports` with its ``globals()``; tests/test_exports.py checks that the
two lists agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: MutableMapping[str, Any], homes: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package, re-exporting ``homes``' names.

    Args:
        namespace: the package's ``globals()``.
        homes: module name -> the names the package re-exports from it.

    Returns:
        The module-level ``__getattr__`` (imports the name's module, binds the name in the
        package so the next access is a plain lookup) and ``__dir__``.
    """
    home_of = {name: module for module, names in homes.items() for name in names}
    package = namespace["__name__"]

    def __getattr__(name: str) -> object:
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(home_of))

    return __getattr__, __dir__
