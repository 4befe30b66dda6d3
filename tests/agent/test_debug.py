"""The debug document builder (pure): entries from snapshots, identities, extras, the caps.

Snapshots come from real region bytes (``testing.regions`` builds them, the monitor's own
decoder parses them); containers are the lister's ``ContainerState`` values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hami_trio.agent.debug import (
    SCHEMA,
    BrokerSummary,
    DebugExtras,
    DebugLimits,
    MonitorSummary,
    PodWatchSummary,
    ProcessState,
    Selection,
    container_entry,
    debug_state,
    part,
    render,
)
from hami_trio.monitor.layout import Format, RejectReason
from hami_trio.monitor.scope import Claim
from hami_trio.monitor.snapshot import UsageSnapshot, parse_region
from hami_trio.monitor.state import ContainerKey, ContainerState, ContainerStatus, Rejection
from hami_trio.pods.source import PodInfo, StaticPodSource
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, build_region
from tests.strategies.debug import container_states

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
ROOT = "/hook/containers"
MONITOR = MonitorSummary(containers_dir=ROOT, interval=5.0, ticks=7, paused=False)
K8S = PodWatchSummary("kubernetes", True, True, pods=1, node_name="node-a")


def snapshot(spec: RegionSpec) -> UsageSnapshot:
    return parse_region(bytes(build_region(spec)))


def loaded(uid: str, name: str, spec: RegionSpec) -> ContainerState[UsageSnapshot]:
    key = ContainerKey(uid, name)
    return ContainerState(
        key, f"{ROOT}/{key.dirname}", "abc.cache", ContainerStatus.LOADED, snapshot(spec), None
    )


def two_gpus() -> RegionSpec:
    return RegionSpec(
        num=2,
        uuids=[GPU_A, GPU_B],
        limits=[8 << 30, 4 << 30],
        sm_limits=[50, 30],
        priority=0,
        utilization_switch=1,
        recent_kernel=2,
        procs=[
            ProcSlot(
                pid=7,
                hostpid=4242,
                used=[MemoryUse(total=1 << 30), MemoryUse(total=0)],
                util=[UtilUse(sm_util=40), UtilUse(sm_util=0)],
            ),
            ProcSlot(
                pid=8,
                hostpid=0,
                used=[MemoryUse(total=2 << 20), MemoryUse(total=3 << 20)],
                util=[UtilUse(sm_util=5), UtilUse(sm_util=1)],
            ),
        ],
    )


POD = PodInfo("uid-1", "team-a", "trainer-0", containers=("main",))


def test_a_loaded_container_shows_what_its_file_says() -> None:
    state = loaded("uid-1", "main", two_gpus())
    entry = container_entry(state, POD, pods=K8S, paused=False)
    assert entry == {
        "directory": f"{ROOT}/uid-1_main",
        "pod_uid": "uid-1",
        "container": "main",
        "namespace": "team-a",
        "pod": "trainer-0",
        "identity": {"known": True, "reason": None},
        "status": "loaded",
        "file": f"{ROOT}/uid-1_main/abc.cache",
        "rejection": None,
        "paused": False,
        "format": "v1",
        "version": "1.2",
        "file_size": state.snapshot.file_size if state.snapshot else None,
        "priority": 0,
        "utilization_switch": 1,
        "recent_kernel": 2,
        "devices": [
            {
                "index": 0,
                "uuid": GPU_A,
                "uuid_state": "valid",
                "used_bytes": (1 << 30) + (2 << 20),
                "limit_bytes": 8 << 30,
                "sm_util": 45,
                "core_limit": 50,
                "processes": 2,
            },
            {
                "index": 1,
                "uuid": GPU_B,
                "uuid_state": "valid",
                "used_bytes": 3 << 20,
                "limit_bytes": 4 << 30,
                "sm_util": 1,
                "core_limit": 30,
                "processes": 1,
            },
        ],
        "processes": [
            {"pid": 7, "host_pid": 4242, "state": None},
            {"pid": 8, "host_pid": 0, "state": "unknown"},
        ],
        "processes_total": 2,
        "processes_truncated": False,
        # Without the process states only a host PID of 0 says anything.
        "process_states": {"running": None, "exited": None, "unknown": 1},
        "blocked": None,
        "blocked_since": None,
        "blocked_seconds": None,
        "blocks": None,
        "allocated": None,
        "feedback": None,
        "export": {"state": None, "reason": None},
    }


def test_a_v0_file_has_no_version_and_an_idle_region_no_processes() -> None:
    entry = container_entry(
        loaded("uid-1", "main", RegionSpec(format=Format.V0, uuids=[GPU_A], limits=[1 << 30])),
        POD,
        pods=K8S,
        paused=True,
    )
    assert (entry["format"], entry["version"], entry["paused"]) == ("v0", None, True)
    assert entry["processes"] == []
    assert entry["process_states"] == {"running": 0, "exited": 0, "unknown": 0}
    assert entry["devices"][0]["processes"] == 0


def test_refused_and_missing_files_and_unknown_pods_say_why() -> None:
    key = ContainerKey("gone-uid", "side")
    rejection = Rejection(RejectReason.TOO_SMALL, "x.cache: cache file size 4 too small")
    state: ContainerState[UsageSnapshot] = ContainerState(
        key, f"{ROOT}/gone-uid_side", "x.cache", ContainerStatus.REJECTED, None, rejection
    )
    entry = container_entry(state, None, pods=K8S, paused=False)
    assert entry["identity"] == {
        "known": False,
        "reason": "pod UID 'gone-uid' is not known to the pod watch of node 'node-a' "
        "(deleted, on another node, or not scheduled by HAMi here)",
    }
    assert (entry["namespace"], entry["pod"]) == (None, None)
    assert entry["rejection"] == {"reason": "too_small", "message": rejection.message}
    assert (entry["devices"], entry["process_states"], entry["format"]) == ([], None, None)
    unsynced = PodWatchSummary("kubernetes", False, False, node_name="node-a")
    assert (
        "has not listed yet"
        in container_entry(state, None, pods=unsynced, paused=False)["identity"]["reason"]
    )
    empty: ContainerState[UsageSnapshot] = ContainerState(
        key, f"{ROOT}/x", None, ContainerStatus.NO_CACHE_FILE, None, None
    )
    assert container_entry(empty, None, pods=K8S, paused=False)["file"] is None


@dataclass(frozen=True)
class Blocking:
    blocked: bool
    since: float | None
    seconds: float
    blocks: int


@dataclass(frozen=True)
class Device:
    uuid: str
    type: str
    memory_mib: int
    cores: int


@dataclass(frozen=True)
class Decision:
    state: str
    reason: str


def test_extras_fill_the_keys_left_for_them() -> None:
    states: dict[int, ProcessState] = {4242: "exited", 0: "unknown"}
    seen: list[tuple[Any, ...]] = []

    def allocation(pod: PodInfo, name: str) -> Sequence[Device]:
        seen.append((pod.uid, name))
        return [Device(GPU_A, "NVIDIA-A100", 4096, 30)] * 20  # more than the cap

    extras = DebugExtras(
        process_state=lambda key, pid: states.get(pid),
        blocking=lambda key: Blocking(True, 1700000000.5, 12.5, 3),
        allocation=allocation,
        export=lambda state, pod: Decision("completed", "pod 'team-a/trainer-0' is Succeeded"),
    )
    state = loaded("uid-1", "main", two_gpus())
    entry = container_entry(state, POD, pods=K8S, paused=False, extras=extras)
    assert [p["state"] for p in entry["processes"]] == ["exited", "unknown"]
    assert entry["process_states"] == {"running": 0, "exited": 1, "unknown": 1}
    assert (entry["blocked"], entry["blocked_since"], entry["blocked_seconds"]) == (
        True,
        1700000000.5,
        12.5,
    )
    assert entry["blocks"] == 3
    assert entry["allocated"] == {
        "devices": [{"uuid": GPU_A, "type": "NVIDIA-A100", "memory_mib": 4096, "cores": 30}]
        * DebugLimits().allocated,
        "truncated": True,
    }
    assert seen == [("uid-1", "main")]
    assert entry["export"] == {
        "state": "completed",
        "reason": "pod 'team-a/trainer-0' is Succeeded",
    }
    # No pod: the allocation is not asked (it lives in the pod's annotation).
    assert container_entry(state, None, pods=K8S, paused=False, extras=extras)["allocated"] is None
    assert seen == [("uid-1", "main")]


def document(containers: Sequence[ContainerState[UsageSnapshot]], **kwargs: Any) -> dict[str, Any]:
    pods = kwargs.pop("pod_source", StaticPodSource([POD]))
    return debug_state(
        {state.key: state for state in containers},
        pods,
        now=1700000000.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=K8S,
        broker=kwargs.pop("broker", None),
        **kwargs,
    )


def test_the_document_orders_counts_selects_and_summarises() -> None:
    other = PodInfo("uid-0", "team-b", "eval-0", containers=("main",))
    containers: list[ContainerState[UsageSnapshot]] = [
        loaded("uid-1", "main", two_gpus()),
        loaded("zzz-unknown", "main", two_gpus()),
        loaded("uid-0", "main", two_gpus()),
        ContainerState(
            ContainerKey("uid-1", "init"), f"{ROOT}/uid-1_init", None,
            ContainerStatus.NO_CACHE_FILE, None, None,
        ),
    ]  # fmt: skip
    broker = BrokerSummary("/run/broker.sock", {"ok": 3, "timeout": 1}, in_flight=2)
    doc = document(
        containers,
        pod_source=StaticPodSource([POD, other]),
        broker=broker,
        extras=DebugExtras(
            export=lambda state, pod: Decision("no_pod" if pod is None else "exported", "")
        ),
    )
    assert doc["schema"] == SCHEMA
    assert (doc["generated_at"], doc["node"], doc["version"]) == (1700000000.0, "node-a", "9.9")
    names = [(e["namespace"], e["pod"], e["container"]) for e in doc["containers"]]
    assert names == [
        ("team-a", "trainer-0", "init"),
        ("team-a", "trainer-0", "main"),
        ("team-b", "eval-0", "main"),
        (None, None, "main"),  # unknown pods last
    ]
    assert doc["monitor"]["by_status"] == {"loaded": 3, "no_cache_file": 1}
    assert doc["monitor"]["by_export_state"] == {"exported": 3, "no_pod": 1}
    assert doc["monitor"]["containers_total"] == 4
    assert doc["broker"] == {
        "socket_path": "/run/broker.sock",
        "exchanges": {"ok": 3, "timeout": 1},
        "exchanges_total": 4,
        "in_flight": 2,
        "foreign_listener": None,
    }
    assert doc["pods"]["source"] == "kubernetes"
    assert (doc["truncated"], doc["containers_matched"], doc["containers_shown"]) == (False, 4, 4)

    picked = document(
        containers,
        pod_source=StaticPodSource([POD, other]),
        selection=Selection.from_query({"namespace": ["team-b"]}),
    )
    assert [e["pod"] for e in picked["containers"]] == ["eval-0"]
    assert picked["selection"] == {"namespace": "team-b", "pod": None}
    assert picked["monitor"]["containers_total"] == 4  # the summary still counts everything
    assert part(doc, "broker") == {
        "schema": SCHEMA,
        "generated_at": 1700000000.0,
        "broker": doc["broker"],
    }
    assert part(doc, "containers")["containers"] == doc["containers"]
    assert json.loads(render(doc)) == doc


def test_caps_bound_the_document_and_say_so() -> None:
    slots = [ProcSlot(pid=i + 1, hostpid=i, used=[MemoryUse(total=1)]) for i in range(1024)]
    long_name = "c" * 2000
    spec = RegionSpec(uuids=[GPU_A], limits=[1 << 30], procs=slots)
    containers = [loaded(f"uid-{i:05}", long_name, spec) for i in range(30)]
    limits = DebugLimits(containers=10, processes=64, text=100)
    doc = document(containers, limits=limits, pod_source=StaticPodSource())
    assert (doc["truncated"], doc["containers_matched"], doc["containers_shown"]) == (True, 30, 10)
    entry = doc["containers"][0]
    assert len(entry["processes"]) == 64
    assert (entry["processes_total"], entry["processes_truncated"]) == (1024, True)
    assert entry["process_states"]["unknown"] == 1  # counted over every slot, not the listed
    assert entry["container"] == "c" * 100 + "..."
    assert entry["devices"][0]["processes"] == 1024


@given(
    st.lists(st.text(max_size=300), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=8),
)
def test_size_grows_with_the_caps_not_with_the_tenants(names: list[str], cap: int) -> None:
    spec = RegionSpec(uuids=[GPU_A], limits=[1 << 30])
    containers = [loaded(f"u{i}", name or "x", spec) for i, name in enumerate(names)]
    limits = DebugLimits(containers=cap, text=32)
    body = render(document(containers, limits=limits, pod_source=StaticPodSource()))
    # One entry of this shape, its text capped, is well under 4 KiB; ASCII whatever the names.
    assert len(body) < 2048 + cap * 4096
    assert body.isascii()
    assert json.loads(body)["containers_shown"] == min(cap, len(names))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


@given(st.lists(container_states(), max_size=6), st.integers(min_value=1, max_value=4))
def test_any_tick_gives_a_valid_bounded_document_that_says_what_the_files_say(
    states: list[ContainerState[UsageSnapshot]], cap: int
) -> None:
    containers = {state.key: state for state in states}
    limits = DebugLimits(containers=cap, processes=8, text=64)
    # No pods given: every UID is its own pod (namespace ""), so the order is by UID.
    doc = document(list(containers.values()), limits=limits, pod_source=StaticPodSource())
    body = render(doc)
    assert body.isascii()
    parsed = json.loads(body)
    for text in _strings(parsed):
        text.encode("utf-8")  # strict: no lone surrogate, so any JSON reader takes it
    assert parsed["containers_shown"] == len(parsed["containers"]) == min(cap, len(containers))
    assert parsed["truncated"] == (len(containers) > cap)
    assert len(body) < 4096 + cap * (16 * 300 + 8 * 60 + 8 * 200)
    order = sorted(containers.values(), key=lambda c: (c.pod_uid, c.container_name, c.key.dirname))
    for state, entry in zip(order, parsed["containers"], strict=False):
        assert len(entry["container"]) <= 6 * 64 + 3  # cut, then surrogates spelled out
        assert entry["status"] == state.status.value
        snapshot = state.snapshot
        if snapshot is None:
            assert (entry["devices"], entry["processes"], entry["format"]) == ([], [], None)
            continue
        assert entry["format"] == snapshot.format.value
        assert entry["priority"] == snapshot.priority
        assert [(d["used_bytes"], d["limit_bytes"], d["sm_util"], d["core_limit"])
                for d in entry["devices"]] == [
            (d.memory_total, d.memory_limit, d.sm_util, d.sm_limit) for d in snapshot.devices
        ]  # fmt: skip
        assert entry["processes"] == [
            {"pid": pid, "host_pid": host, "state": "unknown" if host == 0 else None}
            for pid, host in list(zip(snapshot.pids, snapshot.host_pids, strict=True))[:8]
        ]
        assert entry["processes_total"] == len(snapshot.host_pids)
        assert entry["processes_truncated"] == (len(snapshot.host_pids) > 8)
        assert entry["process_states"]["unknown"] == snapshot.host_pids.count(0)


def test_the_feedback_entry_says_whose_gpus_and_priority_counted() -> None:
    seen: list[Any] = []

    def feedback(key: Any, snap: UsageSnapshot) -> Claim:
        seen.append((key.dirname, snap.priority))
        strays = tuple(f"GPU-\\u202e{i}" for i in range(40))  # escaped already; capped here
        return Claim(True, ("GPU-A",), ("GPU-A",), 1, 0, strays, ("uuid", "priority"))

    extras = DebugExtras(feedback=feedback)
    state = loaded("uid-1", "main", two_gpus())
    entry = container_entry(state, POD, pods=K8S, paused=False, extras=extras)
    assert entry["feedback"] == {
        "scoped": True,
        "devices": ["GPU-A"],
        "counted": ["GPU-A"],
        "priority": 1,
        "file_priority": 0,
        "strays": [f"GPU-\\u202e{i}" for i in range(DebugLimits().allocated)],
        "stray_reasons": ["uuid", "priority"],
    }
    assert seen == [("uid-1_main", 0)]
    # Not loaded: no snapshot, nothing counted, the extra is not asked.
    missing: ContainerState[UsageSnapshot] = ContainerState(
        ContainerKey("uid-1", "x"),
        f"{ROOT}/uid-1_x",
        None,
        ContainerStatus.NO_CACHE_FILE,
        None,
        None,
    )
    assert container_entry(missing, POD, pods=K8S, paused=False, extras=extras)["feedback"] is None
    assert len(seen) == 1
