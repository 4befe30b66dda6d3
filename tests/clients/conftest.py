"""Fixtures for the broker client tests: the C client built once per session, sandboxes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.harness import Sandbox, build_c_client, make_sandbox
from tests.sandbox import world_readable_dir


@pytest.fixture(scope="session")
def c_client() -> Iterator[Path]:
    """``hostpid-client`` built with the project's Makefile (-Werror) in a world-readable dir."""
    with world_readable_dir("ht-cclient-") as dest:
        yield build_c_client(dest)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """A fresh container-like sandbox tree (see tests/clients/harness.py)."""
    with make_sandbox() as box:
        yield box
