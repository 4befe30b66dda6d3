"""FeedbackScope: grants per loaded container, once per PodInfo; stray claims counted, logged."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest
from prometheus_client import CollectorRegistry

from hami_trio.monitor.feedback import Grant, Observed, observe
from hami_trio.monitor.scope import FeedbackScope, StrayStats, uuid_text
from hami_trio.monitor.state import ContainerKey
from hami_trio.monitor.stats import StrayCollector
from hami_trio.pods.source import PodInfo, StaticPodSource


def gpu(name: str) -> bytes:
    return name.encode().ljust(96, b"\0")


class Pods:
    """A pod source whose pods a test replaces (as the watch publishes a new PodInfo)."""

    def __init__(self, *pods: PodInfo) -> None:
        self.pods = {pod.uid: pod for pod in pods}

    ready = True
    authoritative = True

    def lookup(self, uid: str) -> PodInfo | None:
        return self.pods.get(uid)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


POD = PodInfo("u1", "ns", "trainer", containers=("main", "side"), annotations={"a": "1"})
KEY = ContainerKey("u1", "main")


def make(
    pods: Pods, grants_of: object = None
) -> tuple[FeedbackScope, CollectorRegistry, Clock, list[str]]:
    calls: list[str] = []

    def default(pod: PodInfo) -> Mapping[str, Grant] | None:
        calls.append(pod.uid)
        if "a" not in pod.annotations:
            return None
        return {"main": Grant((gpu("A"),), 1)}

    registry, clock, stats = CollectorRegistry(), Clock(), StrayStats()
    registry.register(StrayCollector(stats))
    scope = FeedbackScope(pods, default if grants_of is None else grants_of, stats, clock=clock)  # type: ignore[arg-type]
    return scope, registry, clock, calls


def test_grants_once_per_pod_object_and_none_for_unknown_or_unannotated_pods() -> None:
    pods = Pods(POD, PodInfo("u2", "ns", "plain", containers=("main",)))
    scope, _, _, calls = make(pods)
    keys = [KEY, ContainerKey("u1", "side"), ContainerKey("u2", "main"), ContainerKey("gone", "x")]
    found = scope.grants(keys)
    assert found == {
        KEY: Grant((gpu("A"),), 1),
        ContainerKey("u1", "side"): Grant(()),  # annotated pod, nothing for it: no GPU
    }
    assert calls == ["u1", "u2"]  # once per pod, not per container
    scope.grants(keys)
    assert calls == ["u1", "u2"]  # same PodInfo objects: cached
    pods.pods["u1"] = PodInfo("u1", "ns", "trainer", containers=("main",), annotations={"a": "2"})
    scope.grants(keys)
    assert calls == ["u1", "u2", "u1"]
    # Pods with no loaded container are forgotten.
    scope.grants([])
    scope.grants([KEY])
    assert calls == ["u1", "u2", "u1", "u1"]


def test_without_kubernetes_there_are_no_grants() -> None:
    scope = FeedbackScope(StaticPodSource(), None, StrayStats(), clock=lambda: 0.0)
    assert not scope.enabled
    assert scope.grants([KEY]) == {}
    claim = scope.claim(KEY, Observed(0, 2, 0, (gpu("B"),)))
    assert (claim.scoped, claim.counted, claim.priority, claim.strays) == (False, ("B",), 0, ())


def test_update_gives_observe_only_the_grants_of_stray_claims() -> None:
    pods = Pods(POD, PodInfo("u2", "ns", "b", containers=("main",), annotations={"a": "1"}))
    scope, _, _, _ = make(pods)
    honest, liar = KEY, ContainerKey("u2", "main")
    node = {honest: Observed(1, 2, 0, (gpu("A"),)), liar: Observed(0, 2, 0, (gpu("A"),))}
    changed = scope.update(node)
    assert changed == {liar: Grant((gpu("A"),), 1)}
    assert observe(node, changed) == observe(node, scope.grants(node))
    assert scope.claim(honest, node[honest]).scoped  # published for the view all the same


def sample(registry: CollectorRegistry, name: str, reason: str) -> float | None:
    return registry.get_sample_value(f"hami_trio_monitor_stray_claim{name}", {"reason": reason})


def test_a_stray_claim_is_counted_once_logged_once_and_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scope, registry, clock, _ = make(Pods(POD))
    liar = {KEY: Observed(0, 2, 0, (gpu("B"), gpu("A")))}
    honest = {KEY: Observed(1, 2, 0, (gpu("A"),))}
    assert sample(registry, "_containers", "uuid") == 0
    with caplog.at_level(logging.WARNING, logger="hami_trio"):
        for _ in range(3):
            scope.note(liar, scope.grants(liar))
    assert sample(registry, "_containers", "uuid") == 1
    assert sample(registry, "_containers", "priority") == 1
    assert sample(registry, "s_total", "uuid") == 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "container ns/trainer/main: its .cache file claims GPU B, which its pod's allocation "
        "does not list; the feedback counts it only on its allocated A",
        "container ns/trainer/main: its .cache file says priority 0, its pod spec 1; the "
        "feedback counts 1",
    ]
    claim = scope.claim(KEY, liar[KEY])
    assert (claim.devices, claim.counted, claim.strays) == (("A",), ("A",), ("B",))
    assert (claim.priority, claim.file_priority, claim.stray_reasons) == (
        1,
        0,
        ("uuid", "priority"),
    )
    # Honest again: the gauge drops; a new stray claim counts again, but its warning waits
    # for the rate limit (ten minutes per container and reason).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hami_trio"):
        scope.note(honest, scope.grants(honest))
        assert sample(registry, "_containers", "uuid") == 0
        assert scope.claim(KEY, honest[KEY]).stray_reasons == ()
        clock.now = 60.0
        scope.note(liar, scope.grants(liar))
        assert sample(registry, "s_total", "uuid") == 2
        assert caplog.records == []
        scope.note(honest, scope.grants(honest))
        clock.now = 700.0
        scope.note(liar, scope.grants(liar))
    assert len(caplog.records) == 2
    assert sample(registry, "s_total", "uuid") == 3


def test_uuid_text_is_ascii_and_shows_what_the_slot_holds() -> None:
    assert uuid_text(gpu("GPU-1")) == "GPU-1"
    assert uuid_text("GPU-\u202e".encode().ljust(96, b"\0")) == "GPU-\\u202e"
    assert uuid_text(b"GPU\0junk".ljust(96, b"\0")) == "GPU\\x00junk"
    assert uuid_text(b"\xff\n".ljust(96, b"\0")) == "\\xff\\n"
