#!/usr/bin/env python3
"""Optional coverage-guided fuzzing of the codec and the ``.cache`` loader with atheris.

Not a dependency of the project and not run by CI: ``pip install atheris`` (3.x, Python
3.11) first.  Usage, from the repository root::

    .venv/bin/python fuzz/atheris_run.py codec  -max_total_time=300 [libFuzzer flags...]
    .venv/bin/python fuzz/atheris_run.py header -max_total_time=300
    .venv/bin/python fuzz/atheris_run.py loader -max_total_time=300 fuzz/corpus/atheris-loader

How this works: the modules under test are imported under ``atheris.instrument_imports()`` so
libFuzzer sees their branch coverage.  ``codec`` feeds libFuzzer's raw bytes to the oracles
of the codec target's mutators (``fuzz/targets/codec.py``: request parsing and the split
reader against the byte-layout oracle, response parsing); ``header`` to the layout target's
``check_header`` (a u32 size and a header against the loader rule); ``loader`` lets
libFuzzer's bytes drive hypothesis's
``region_bytes`` strategy (``fuzz_one_input``), so the mutations are structure-aware while
the property is the one of ``tests/monitor/test_layout.py``.  A crash is written by libFuzzer
as ``crash-<sha1>``; turn it into a corpus file or an ``@example`` (docs/fuzzing.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import atheris
except ImportError:  # pragma: no cover - optional tool
    sys.exit("atheris is not installed: pip install atheris (optional, not a project dependency)")

with atheris.instrument_imports():
    import hami_trio.broker.protocol
    import hami_trio.monitor.layout
    import hami_trio.monitor.snapshot  # noqa: F401

from hypothesis import HealthCheck, given, settings

from fuzz.targets.codec import check_parse_response, check_request_bytes
from fuzz.targets.layout import check_header
from tests.monitor.test_layout import (
    test_parse_region_of_any_bytes_is_a_snapshot_or_a_typed_rejection as region_property,
)
from tests.strategies import layout as st_layout


def codec(data: bytes) -> None:
    """Raw bytes into both parsers, checked against the byte-layout oracles."""
    check_request_bytes(data)
    check_parse_response(data)


def _loader() -> Callable[[bytes], object]:
    body = region_property.hypothesis.inner_test  # type: ignore[attr-defined]
    test = settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))(
        given(st_layout.region_bytes())(body)
    )
    return test.hypothesis.fuzz_one_input  # type: ignore[attr-defined,no-any-return]


def main() -> None:
    targets: dict[str, Callable[[], Callable[[bytes], object]]] = {
        "codec": lambda: codec,
        "header": lambda: check_header,
        "loader": _loader,
    }
    if len(sys.argv) < 2 or sys.argv[1] not in targets:
        sys.exit("usage: fuzz/atheris_run.py codec|header|loader [libFuzzer flags, corpus dirs]")
    target = targets[sys.argv.pop(1)]()
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
