"""Target ``observe``: the Observe feedback step over random nodes.

The feedback properties are stated once, in tests/monitor/test_feedback.py; this target runs
those bodies over the same strategies for longer: agreement with a literal port of upstream
(on priorities small enough for upstream's list-per-priority), idempotence on a quiet second
tick, never blocking the highest active priority, determinism and independence of input
order, writes only of changed words and at most two per container; with pod grants, that
honest ones change no write and that any are Observe over the node as the pods tell it.

New here:

- ``bounded_memory``: nodes of up to 64 containers with any priorities (2**31-1 included):
  the peak memory of one ``observe`` call stays under a bound that depends on the number of
  containers and UUID slots only, never on the priority values (upstream allocates a list of
  ``priority + 1`` entries per GPU);
- ``snapshots``: Observe over real snapshots - regions of either format with hostile values,
  parsed by the monitor's loader (rejected ones skipped) - yields only writes to containers
  it was given, of the two control words, with int32 values.
"""

from __future__ import annotations

import tracemalloc

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.feedback import Observed, observe
from hami_trio.monitor.layout import ControlField
from hami_trio.monitor.snapshot import UsageSnapshot, parse_region
from tests.monitor import test_feedback
from tests.strategies import feedback as st_feedback
from tests.strategies import layout as st_layout

__all__ = ["TARGET"]

# Per container and per UUID slot it lists, generous; plus a fixed allowance for the call.
_BYTES_PER_CONTAINER = 2048
_BYTES_PER_KEY = 512
_BASE_BYTES = 64 * 1024


def check_bounded_memory(containers: dict[str, Observed]) -> None:
    """Peak memory of observe() depends on the node's size, not on priority values."""
    keys = sum(len(c.device_keys) for c in containers.values())
    bound = _BASE_BYTES + _BYTES_PER_CONTAINER * len(containers) + _BYTES_PER_KEY * keys
    tracemalloc.start()
    try:
        writes = observe(containers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= bound, f"observe peaked at {peak} bytes for {len(containers)} containers"
    assert len(writes) <= 2 * len(containers)


def check_snapshots(regions: list[bytes]) -> None:
    """Observe over parsed regions: writes only for given containers, only the two words."""
    snapshots: dict[int, UsageSnapshot] = {}
    for index, data in enumerate(regions):
        try:
            snapshots[index] = parse_region(data)
        except CacheFileRejected:
            continue
    writes = observe(snapshots)
    seen = set()
    for write in writes:
        assert write.key in snapshots
        assert write.field in (ControlField.RECENT_KERNEL, ControlField.UTILIZATION_SWITCH)
        assert -(2**31) <= write.value < 2**31
        assert (write.key, write.field) not in seen
        seen.add((write.key, write.field))
        if write.field is ControlField.UTILIZATION_SWITCH:
            assert write.value in (0, 1)


def _body(test: object) -> object:
    return test.hypothesis.inner_test  # type: ignore[attr-defined]


_NODES = st_feedback.observed_maps()
_BIG_NODES = st_feedback.observed_maps(max_size=64)

TARGET = Target(
    name="observe",
    description="Observe over random nodes: upstream agreement, invariants, bounded memory",
    ci_seconds=17,
    weight=1.0,
    properties=(
        Property(
            "upstream_port",
            (test_feedback.small_nodes,),
            _body(test_feedback.test_matches_a_literal_port_of_upstream),  # type: ignore[arg-type]
            weight=1.5,
        ),
        Property(
            "quiet_second_tick",
            (_BIG_NODES,),
            _body(test_feedback.test_second_tick_without_activity_writes_nothing),  # type: ignore[arg-type]
        ),
        Property(
            "highest_priority_runs",
            (_BIG_NODES,),
            _body(test_feedback.test_never_blocks_the_highest_active_priority),  # type: ignore[arg-type]
        ),
        Property(
            "deterministic",
            (_NODES, st.randoms(use_true_random=False)),
            _body(test_feedback.test_deterministic_and_independent_of_input_order),  # type: ignore[arg-type]
            weight=0.5,
        ),
        Property(
            "writes_only_changes",
            (_BIG_NODES,),
            _body(test_feedback.test_writes_only_changes_and_at_most_two_per_container),  # type: ignore[arg-type]
            weight=0.5,
        ),
        Property(
            "honest_grants",
            (st_feedback.granted_nodes(honest=True),),
            _body(test_feedback.test_honest_grants_change_nothing),  # type: ignore[arg-type]
            weight=0.5,
        ),
        Property(
            "scoped_grants",
            (st_feedback.granted_nodes(honest=False, max_size=24),),
            _body(test_feedback.test_grants_are_observe_over_the_scoped_node),  # type: ignore[arg-type]
            weight=0.5,
        ),
        Property("bounded_memory", (_BIG_NODES,), check_bounded_memory),
        Property(
            "snapshots",
            (st.lists(st_layout.region_bytes(), max_size=6),),
            check_snapshots,
            weight=1.5,
        ),
    ),
)
