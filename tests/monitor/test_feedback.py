"""Observe: upstream's decision tables, whole-node scenarios and properties."""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_trio.monitor.feedback import (
    Activity,
    Grant,
    Observable,
    Observed,
    Write,
    observe,
    scoped,
    strays,
)
from hami_trio.monitor.layout import ControlField
from hami_trio.monitor.snapshot import parse_region
from hami_trio.testing.regions import RegionSpec, build_region
from tests.strategies import feedback as st_feedback

RK = ControlField.RECENT_KERNEL
SW = ControlField.UTILIZATION_SWITCH


def from_lists(per_device: Mapping[bytes, Sequence[int]]) -> Activity:
    """Upstream's shape, ``{uuid: [count at priority 0, 1, ...]}``, as an :class:`Activity`."""
    return Activity({key: dict(enumerate(counts)) for key, counts in per_device.items()})


def gpu(name: str) -> bytes:
    return name.encode().ljust(96, b"\0")


def node(**containers: tuple[int, int, int, Sequence[str]]) -> dict[str, Observed]:
    """name=(priority, recent_kernel, utilization_switch, gpus)."""
    return {
        name: Observed(p, rk, sw, tuple(gpu(g) for g in gpus))
        for name, (p, rk, sw, gpus) in containers.items()
    }


def final(containers: Mapping[str, Observed], writes: Sequence[Write[str]]) -> dict[str, Observed]:
    """The node after the writes were applied."""
    out = dict(containers)
    for write in writes:
        if write.field is RK:
            out[write.key] = dataclasses.replace(out[write.key], recent_kernel=write.value)
        else:
            out[write.key] = dataclasses.replace(out[write.key], utilization_switch=write.value)
    return out


# -- upstream CheckBlocking / CheckPriority tables (cmd/vGPUmonitor/feedback_test.go) ------


def test_check_functions_high_priority() -> None:
    activity = from_lists({gpu("gpu-0"): [0, 1]})
    assert activity.blocks(3, [gpu("gpu-0")])
    assert activity.crowds(3, [gpu("gpu-0")])
    assert not from_lists({gpu("gpu-0"): [0, 0]}).blocks(2, [gpu("gpu-0")])


# (name, container UUIDs, upstream switch map {uuid: [count at priority 0, 1, ...]}, want)
MULTI_DEVICE = [
    (
        "two devices, contention on the second",
        ["gpu-0", "gpu-1"],
        {"gpu-0": [0, 0], "gpu-1": [1, 0]},
        True,
    ),
    (
        "three devices, all clear",
        ["gpu-0", "gpu-1", "gpu-2"],
        {"gpu-0": [0, 0], "gpu-1": [0, 0], "gpu-2": [0, 0]},
        False,
    ),
    (
        "four devices, contention only on the last",
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        {"gpu-0": [0, 0], "gpu-1": [0, 0], "gpu-2": [0, 0], "gpu-3": [1, 0]},
        True,
    ),
    (
        "some device UUIDs missing from switch map, present one contended",
        ["gpu-0", "gpu-1", "gpu-2"],
        {"gpu-1": [1, 0]},
        True,
    ),
    (
        "none of the container UUIDs are in the switch map",
        ["gpu-0", "gpu-1"],
        {"gpu-9": [1, 0]},
        False,
    ),
    ("empty switch map", ["gpu-0", "gpu-1"], {}, False),
]


@pytest.mark.parametrize(
    ("uuids", "switch_map", "want"),
    [pytest.param(u, m, w, id=name) for name, u, m, w in MULTI_DEVICE],
)
def test_check_blocking_multi_device(
    uuids: list[str], switch_map: dict[str, list[int]], want: bool
) -> None:
    activity = from_lists({gpu(k): v for k, v in switch_map.items()})
    keys = [gpu(u) for u in uuids]
    assert activity.blocks(1, keys) is want
    assert activity.crowds(1, keys) is want  # upstream asserts parity for these inputs


def test_check_priority_same_priority_needs_two() -> None:
    activity = from_lists({gpu("g"): [0, 0, 1]})
    assert not activity.crowds(2, [gpu("g")])  # only itself at priority 2
    assert from_lists({gpu("g"): [0, 0, 2]}).crowds(2, [gpu("g")])
    assert not from_lists({gpu("g"): [0, 0, 2]}).blocks(2, [gpu("g")])
    # negative priorities never block nor crowd (upstream: p >= 0 and range(min(p, len)))
    assert not from_lists({gpu("g"): [5, 5]}).crowds(-1, [gpu("g")])


# -- whole-node scenarios ------------------------------------------------------------------


def test_alone_on_a_gpu_decays_and_is_never_limited() -> None:
    containers = node(a=(1, 2, 1, ["g0"]))
    assert observe(containers) == (Write("a", RK, 1), Write("a", SW, 0))


def test_higher_priority_blocks_lower_on_the_same_gpu() -> None:
    containers = node(hi=(0, 2, 0, ["g0"]), lo=(1, 2, 0, ["g0"]))
    after = final(containers, observe(containers))
    assert (after["hi"].recent_kernel, after["hi"].utilization_switch) == (1, 0)
    assert (after["lo"].recent_kernel, after["lo"].utilization_switch) == (-1, 1)


def test_same_priority_shares_with_limits_on_and_nobody_blocked() -> None:
    containers = node(a=(1, 2, 0, ["g0"]), b=(1, 2, 0, ["g0"]))
    after = final(containers, observe(containers))
    assert [(c.recent_kernel, c.utilization_switch) for c in after.values()] == [(1, 1), (1, 1)]


def test_different_gpus_do_not_interact() -> None:
    containers = node(hi=(0, 2, 0, ["g0"]), lo=(5, 2, 0, ["g1"]))
    after = final(containers, observe(containers))
    assert after["lo"].recent_kernel == 1
    assert after["lo"].utilization_switch == 0


def test_blocked_container_is_released_when_the_important_one_goes_quiet() -> None:
    containers = node(hi=(0, 1, 0, ["g0"]), lo=(1, -1, 1, ["g0"]))
    assert observe(containers) == (
        Write("hi", RK, 0),
        Write("lo", RK, 0),
        Write("lo", SW, 0),
    )


def test_issue_132_low_priority_blocked_by_contention_on_its_second_gpu() -> None:
    containers = node(hi=(0, 2, 0, ["g1"]), lo=(3, 2, 0, ["g0", "g1"]))
    after = final(containers, observe(containers))
    assert after["lo"].recent_kernel == -1


def test_recent_kernel_of_one_decays_to_zero_and_does_not_count() -> None:
    containers = node(hi=(0, 1, 0, ["g0"]), lo=(1, 2, 0, ["g0"]))
    after = final(containers, observe(containers))
    assert after["hi"].recent_kernel == 0
    assert after["lo"].recent_kernel == 1  # not blocked: hi is no longer active


def test_negative_priority_is_never_counted_nor_blocked() -> None:
    containers = node(neg=(-7, 2, 1, ["g0"]), hi=(0, 2, 0, ["g0"]))
    after = final(containers, observe(containers))
    assert (after["neg"].recent_kernel, after["neg"].utilization_switch) == (1, 0)
    assert (after["hi"].recent_kernel, after["hi"].utilization_switch) == (1, 0)


def test_priority_int32_max_costs_nothing_and_is_blocked_by_everyone() -> None:
    containers = node(big=(2**31 - 1, 2**31 - 1, 0, ["g0"]), hi=(0, 2, 0, ["g0"]))
    tracemalloc.start()
    try:
        writes = observe(containers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024  # upstream grows a slice to 2**31 entries here (16 GiB)
    after = final(containers, writes)
    assert after["big"].recent_kernel == -1
    assert after["hi"].recent_kernel == 1


def test_a_duplicated_uuid_slot_counts_twice_as_upstream() -> None:
    containers = node(a=(1, 2, 0, ["g0", "g0"]))
    after = final(containers, observe(containers))
    assert after["a"].utilization_switch == 1


def test_unused_uuid_slots_from_a_real_region_are_ignored() -> None:
    # Built through the real parser: slot 1 is unused (first byte NUL) but has bytes after it.
    lo = parse_region(
        build_region(RegionSpec(num=2, uuids=["GPU-a", b"\0junk"], priority=1, recent_kernel=2))
    )
    hi = parse_region(
        build_region(RegionSpec(num=1, uuids=[b"\0junk"], priority=0, recent_kernel=2))
    )
    assert lo.device_keys == (gpu("GPU-a"),)
    assert hi.device_keys == ()
    writes = observe({"lo": lo, "hi": hi})
    assert Write("lo", RK, -1) not in writes


def test_nothing_written_when_nothing_changes() -> None:
    assert observe(node(a=(0, 0, 0, ["g0"]), b=(1, 0, 0, ["g0"]))) == ()
    assert observe({}) == ()


# -- properties ----------------------------------------------------------------------------


def _check_blocking(ut: Mapping[bytes, list[int]], p: int, keys: Sequence[bytes]) -> bool:
    return any(u in ut and any(ut[u][i] > 0 for i in range(min(p, len(ut[u])))) for u in keys)


def _check_priority(ut: Mapping[bytes, list[int]], p: int, keys: Sequence[bytes]) -> bool:
    for u in keys:
        if u in ut:
            if any(ut[u][i] > 0 for i in range(min(p, len(ut[u])))):
                return True
            if 0 <= p < len(ut[u]) and ut[u][p] > 1:
                return True
    return False


def upstream_reference(containers: Mapping[str, Observed]) -> dict[str, tuple[int, int]]:
    """A literal port of HAMi's Observe (growing lists), for small priorities only."""
    ut: dict[bytes, list[int]] = {}
    rk = {k: c.recent_kernel for k, c in containers.items()}
    sw = {k: c.utilization_switch for k, c in containers.items()}
    for k, c in containers.items():
        if rk[k] > 0:
            rk[k] -= 1
            if rk[k] > 0:
                for u in c.device_keys:
                    if c.priority < 0:
                        continue
                    lst = ut.setdefault(u, [])
                    while c.priority >= len(lst):
                        lst.append(0)
                    lst[c.priority] += 1

    for k, c in containers.items():
        if _check_blocking(ut, c.priority, c.device_keys):
            if rk[k] >= 0:
                rk[k] = -1
        elif rk[k] < 0:
            rk[k] = 0
        sw[k] = 1 if _check_priority(ut, c.priority, c.device_keys) else 0
    return {k: (rk[k], sw[k]) for k in containers}


small_nodes = st_feedback.observed_maps().filter(lambda m: all(c.priority < 64 for c in m.values()))


@given(small_nodes)
def test_matches_a_literal_port_of_upstream(containers: dict[str, Observed]) -> None:
    after = final(containers, observe(containers))
    got = {k: (c.recent_kernel, c.utilization_switch) for k, c in after.items()}
    assert got == upstream_reference(containers)


@given(st_feedback.observed_maps())
def test_second_tick_without_activity_writes_nothing(containers: dict[str, Observed]) -> None:
    quiet = {
        k: dataclasses.replace(c, recent_kernel=min(c.recent_kernel, 1))
        for k, c in containers.items()
    }
    once = final(quiet, observe(quiet))
    assert observe(once) == ()


@given(st_feedback.observed_maps())
def test_never_blocks_the_highest_active_priority(containers: dict[str, Observed]) -> None:
    active = [
        c.priority
        for c in containers.values()
        if c.recent_kernel >= 2 and c.priority >= 0 and c.device_keys
    ]
    after = final(containers, observe(containers))
    if not active:
        assert all(c.recent_kernel >= 0 for c in after.values())
        return
    best = min(active)
    for name, c in containers.items():
        if c.priority <= best:
            assert after[name].recent_kernel >= 0, name


@given(st_feedback.observed_maps(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_input_order(
    containers: dict[str, Observed], rnd: object
) -> None:
    writes = observe(containers)
    assert observe(containers) == writes
    names = list(containers)
    rnd.shuffle(names)  # type: ignore[attr-defined]
    shuffled = {name: containers[name] for name in names}
    assert set(observe(shuffled)) == set(writes)
    keys = [w.key for w in writes]
    assert keys == sorted(keys, key=list(containers).index)  # output follows input order


@given(st_feedback.observed_maps())
def test_writes_only_changes_and_at_most_two_per_container(
    containers: dict[str, Observed],
) -> None:
    writes = observe(containers)
    for write in writes:
        c = containers[write.key]
        current = c.recent_kernel if write.field is RK else c.utilization_switch
        assert write.value != current
        assert write.field is RK or write.value in (0, 1)
    assert len(writes) == len({(w.key, w.field) for w in writes})


def counting_reference(containers: Mapping[str, Observable]) -> tuple[Write[str], ...]:
    """Observe written the straightforward way: a count per (UUID, priority), then
    CheckBlocking / CheckPriority over every UUID of every container (the shape ``observe``
    had before it kept only the most important priority per UUID)."""
    counts: dict[bytes, dict[int, int]] = {}
    decremented: dict[str, int] = {}
    for key, c in containers.items():
        recent = c.recent_kernel
        if recent > 0:
            recent -= 1
            if recent > 0 and c.priority >= 0:
                for raw in c.device_keys:
                    per = counts.setdefault(raw, {})
                    per[c.priority] = per.get(c.priority, 0) + 1
        decremented[key] = recent

    def blocks(priority: int, keys: Sequence[bytes]) -> bool:
        return any(p < priority for raw in keys for p in counts.get(raw, {}))

    def crowds(priority: int, keys: Sequence[bytes]) -> bool:
        return blocks(priority, keys) or any(
            counts.get(raw, {}).get(priority, 0) > 1 for raw in keys
        )

    writes: list[Write[str]] = []
    for key, c in containers.items():
        blocked = blocks(c.priority, c.device_keys)
        recent = decremented[key]
        if blocked and recent >= 0:
            recent = -1
        elif not blocked and recent < 0:
            recent = 0
        if recent != c.recent_kernel:
            writes.append(Write(key, RK, recent))
        switch = 1 if crowds(c.priority, c.device_keys) else 0
        if switch != c.utilization_switch:
            writes.append(Write(key, SW, switch))
    return tuple(writes)


@given(st_feedback.observed_maps(max_size=24))
def test_same_writes_as_the_counting_reference(containers: dict[str, Observed]) -> None:
    # every priority (no filter), bigger nodes than the upstream port can take
    writes = observe(containers)
    assert writes == counting_reference(containers)
    assert all(type(w) is Write and w == Write(w.key, w.field, w.value) for w in writes)


@given(st_feedback.observed_maps(max_size=24))
def test_activity_agrees_with_the_counting_reference(containers: dict[str, Observed]) -> None:
    counts: dict[bytes, dict[int, int]] = {}
    for c in containers.values():
        if c.recent_kernel > 1 and c.priority >= 0:
            for raw in c.device_keys:
                per = counts.setdefault(raw, {})
                per[c.priority] = per.get(c.priority, 0) + 1
    activity = Activity(counts)
    assert activity.counts == counts
    for c in containers.values():
        assert activity.blocks(c.priority, c.device_keys) is any(
            p < c.priority for raw in c.device_keys for p in counts.get(raw, {})
        )
        assert activity.crowds(c.priority, c.device_keys) is (
            activity.blocks(c.priority, c.device_keys)
            or any(counts.get(raw, {}).get(c.priority, 0) > 1 for raw in c.device_keys)
        )


# -- pod grants: whose GPUs, whose priority -------------------------------------------------


def grant(gpus: Sequence[str] | None, priority: int | None = None) -> Grant:
    return Grant(None if gpus is None else tuple(gpu(g) for g in gpus), priority)


# (name, node, grants, the node as the pods tell it, or None where the files are honest).
# Honest rows must give exactly upstream's decisions; lying rows must give upstream's
# decisions on the truthful node (what HAMi would decide if every file told the truth).
GRANT_TABLE: list[
    tuple[
        str,
        dict[str, Observed],
        dict[str, Grant],
        dict[str, Observed] | None,
    ]
] = [
    (
        "honest: the files say what the pods say",
        node(hi=(0, 2, 0, ["A"]), lo=(1, 2, 0, ["A"])),
        {"hi": grant(["A"], 0), "lo": grant(["A"], 1)},
        None,
    ),
    (
        "honest: a container using one of its two GPUs",
        node(hi=(0, 2, 0, ["A"]), lo=(1, 2, 0, ["B"])),
        {"hi": grant(["A", "B"], 0), "lo": grant(["B"])},
        None,
    ),
    (
        "honest: no grant (no annotation) and a grant without a priority",
        node(hi=(0, 2, 0, ["A"]), lo=(1, 2, 0, ["A"]), other=(2, 2, 0, ["B"])),
        {"lo": grant(["A"])},
        None,
    ),
    (
        "honest: issue 132 with grants",
        node(hi=(0, 2, 0, ["B"]), lo=(3, 2, 0, ["A", "B"])),
        {"hi": grant(["B"], 0), "lo": grant(["A", "B"], 3)},
        None,
    ),
    (
        "lying: allocated A, claims B at priority 0 (the attack)",
        node(attacker=(0, 2, 0, ["B"]), victim=(1, 2, 0, ["B"])),
        {"attacker": grant(["A"]), "victim": grant(["B"], 1)},
        node(attacker=(0, 2, 0, ["A"]), victim=(1, 2, 0, ["B"])),
    ),
    (
        "lying: claims A and B, allocated A only",
        node(attacker=(0, 2, 0, ["A", "B"]), victim=(1, 2, 0, ["B"])),
        {"attacker": grant(["A"])},
        node(attacker=(0, 2, 0, ["A"]), victim=(1, 2, 0, ["B"])),
    ),
    (
        "lying: priority 0 in the file, the pod spec says 1",
        node(attacker=(0, 2, 0, ["A"]), victim=(1, 2, 0, ["A"])),
        {"attacker": grant(["A"], 1), "victim": grant(["A"], 1)},
        node(attacker=(1, 2, 0, ["A"]), victim=(1, 2, 0, ["A"])),
    ),
    (
        "lying: a low priority in the file to escape the pod spec's 0 (still counts 0)",
        node(important=(9, 2, 0, ["A"]), other=(1, 2, 0, ["A"])),
        {"important": grant(["A"], 0)},
        node(important=(0, 2, 0, ["A"]), other=(1, 2, 0, ["A"])),
    ),
    (
        "lying: claims a GPU to dodge a block; counted on its allocated A, blocked there",
        node(hi=(0, 2, 0, ["A"]), lo=(1, 2, 0, ["Z"])),
        {"hi": grant(["A"], 0), "lo": grant(["A"], 1)},
        node(hi=(0, 2, 0, ["A"]), lo=(1, 2, 0, ["A"])),
    ),
    (
        "lying: an annotated pod gave it nothing: it counts nowhere",
        node(attacker=(0, 2, 0, ["A"]), victim=(1, 2, 0, ["A"])),
        {"attacker": grant([])},
        node(attacker=(0, 2, 0, []), victim=(1, 2, 0, ["A"])),
    ),
]


@pytest.mark.parametrize(
    ("containers", "grants", "truth"),
    [pytest.param(c, g, t, id=name) for name, c, g, t in GRANT_TABLE],
)
def test_grants_give_upstreams_decisions_on_what_the_pods_say(
    containers: dict[str, Observed],
    grants: dict[str, Grant],
    truth: dict[str, Observed] | None,
) -> None:
    after = final(containers, observe(containers, grants))
    got = {k: (c.recent_kernel, c.utilization_switch) for k, c in after.items()}
    if truth is None:  # honest: exactly upstream's, and the same writes as without grants
        assert got == upstream_reference(containers)
        assert observe(containers, grants) == observe(containers)
        assert all(strays(containers[k], g) == () for k, g in grants.items())
    else:
        assert got == upstream_reference(truth)
        assert got != upstream_reference(containers)  # upstream obeys the lie


def test_the_attack_blocks_the_victim_without_grants_and_not_with_them() -> None:
    containers = node(attacker=(0, 2, 0, ["B"]), victim=(1, 2, 0, ["B"]))
    grants = {"attacker": grant(["A"]), "victim": grant(["B"], 1)}
    assert Write("victim", RK, -1) in observe(containers)  # upstream, and no Kubernetes
    assert final(containers, observe(containers, grants))["victim"].recent_kernel == 1
    assert strays(containers["attacker"], grants["attacker"]) == (gpu("B"),)


def test_scoped_returns_the_container_itself_when_the_grant_changes_nothing() -> None:
    c = Observed(1, 2, 0, (gpu("A"),))
    assert scoped(c, None) is c
    assert scoped(c, grant(["A", "B"], 1)) is c
    assert scoped(c, grant(None)) is c
    assert scoped(c, grant(["B"], 0)) == Observed(0, 2, 0, (gpu("B"),))
    # A duplicated stray slot does not count twice on the allocation.
    assert scoped(Observed(1, 2, 0, (gpu("Z"), gpu("Z"))), grant(["A", "A"])).device_keys == (
        gpu("A"),
    )
    # Junk after the NUL is not the allocated UUID (HAMi-core pads with NULs).
    junk = gpu("A")[:10] + b"junk" + bytes(82)
    assert strays(Observed(1, 2, 0, (junk,)), grant(["A"])) == (junk,)


@given(st_feedback.granted_nodes(honest=True))
def test_honest_grants_change_nothing(
    node_grants: tuple[dict[str, Observed], dict[str, Grant]],
) -> None:
    containers, grants = node_grants
    assert observe(containers, grants) == observe(containers)


@given(st_feedback.granted_nodes(honest=False, max_size=12))
def test_grants_are_observe_over_the_scoped_node(
    node_grants: tuple[dict[str, Observed], dict[str, Grant]],
) -> None:
    containers, grants = node_grants
    truth = {k: scoped(c, grants.get(k)) for k, c in containers.items()}
    writes = observe(containers, grants)
    assert writes == observe(truth)
    assert writes == counting_reference(truth)
    # A container with a grant counts only on its allocated UUIDs, with the pod's priority.
    for key, g in grants.items():
        view = truth[key]
        if g.devices is not None:
            assert set(view.device_keys) <= set(g.devices)
        if g.priority is not None:
            assert view.priority == g.priority


@given(st_feedback.granted_nodes(honest=False, max_size=12))
def test_nobody_is_blocked_by_a_container_whose_pod_gave_it_none_of_their_gpus(
    node_grants: tuple[dict[str, Observed], dict[str, Grant]],
) -> None:
    containers, grants = node_grants
    # Every container has a grant listing devices: then only allocations meet.
    grants = {k: grants.get(k) or Grant(devices=()) for k in containers}
    grants = {k: g if g.devices is not None else Grant((), g.priority) for k, g in grants.items()}
    after = final(containers, observe(containers, grants))

    def priority(key: str) -> int:
        p = grants[key].priority
        return containers[key].priority if p is None else p

    for name in containers:
        if after[name].recent_kernel >= 0:
            continue
        mine = set(grants[name].devices or ())
        blockers = [
            other
            for other, o in containers.items()
            if o.recent_kernel > 1
            and mine & set(grants[other].devices or ())
            and 0 <= priority(other) < priority(name)
        ]
        assert blockers, f"{name} blocked by no container sharing one of its allocated GPUs"
