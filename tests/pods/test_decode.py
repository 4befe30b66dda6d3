"""The pure decoders of the Kubernetes wire format (hami_trio.pods.decode)."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given

from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.pods.decode import (
    MAX_PHASE_CHARS,
    Cut,
    KeepRules,
    PodBudget,
    PodListDecoder,
    WatchDecodeError,
    WatchEvent,
    apply_watch_event,
    held_bytes,
    parse_pod_list,
    parse_status,
    parse_watch_event,
    pod_info_from_object,
)
from hami_trio.pods.source import PodInfo
from tests.strategies import metrics as st_metrics

# Pure parts --------------------------------------------------------------------------------


def _pod(uid: str = "u1", **meta: object) -> dict[str, object]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": "p", "resourceVersion": "7", **meta},
        "spec": {
            "containers": [{"name": "a"}, {"name": "b"}, {"image": "no-name"}, "junk"],
            "initContainers": [{"name": "init"}],
        },
    }


def test_pod_info_keeps_what_the_monitor_uses() -> None:
    obj = _pod(
        annotations={
            "hami.io/vgpu-mig-allocations": "[]",
            "kubectl.kubernetes.io/last-applied-configuration": "x" * 1000,
            "hami.io/n": 3,
        },
        labels={"hami.io/vgpu-node": "node-a", "app": "x", "bad": None},
    )
    info = pod_info_from_object(obj)
    assert info == PodInfo(
        uid="u1",
        namespace="ns",
        name="p",
        containers=("a", "b"),
        init_containers=("init",),
        annotations={"hami.io/vgpu-mig-allocations": "[]"},
        labels={"hami.io/vgpu-node": "node-a"},  # only the allow-listed labels
    )
    wider = KeepRules().with_labels(["app", "bad"])
    assert pod_info_from_object(obj, keep=wider).labels == {
        "hami.io/vgpu-node": "node-a",
        "app": "x",
    }


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({"phase": "Succeeded"}, "Succeeded"),
        ({"phase": "Running", "containerStatuses": []}, "Running"),
        ({"phase": "P" * 500}, "P" * MAX_PHASE_CHARS),  # bounded like every kept string
        ({"phase": "Run\ud800"}, "Run\ufffd"),
        ({"phase": 3}, ""),
        ({}, ""),
        ("Running", ""),
        (None, ""),
    ],
)
def test_pod_phase_is_bounded_text(status: object, phase: str) -> None:
    obj = _pod() | {"status": status}
    assert pod_info_from_object(obj).phase == phase
    assert pod_info_from_object(_pod()).phase == ""  # no status at all


@pytest.mark.parametrize(
    "obj",
    [None, [], {"spec": {}}, {"metadata": []}, {"metadata": {"uid": ""}}, {"metadata": {"uid": 5}}],
)
def test_pod_without_uid_is_rejected(obj: object) -> None:
    with pytest.raises(WatchDecodeError):
        pod_info_from_object(obj)


def test_parse_pod_list() -> None:
    body = json.dumps(
        {"kind": "PodList", "metadata": {"resourceVersion": "42"}, "items": [_pod("a"), _pod("b")]}
    )
    rv, pods = parse_pod_list(body)
    assert rv == "42"
    assert [p.uid for p in pods] == ["a", "b"]
    assert parse_pod_list(b'{"metadata": {"resourceVersion": "1"}, "items": null}') == ("1", ())


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"items": []}',
        b'{"metadata": {"resourceVersion": ""}, "items": []}',
        b'{"metadata": {"resourceVersion": "1"}, "items": {}}',
        b'{"metadata": {"resourceVersion": "1"}, "items": ' + b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_parse_pod_list_rejects_malformed(body: bytes) -> None:
    with pytest.raises(WatchDecodeError):
        parse_pod_list(body)


def test_parse_pod_list_leaves_out_bad_items_only() -> None:
    good = {"metadata": {"uid": "a", "name": "a"}}
    other = {"metadata": {"uid": "b", "name": "b"}}
    body = json.dumps(
        {
            "metadata": {"resourceVersion": "7"},
            "items": [good, {"metadata": {}}, 5, {"metadata": {"uid": 3}}, other],
        }
    )
    skipped: list[tuple[int, str]] = []
    rv, pods = parse_pod_list(body, on_skip=lambda i, exc: skipped.append((i, str(exc))))
    assert rv == "7"
    assert [pod.uid for pod in pods] == ["a", "b"]
    assert skipped == [
        (1, "pod has no metadata.uid"),
        (2, "expected a JSON object, got int"),
        (3, "pod has no metadata.uid"),
    ]
    assert parse_pod_list(body)[1] == pods  # without a callback, the same


def test_pod_decoder_replaces_lone_surrogates_like_go() -> None:
    # The escapes are JSON text: json.loads turns them into lone surrogates.
    raw = (
        '{"metadata": {"uid": "u\\ud800", "namespace": "ns\\udcff", "name": "p\\ud800",'
        ' "labels": {"k\\ud800": "v\\udfff"},'
        ' "annotations": {"hami.io/x": "\\ud800\\ud83d\\ude00"}},'
        ' "spec": {"containers": [{"name": "c\\ud800"}], "initContainers": [{"name": 1}]}}'
    )
    keep = KeepRules(labels=frozenset({"k\ud800"}), annotations=frozenset({"hami.io/x"}))
    pod = pod_info_from_object(json.loads(raw), keep=keep)
    assert pod == PodInfo(
        uid="u\ufffd",
        namespace="ns\ufffd",
        name="p\ufffd",
        containers=("c\ufffd",),
        init_containers=(),
        labels={"k\ufffd": "v\ufffd"},
        annotations={"hami.io/x": "\ufffd\U0001f600"},  # a real pair stays what it spells
    )


@pytest.mark.parametrize(
    "line",
    [
        b'{"type": [], "object": {}}',
        b'{"type": {"a": 1}, "object": {}}',
        b'{"type": "ADDED", "object": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
)
def test_parse_watch_event_rejects_wrong_types_and_deep_nesting(line: bytes) -> None:
    with pytest.raises(WatchDecodeError):
        parse_watch_event(line)


def test_parse_watch_events() -> None:
    added = parse_watch_event(json.dumps({"type": "ADDED", "object": _pod("x")}).encode() + b"\n")
    assert added.type == "ADDED"
    assert added.resource_version == "7"
    assert added.pod is not None
    assert added.pod.uid == "x"
    bookmark = parse_watch_event(
        b'{"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}}'
    )
    assert bookmark == WatchEvent(type="BOOKMARK", resource_version="9")
    error = parse_watch_event(
        json.dumps(
            {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"},
            }
        )
    )
    assert error == WatchEvent(type="ERROR", code=410, message="Expired: old")


@pytest.mark.parametrize(
    "line",
    [
        b"garbage",
        b"[1]",
        b'{"type": "SYNC", "object": {}}',
        b'{"type": "ADDED", "object": {"metadata": {}}}',
        b'{"type": "BOOKMARK", "object": {"metadata": {}}}',
        b'{"type": "DELETED"}',
    ],
)
def test_parse_watch_event_rejects_malformed(line: bytes) -> None:
    with pytest.raises(WatchDecodeError):
        parse_watch_event(line)


@given(st_metrics.watch_lines())
def test_any_watch_line_decodes_or_raises_its_error(line: bytes) -> None:
    try:
        event = parse_watch_event(line)
    except WatchDecodeError:
        return
    assert (event.pod is not None) == (event.type in ("ADDED", "MODIFIED", "DELETED"))


def test_parse_status() -> None:
    assert parse_status(b'{"kind":"Status","code":403,"reason":"Forbidden","message":"no"}') == (
        403,
        "Forbidden: no",
    )
    assert parse_status(b'{"code": true}') == (None, "")
    assert parse_status(b"<html>bad gateway</html>") == (None, "<html>bad gateway</html>")


def test_apply_watch_event_is_idempotent() -> None:
    a = PodInfo(uid="a", namespace="n", name="a")
    a2 = PodInfo(uid="a", namespace="n", name="a", labels={"x": "y"})
    pods: dict[str, PodInfo] = {}
    for event in [
        WatchEvent("ADDED", "1", a),
        WatchEvent("ADDED", "1", a),
        WatchEvent("MODIFIED", "2", a2),
    ]:
        pods = apply_watch_event(pods, event)
    assert pods == {"a": a2}
    before = dict(pods)
    assert apply_watch_event(pods, WatchEvent("DELETED", "3", a)) == {}
    assert pods == before  # the input is never modified
    assert apply_watch_event({}, WatchEvent("DELETED", "3", a)) == {}
    assert apply_watch_event(pods, WatchEvent("BOOKMARK", "4")) == pods


def _exportable(text: str) -> None:
    assert isinstance(text, str)
    text.encode("utf-8")  # no lone surrogate reaches labels or logs


def _check_pod(pod: PodInfo) -> None:
    for text in (pod.uid, pod.namespace, pod.name, pod.phase, *pod.containers):
        _exportable(text)
    for text in pod.init_containers:
        _exportable(text)
    assert len(pod.phase) <= MAX_PHASE_CHARS
    for key, value in (*pod.labels.items(), *pod.annotations.items()):
        _exportable(key)
        _exportable(value)
    assert pod.uid
    assert set(pod.annotations) <= KeepRules().annotations
    assert set(pod.labels) <= KeepRules().labels
    assert held_bytes(pod) <= KeepRules().max_pod_bytes


@given(st_metrics.pod_objects())
def test_any_pod_object_decodes_to_exportable_text_or_raises_its_error(obj: object) -> None:
    try:
        pod = pod_info_from_object(obj)
    except WatchDecodeError:
        return
    _check_pod(pod)


@given(st_metrics.pod_lists())
def test_a_bad_pod_costs_itself_never_the_list(body: str) -> None:
    skipped: list[int] = []
    rv, pods = parse_pod_list(body, on_skip=lambda index, exc: skipped.append(index))
    assert rv == "9"
    assert len(pods) + len(skipped) == len(json.loads(body)["items"])
    for pod in pods:
        _check_pod(pod)


@given(st_metrics.pod_objects(), st_metrics.hostile_text())
def test_any_watch_event_with_a_hostile_pod_decodes_or_raises_its_error(
    obj: object, kind: str
) -> None:
    for event_type in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", kind):
        line = json.dumps({"type": event_type, "object": obj}).encode()
        try:
            event = parse_watch_event(line)
        except WatchDecodeError:
            continue
        if event.pod is not None:
            _check_pod(event.pod)
        _exportable(event.resource_version)
        _exportable(event.message)


# What is kept: caps, cuts, budgets, the incremental list decoder ------------------------------


def test_only_kept_keys_within_their_caps_are_kept_and_every_cut_is_reported() -> None:
    keep = KeepRules(max_label_bytes=8, max_annotation_bytes=16, max_pod_bytes=10_000)
    obj = _pod(
        labels={"hami.io/vgpu-node": "n" * 9, **{f"l{i}": "v" for i in range(1000)}},
        annotations={ALLOCATED_ANNOTATION: "é" * 9, "hami.io/vgpu-mig-allocations": "[]"},
    )
    cuts: list[Cut] = []
    pod = pod_info_from_object(obj, keep=keep, on_cut=cuts.append)
    assert pod.labels == {}
    assert pod.annotations == {"hami.io/vgpu-mig-allocations": "[]"}
    assert pod.withheld == {ALLOCATED_ANNOTATION}  # it has one, too long to keep
    assert cuts == [
        Cut("annotation-too-long", "ns", "p", ALLOCATED_ANNOTATION, 18),  # UTF-8 bytes
        Cut("label-too-long", "ns", "p", "hami.io/vgpu-node", 9),
    ]


def test_a_pod_over_its_cap_keeps_only_its_identity() -> None:
    obj = _pod(annotations={ALLOCATED_ANNOTATION: "x" * 60_000}) | {"status": {"phase": "Failed"}}
    cuts: list[Cut] = []
    pod = pod_info_from_object(obj, keep=KeepRules(max_pod_bytes=50_000), on_cut=cuts.append)
    assert pod == PodInfo(
        uid="u1",
        namespace="ns",
        name="p",
        phase="Failed",
        withheld=frozenset({ALLOCATED_ANNOTATION}),
    )
    assert [(c.reason, c.key) for c in cuts] == [("pod-too-large", "")]
    assert cuts[0].size > 60_000


def test_budget_cuts_the_largest_pods_first_and_never_drops_one() -> None:
    cuts: list[Cut] = []
    budget = PodBudget(22_000, on_cut=cuts.append)
    small = [
        PodInfo(uid=f"s{i}", namespace="ok", name=f"s{i}", containers=("m",)) for i in range(5)
    ]
    big = [
        PodInfo(uid=f"b{i}", namespace="evil", name=f"b{i}", annotations={"a": "x" * 6000})
        for i in range(5)
    ]
    budget.put(big[0])
    for pod in small:  # arriving after a large pod costs a small one nothing
        budget.put(pod)
    for pod in big[1:]:
        budget.put(pod)
    held = budget.pods()
    assert set(held) == {p.uid for p in small + big}
    assert all(held[p.uid] == p for p in small)
    assert budget.total <= 22_000
    assert sum(held[p.uid] == p for p in big) == 2  # what fits, the rest cut to identity
    assert {c.reason for c in cuts} == {"total-too-large"}
    assert all(held[p.uid].withheld == {"a"} for p in big if held[p.uid] != p)
    assert {c.namespace for c in cuts} == {"evil"}
    budget.remove("b4")
    budget.put(big[4])  # room again: a pod is whole with its next change that fits
    assert budget.pods()["b4"] == big[4]
    assert len(budget) == 10


def _list_body(items: list[object], meta: dict[str, object] | None = None) -> bytes:
    doc = {"kind": "PodList", "metadata": meta or {"resourceVersion": "5"}, "items": items}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("chunk", [1, 7, 64, 100_000])
def test_list_decoder_gives_the_same_pods_in_any_chunks(chunk: int) -> None:
    items: list[object] = [_pod(f"u{i}", labels={"hami.io/vgpu-node": "é" * i}) for i in range(20)]
    items.insert(3, {"metadata": {}})
    body = _list_body(items, {"resourceVersion": "5", "continue": "next", "other": [1, 2.5]})
    skipped: list[int] = []
    decoder = PodListDecoder(on_skip=lambda index, exc: skipped.append(index))
    pods = []
    for start in range(0, len(body), chunk):
        pods += decoder.feed(body[start : start + chunk])
    last, page = decoder.finish()
    pods += last
    assert page.resource_version == "5"
    assert page.continue_token == "next"
    assert skipped == [3]
    assert pods == [pod_info_from_object(item) for item in items if item != {"metadata": {}}]


def test_list_decoder_refuses_an_object_longer_than_its_cap_without_holding_the_rest() -> None:
    decoder = PodListDecoder(max_object_bytes=10_000)
    decoder.feed(b'{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"uid": "')

    def feed_on() -> None:
        for _ in range(100):
            decoder.feed(b"x" * 1000)

    with pytest.raises(WatchDecodeError, match="longer than 10000"):
        feed_on()


@pytest.mark.parametrize(
    "body",
    [
        b'{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"uid": "a"}}',
        b'{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {"uid": "a"}},]}',
        b'{"metadata": {"resourceVersion": "1"}, "items": []} {}',
        b'{"metadata": {"resourceVersion": "1"}, "items": [] ,}',
    ],
)
def test_list_decoder_refuses_what_json_refuses(body: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the reference decoder's error
        json.loads(body)
    with pytest.raises(WatchDecodeError):
        parse_pod_list(body)


@example('{"metadata": {"resourceVersion": "9"}, "items": [-0.0]}')  # "-0" ends a chunk
@example('{"metadata": {"resourceVersion": "9"}, "items": [12e3]}')  # "12e" ends one
@given(st_metrics.pod_lists())
def test_list_decoder_in_chunks_equals_the_whole_list(body: str) -> None:
    raw = body.encode("utf-8", "surrogatepass")
    whole = parse_pod_list(raw)
    decoder = PodListDecoder()
    pods = []
    for start in range(0, len(raw), 13):
        pods += decoder.feed(raw[start : start + 13])
    last, page = decoder.finish()
    assert (page.resource_version, (*pods, *last)) == whole


def test_a_watch_event_reports_its_cuts_except_for_a_deleted_pod() -> None:
    obj = _pod(annotations={ALLOCATED_ANNOTATION: "x" * (65 * 1024)})
    for kind, reported in (("ADDED", 1), ("MODIFIED", 1), ("DELETED", 0)):
        cuts: list[Cut] = []
        line = json.dumps({"type": kind, "object": obj})
        event = parse_watch_event(line, on_cut=cuts.append)
        assert event.pod is not None
        assert event.pod.annotations == {}
        assert len(cuts) == reported
