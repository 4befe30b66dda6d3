"""The pure cores measured by mutation testing, each with the test files that cover it.

A module's covering tests are the test files that mirror it (and their companions that pin
its limits and messages); they must run in seconds, because every mutant runs them.  The
slowest are ``monitor/layout.py``'s (10 to 25 s a run, gcc included); ``monitor/snapshot.py``'s
take about 3 s with the interpreter's start.  The tests named here, not the whole suite,
are what the score measures.  Order: cheapest first, so a time budget covers the most
modules.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODULES", "Target", "targets_touched"]


@dataclass(frozen=True, slots=True)
class Target:
    """One pure module (path below ``hami_trio/``) and its covering test files."""

    module: str
    tests: tuple[str, ...]

    @property
    def path(self) -> str:
        return f"hami_trio/{self.module}"

    @property
    def dotted(self) -> str:
        return "hami_trio." + self.module.removesuffix(".py").replace("/", ".")


MODULES: tuple[Target, ...] = (
    Target(
        "broker/protocol.py",
        ("tests/broker/test_protocol.py", "tests/broker/test_protocol_limits.py"),
    ),
    Target("goparse.py", ("tests/test_goparse.py", "tests/test_goparse_exact.py")),
    Target(
        "pods/allocated.py",
        ("tests/pods/test_allocated.py", "tests/pods/test_allocated_limits.py"),
    ),
    Target(
        "metrics/exportstate.py",
        ("tests/metrics/test_exportstate.py", "tests/metrics/test_exportstate_exact.py"),
    ),
    Target(
        "pods/migalloc.py",
        ("tests/pods/test_migalloc.py", "tests/pods/test_migalloc_exact.py"),
    ),
    Target(
        "allocation/response.py",
        ("tests/allocation/test_response.py", "tests/allocation/test_response_exact.py"),
    ),
    Target("monitor/feedback.py", ("tests/monitor/test_feedback.py",)),
    Target(
        "pods/decode.py",
        ("tests/pods/test_decode.py", "tests/pods/test_decode_exact.py"),
    ),
    Target(
        "monitor/layout.py",
        # test_layout_c.py checks every offset of the tables against gcc's offsetof.
        (
            "tests/monitor/test_layout.py",
            "tests/monitor/test_layout_c.py",
            "tests/monitor/test_layout_exact.py",
        ),
    ),
    Target(
        "monitor/snapshot.py",
        # Not test_snapshot.py: mostly hypothesis properties against the reference decoder,
        # 7-10 s a run; the exact tests pin the same oracle on explicit examples.
        ("tests/monitor/test_snapshot_exact.py", "tests/monitor/test_tick_decoder.py"),
    ),
)


def targets_touched(changed: set[str]) -> list[Target]:
    """The targets whose module or covering tests are among ``changed`` (repository paths),
    in :data:`MODULES` order."""
    return [t for t in MODULES if t.path in changed or changed.intersection(t.tests)]
