"""export_state's reasons word for word, the pod each state carries, and the quoting bounds.

test_exportstate.py checks each state and that a reason names its cause; these tests pin the
whole line an operator reads in ``hami-trio status``, which decisions carry the pod (the
rows' labels), the order of the checks in every pair, and how tenant text is cut at 80
characters without splitting an escape.
"""

from __future__ import annotations

import pytest

from hami_trio.metrics.exportstate import (
    COMPLETED_PHASES,
    EXPORT_STATES,
    NODE_LABEL,
    ExportDecision,
)
from hami_trio.pods.source import PodInfo
from tests.metrics.test_exportstate import Dir, Rejected, decide, pod


def test_the_documented_names() -> None:
    assert NODE_LABEL == "hami.io/vgpu-node"
    assert frozenset({"Succeeded", "Failed"}) == COMPLETED_PHASES
    assert EXPORT_STATES == (
        "exported",
        "paused",
        "no_pod",
        "completed",
        "rejected",
        "no_cache_file",
    )
    exported = {s for s in EXPORT_STATES if ExportDecision(s, "").exported}
    assert exported == {"exported", "paused"}
    assert ExportDecision("exported", "r").pod is None


P = pod()


@pytest.mark.parametrize(
    ("container", "found", "paused", "expected"),
    [
        (Dir(), None, False, ("no_pod", "pod UID 'u' is not known", None)),
        (
            Dir(),
            pod(labels={}),
            False,
            (
                "no_pod",
                "pod 'team-a/trainer-0' is not labelled hami.io/vgpu-node='node-a' (label missing)",
                None,
            ),
        ),
        (
            Dir(),
            pod(labels={NODE_LABEL: "node-b"}),
            False,
            (
                "no_pod",
                "pod 'team-a/trainer-0' is not labelled hami.io/vgpu-node='node-a' "
                "(label 'node-b')",
                None,
            ),
        ),
        (
            Dir(),
            pod(labels={NODE_LABEL: ""}),
            False,
            (
                "no_pod",
                "pod 'team-a/trainer-0' is not labelled hami.io/vgpu-node='node-a' (label '')",
                None,
            ),
        ),
        (
            Dir(container_name="gone"),
            P,
            False,
            ("no_pod", "pod 'team-a/trainer-0' has no container 'gone'", None),
        ),
        (
            Dir(container_name="setup"),
            P,
            False,
            (
                "completed",
                "'setup' is an init container of pod 'team-a/trainer-0' "
                "(only spec.containers are exported, as upstream)",
                P,
            ),
        ),
        (
            Dir(),
            pod(phase="Succeeded"),
            False,
            (
                "completed",
                "pod 'team-a/trainer-0' is Succeeded: its containers have ended",
                pod(phase="Succeeded"),
            ),
        ),
        (
            Dir(),
            pod(phase="Failed"),
            False,
            (
                "completed",
                "pod 'team-a/trainer-0' is Failed: its containers have ended",
                pod(phase="Failed"),
            ),
        ),
        (
            Dir(rejection=Rejected()),
            P,
            True,
            (
                "rejected",
                "cache file refused (magic): /h/containers/u_main/x.cache: magic 0x0",
                P,
            ),
        ),
        (
            Dir(snapshot=None),
            P,
            True,
            (
                "no_cache_file",
                "no .cache file yet (HAMi-core creates it when the container first calls cuInit)",
                P,
            ),
        ),
        (
            Dir(),
            P,
            True,
            ("paused", "the MIG lock pauses the monitor: values are from the last tick", P),
        ),
        (Dir(), P, False, ("exported", "exported", P)),
        (Dir(), pod(phase="Pending"), False, ("exported", "exported", pod(phase="Pending"))),
        (Dir(), pod(phase=""), False, ("exported", "exported", pod(phase=""))),
    ],
)
def test_every_decision_whole(
    container: Dir, found: PodInfo | None, paused: bool, expected: tuple[object, ...]
) -> None:
    assert tuple(decide(container, found, paused=paused)) == expected


def test_without_kubernetes_no_label_container_or_phase_is_checked() -> None:
    bare = PodInfo(uid="u", namespace="", name="u", phase="Succeeded")
    decision = decide(Dir(container_name="anything"), bare, kubernetes=False)
    assert tuple(decision) == ("exported", "exported", bare)
    unknown = decide(Dir(), None, kubernetes=False)
    assert (unknown.state, unknown.pod) == ("no_pod", None)
    rejected = decide(Dir(rejection=Rejected()), bare, kubernetes=False, paused=True)
    assert (rejected.state, rejected.pod) == ("rejected", bare)


def test_an_init_container_also_listed_as_a_container_is_a_container() -> None:
    both = pod(containers=("main",), init_containers=("main",))
    assert decide(Dir(), both).state == "exported"


def test_a_completed_pod_wins_over_a_rejected_file() -> None:
    assert decide(Dir(rejection=Rejected()), pod(phase="Failed")).state == "completed"
    assert decide(Dir(snapshot=None), pod(phase="Succeeded")).state == "completed"


# -- quoting tenant text -----------------------------------------------------------------------


def reason_for_uid(uid: str) -> str:
    return (
        decide(Dir(pod_uid=uid), None).reason.removeprefix("pod UID ").removesuffix(" is not known")
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a" * 80, "'" + "a" * 80 + "'"),
        ("a" * 81, "'" + "a" * 80 + "...'"),
        ("a" * 79 + "\n", "'" + "a" * 79 + "...'"),  # the escape would pass 80: cut before it
        ("a" * 78 + "\n", "'" + "a" * 78 + "\\n'"),
        ("\u00e9" * 80, "'" + "\\xe9" * 20 + "...'"),
        ("\u00e9" * 20, "'" + "\\xe9" * 20 + "'"),
        ("it's", '"it\'s"'),
        ("'" + "a" * 80, "'\\'" + "a" * 78 + "...'"),
        ("\U00010000" * 9, "'" + "\\U00010000" * 8 + "...'"),
        ("", "''"),
    ],
)
def test_tenant_text_is_cut_at_80_characters_as_written(text: str, shown: str) -> None:
    assert reason_for_uid(text) == shown
