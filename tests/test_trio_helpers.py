"""hami_trio._trio: one error out of an exception group, the start recorder."""

from __future__ import annotations

from typing import Any

from hami_trio._trio import StartRecorder, leaf_errors, sole_error


def test_leaf_errors_walks_nested_groups_in_order() -> None:
    a, b, c = ValueError("a"), KeyError("b"), OSError("c")
    group = BaseExceptionGroup("outer", [a, ExceptionGroup("inner", [b, c])])
    assert leaf_errors(group) == [a, b, c]


def test_sole_error_only_when_there_is_exactly_one() -> None:
    only = RuntimeError("only")
    assert sole_error(ExceptionGroup("g", [ExceptionGroup("h", [only])])) is only
    assert sole_error(ExceptionGroup("g", [ValueError(), ValueError()])) is None


class _Status:
    def __init__(self) -> None:
        self.values: list[Any] = []

    def started(self, value: Any = None) -> None:
        self.values.append(value)


def test_start_recorder_remembers_and_passes_the_value_on() -> None:
    inner = _Status()
    recorder = StartRecorder(inner)  # type: ignore[arg-type]
    assert not recorder.done
    recorder.started(42)
    assert recorder.done
    assert inner.values == [42]
