"""Fixtures for the allocation tests: clear the immutable flags a preparation set.

As root, a preparation with the broker on makes ``hostpid`` immutable; without this a test's
``tmp_path`` could never be removed (pytest's own clean-up fails with EPERM).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.allocation.immutable import clear_immutable


@pytest.fixture(autouse=True)
def _clear_immutable_flags(tmp_path: Path) -> Iterator[None]:
    yield
    clear_immutable(tmp_path)
