from __future__ import annotations

from hami_trio.pods.source import PodInfo, PodSource, StaticPodSource


def test_without_pods_every_uid_is_an_anonymous_live_pod_and_nothing_is_authoritative() -> None:
    source: PodSource = StaticPodSource()
    assert source.ready
    assert not source.authoritative
    assert source.lookup("abc") == PodInfo(uid="abc", namespace="", name="abc")


def test_with_pods_unknown_uids_are_gone() -> None:
    pod = PodInfo(uid="u1", namespace="ns", name="p", containers=("main",))
    source = StaticPodSource([pod])
    assert source.authoritative
    assert source.lookup("u1") is pod
    assert source.lookup("u2") is None


def test_pod_info_is_immune_to_later_mutation_of_its_inputs() -> None:
    annotations = {"a": "1"}
    pod = PodInfo(uid="u", namespace="n", name="p", annotations=annotations)
    annotations["a"] = "2"
    assert pod.annotations["a"] == "1"
    assert pod == PodInfo(uid="u", namespace="n", name="p", annotations={"a": "1"})
