"""export_state: every state, the order of the checks, and reasons that name the cause."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_trio.metrics.exportstate import (
    EXPORT_STATES,
    NODE_LABEL,
    ExportDecision,
    export_state,
)
from hami_trio.pods.source import PodInfo
from tests.strategies.metrics import hostile_text


@dataclass(frozen=True)
class Rejected:
    reason: str = "magic"
    message: str = "/h/containers/u_main/x.cache: magic 0x0"


@dataclass(frozen=True)
class Dir:
    pod_uid: str = "u"
    container_name: str = "main"
    snapshot: object | None = object()
    rejection: Rejected | None = None


def pod(**kwargs: object) -> PodInfo:
    fields: dict[str, object] = {
        "uid": "u",
        "namespace": "team-a",
        "name": "trainer-0",
        "containers": ("main",),
        "init_containers": ("setup",),
        "labels": {NODE_LABEL: "node-a"},
        "phase": "Running",
    }
    fields.update(kwargs)
    return PodInfo(**fields)  # type: ignore[arg-type]


def decide(
    container: Dir, found: PodInfo | None, *, kubernetes: bool = True, paused: bool = False
) -> ExportDecision:
    return export_state(container, found, node_name="node-a", kubernetes=kubernetes, paused=paused)


def test_a_loaded_container_of_a_running_pod_is_exported() -> None:
    decision = decide(Dir(), pod())
    assert (decision.state, decision.exported) == ("exported", True)
    assert decision.pod == pod()


@pytest.mark.parametrize(
    ("container", "found", "state", "words"),
    [
        (Dir(), None, "no_pod", "'u' is not known"),
        (Dir(), pod(labels={}), "no_pod", "not labelled hami.io/vgpu-node='node-a' (label missing"),
        (Dir(), pod(labels={NODE_LABEL: "node-b"}), "no_pod", "(label 'node-b')"),
        (Dir(container_name="gone"), pod(), "no_pod", "has no container 'gone'"),
        (Dir(container_name="setup"), pod(), "completed", "init container"),
        (Dir(), pod(phase="Succeeded"), "completed", "is Succeeded"),
        (Dir(), pod(phase="Failed"), "completed", "is Failed"),
        (Dir(snapshot=None, rejection=Rejected()), pod(), "rejected", "(magic): /h/containers"),
        (Dir(snapshot=None), pod(), "no_cache_file", "cuInit"),
    ],
)
def test_why_a_container_is_not_exported(
    container: Dir, found: PodInfo | None, state: str, words: str
) -> None:
    decision = decide(container, found)
    assert decision.state == state
    assert not decision.exported
    assert words in decision.reason
    if state != "no_pod":
        assert decision.pod is found  # the debug view can still name the pod


def test_pod_checks_come_before_the_file_and_the_pause() -> None:
    bad_file = Dir(snapshot=None, rejection=Rejected())
    assert decide(bad_file, None, paused=True).state == "no_pod"
    assert decide(bad_file, pod(phase="Failed"), paused=True).state == "completed"
    assert decide(bad_file, pod(), paused=True).state == "rejected"
    assert decide(Dir(snapshot=None), pod(), paused=True).state == "no_cache_file"


def test_the_pause_keeps_rows_exported_and_says_so() -> None:
    decision = decide(Dir(), pod(), paused=True)
    assert (decision.state, decision.exported) == ("paused", True)
    assert "MIG lock" in decision.reason


def test_without_kubernetes_labels_containers_and_phase_are_not_checked() -> None:
    anonymous = PodInfo(uid="u", namespace="", name="u")
    assert decide(Dir(container_name="anything"), anonymous, kubernetes=False).exported
    # A static source with pods (tests, the benchmark) still reports unknown UIDs.
    assert decide(Dir(), None, kubernetes=False).state == "no_pod"


@given(
    uid=hostile_text(200),
    name=hostile_text(200),
    label=st.none() | hostile_text(200),
    phase=hostile_text(12) | st.sampled_from(["Succeeded", "Failed", "Running", ""]),
    loaded=st.booleans(),
    rejected=st.booleans(),
    paused=st.booleans(),
    kubernetes=st.booleans(),
)
def test_any_input_gives_one_state_and_a_short_printable_reason(
    uid: str,
    name: str,
    label: str | None,
    phase: str,
    loaded: bool,
    rejected: bool,
    paused: bool,
    kubernetes: bool,
) -> None:
    labels = {} if label is None else {NODE_LABEL: label}
    found = PodInfo(
        uid=uid, namespace=name, name=name, containers=(name,), labels=labels, phase=phase
    )
    container = Dir(
        uid, name, object() if loaded else None, Rejected(message="m") if rejected else None
    )
    decision = decide(container, found, kubernetes=kubernetes, paused=paused)
    assert decision.state in EXPORT_STATES
    assert decision.exported == (decision.state in ("exported", "paused"))
    assert decision.reason.isascii()
    assert decision.reason.isprintable()
    assert len(decision.reason) < 400
