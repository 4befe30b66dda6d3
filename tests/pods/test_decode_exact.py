"""The Kubernetes decoders' outputs and messages, pinned exactly.

test_decode.py checks the decoders against the API's shapes; these tests pin each field's
default, the 32-character phase cut, the kept keys, the surrogate rule, the
200- and 1000-character cuts of a Status message and the words of each refusal (the watch
logs them when it relists).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.pods.decode import (
    MAX_PHASE_CHARS,
    KeepRules,
    WatchDecodeError,
    WatchEvent,
    apply_watch_event,
    parse_pod_list,
    parse_status,
    parse_watch_event,
    pod_info_from_object,
)
from hami_trio.pods.source import PodInfo

POD: dict[str, Any] = {
    "metadata": {
        "uid": "u-1",
        "namespace": "team",
        "name": "p",
        "resourceVersion": "7",
        "annotations": {ALLOCATED_ANNOTATION: "1", "other/b": "2"},
        "labels": {"hami.io/vgpu-node": "n", "app": "x"},
    },
    "spec": {"containers": [{"name": "main"}], "initContainers": [{"name": "setup"}]},
    "status": {"phase": "Running"},
}
INFO = PodInfo(
    uid="u-1",
    namespace="team",
    name="p",
    containers=("main",),
    init_containers=("setup",),
    annotations={ALLOCATED_ANNOTATION: "1"},
    labels={"hami.io/vgpu-node": "n"},
    phase="Running",
)


def refusal(call: Any, *args: Any) -> str:
    with pytest.raises(WatchDecodeError) as info:
        call(*args)
    return str(info.value)


def test_a_whole_pod() -> None:
    assert pod_info_from_object(POD) == INFO
    wider = KeepRules(labels=frozenset({"app"}), annotations=frozenset({"other/b", "x/c"}))
    kept = pod_info_from_object(POD, keep=wider)
    assert (kept.labels, kept.annotations) == ({"app": "x"}, {"other/b": "2"})


def test_the_minimal_pod_has_empty_fields() -> None:
    assert pod_info_from_object({"metadata": {"uid": "u"}}) == PodInfo(
        uid="u", namespace="", name=""
    )
    wrong = {
        "metadata": {"uid": "u", "namespace": 1, "name": [], "annotations": [], "labels": "x"},
        "spec": [],
        "status": {"phase": 3},
    }
    assert pod_info_from_object(wrong) == PodInfo(uid="u", namespace="", name="")
    assert pod_info_from_object({"metadata": {"uid": "u"}, "status": "x"}).phase == ""
    assert (
        pod_info_from_object({"metadata": {"uid": "u"}, "spec": {"containers": {}}}).containers
        == ()
    )


def test_malformed_entries_are_left_out() -> None:
    pod = {
        "metadata": {"uid": "u", "labels": {"ok": "1", "n": 2, "l": None}},
        "spec": {"containers": [{"name": "a"}, {"name": 1}, "b", {}, {"name": "c"}]},
    }
    info = pod_info_from_object(pod, keep=KeepRules(labels=frozenset({"ok", "n", "l"})))
    assert info.containers == ("a", "c")
    assert info.labels == {"ok": "1"}


def test_the_phase_is_cut_at_32_characters() -> None:
    assert MAX_PHASE_CHARS == 32
    for length, kept in ((32, 32), (33, 32), (5, 5)):
        pod = {"metadata": {"uid": "u"}, "status": {"phase": "P" * length}}
        assert pod_info_from_object(pod).phase == "P" * kept


def test_lone_surrogates_become_replacement_characters_everywhere() -> None:
    s = "x\ud800y"
    pod = {
        "metadata": {
            "uid": s,
            "namespace": s,
            "name": s,
            "labels": {s: s},
            "annotations": {"hami.io/" + s: s},
        },
        "spec": {"containers": [{"name": s}], "initContainers": [{"name": s}]},
        "status": {"phase": s},
    }
    fixed = "x\ufffdy"
    keep = KeepRules(labels=frozenset({s}), annotations=frozenset({"hami.io/" + s}))
    info = pod_info_from_object(pod, keep=keep)
    assert (info.uid, info.namespace, info.name, info.phase) == (fixed,) * 4
    assert info.containers == info.init_containers == (fixed,)
    assert info.labels == {fixed: fixed}
    assert info.annotations == {"hami.io/" + fixed: fixed}
    assert pod_info_from_object({"metadata": {"uid": "\u00e9\U0001f600"}}).uid == "\u00e9\U0001f600"


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "expected a JSON object, got list"),
        (None, "expected a JSON object, got NoneType"),
        ({}, "object has no metadata"),
        ({"metadata": []}, "object has no metadata"),
        ({"metadata": {}}, "pod has no metadata.uid"),
        ({"metadata": {"uid": ""}}, "pod has no metadata.uid"),
        ({"metadata": {"uid": 5}}, "pod has no metadata.uid"),
    ],
)
def test_pod_refusals(obj: object, message: str) -> None:
    assert refusal(pod_info_from_object, obj) == message


# -- lists -------------------------------------------------------------------------------------


def test_a_pod_list_and_its_skipped_items() -> None:
    skipped: list[tuple[int, str]] = []
    body = json.dumps(
        {"metadata": {"resourceVersion": "42"}, "items": [POD, {"metadata": {}}, 3, POD]}
    )
    rv, pods = parse_pod_list(body, on_skip=lambda i, e: skipped.append((i, str(e))))
    assert (rv, pods) == ("42", (INFO, INFO))
    assert skipped == [(1, "pod has no metadata.uid"), (2, "expected a JSON object, got int")]
    assert parse_pod_list(body.encode()) == ("42", (INFO, INFO))  # no on_skip: still kept
    wider = KeepRules(annotations=frozenset({ALLOCATED_ANNOTATION, "other/b"}))
    everything = parse_pod_list(body, keep=wider)[1][0].annotations
    assert everything == {ALLOCATED_ANNOTATION: "1", "other/b": "2"}


def test_null_items_is_an_empty_list() -> None:
    assert parse_pod_list('{"metadata": {"resourceVersion": "1"}, "items": null}') == ("1", ())
    assert parse_pod_list('{"metadata": {"resourceVersion": "1"}}') == ("1", ())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("x", "pod list is not JSON: expected '{' at 0, got 'x'"),
        (b"\xff", "pod list is not JSON: "),
        ("[" * 100_000, "pod list is not JSON: expected '{' at 0, got '['"),
        ("[]", "pod list is not JSON: expected '{' at 0, got '['"),
        ('{"metadata": {}}', "pod list has no metadata.resourceVersion"),
        ('{"metadata": {"resourceVersion": ""}}', "pod list has no metadata.resourceVersion"),
        ('{"metadata": {"resourceVersion": 1}}', "pod list has no metadata.resourceVersion"),
        ('{"metadata": {"resourceVersion": "1"}, "items": {}}', "pod list items is not a list"),
    ],
)
def test_list_refusals(body: str | bytes, message: str) -> None:
    words = refusal(parse_pod_list, body)
    assert words.startswith(message) if message.endswith(": ") else words == message


# -- Status bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"code": 410, "reason": "Expired", "message": "too old"}', (410, "Expired: too old")),
        ('{"code": 410, "reason": "Expired"}', (410, "Expired")),
        ('{"code": 410, "message": "too old"}', (410, "too old")),
        ('{"code": true, "reason": "r"}', (None, "r")),
        ('{"code": "410", "reason": "r"}', (None, "r")),
        ('{"reason": 7, "message": ""}', (None, "7")),
        ("{}", (None, "")),
        ("  not json \n", (None, "not json")),
        (b"\xffbody", (None, "\ufffdbody")),
        ("[1]", (None, "[1]")),
        ("[" * 100_000, (None, "[" * 200)),
        ("y" * 300, (None, "y" * 200)),
    ],
)
def test_status_bodies(body: str | bytes, expected: tuple[int | None, str]) -> None:
    assert parse_status(body) == expected


def test_status_parts_are_cut_at_1000_characters() -> None:
    body = json.dumps({"reason": "r" * 1001, "message": "m" * 1000})
    assert parse_status(body) == (None, "r" * 1000 + ": " + "m" * 1000)
    assert parse_status(json.dumps({"message": "x\ud800"})) == (None, "x\ufffd")


# -- watch events ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", "DELETED"])
def test_object_events(kind: str) -> None:
    event = parse_watch_event(json.dumps({"type": kind, "object": POD}))
    assert event == WatchEvent(type=kind, resource_version="7", pod=INFO)  # type: ignore[arg-type]
    no_rv = {**POD, "metadata": {**POD["metadata"], "resourceVersion": 7}}
    assert parse_watch_event(json.dumps({"type": kind, "object": no_rv})).resource_version == ""
    wider = KeepRules(annotations=frozenset({ALLOCATED_ANNOTATION, "other/b"}))
    everything = parse_watch_event(json.dumps({"type": kind, "object": POD}), keep=wider)
    assert everything.pod is not None
    assert len(everything.pod.annotations) == 2


def test_bookmark_and_error_events() -> None:
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}
    assert parse_watch_event(json.dumps(bookmark)) == WatchEvent(
        type="BOOKMARK", resource_version="9"
    )
    error = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "old"}}
    assert parse_watch_event(json.dumps(error).encode()) == WatchEvent(
        type="ERROR", code=410, message="Expired: old"
    )
    assert parse_watch_event('{"type": "ERROR"}') == WatchEvent(type="ERROR", message="null")
    assert parse_watch_event('{"type": "ERROR", "object": "gone"}') == WatchEvent(
        type="ERROR", message='"gone"'
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[]", "watch event is not a JSON object"),
        ("{}", "watch event type is not a string: NoneType"),
        ('{"type": 1}', "watch event type is not a string: int"),
        ('{"type": "added"}', "unknown watch event type 'added'"),
        (json.dumps({"type": "Z" * 50}), f"unknown watch event type {'Z' * 40!r}"),
        (
            '{"type": "BOOKMARK", "object": {"metadata": {}}}',
            "bookmark without metadata.resourceVersion",
        ),
        (
            '{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": ""}}}',
            "bookmark without metadata.resourceVersion",
        ),
        ('{"type": "BOOKMARK", "object": {}}', "object has no metadata"),
        ('{"type": "ADDED", "object": {"metadata": {}}}', "pod has no metadata.uid"),
        (
            "{",
            "watch event is not JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
    ],
)
def test_event_refusals(line: str, message: str) -> None:
    assert refusal(parse_watch_event, line) == message


def test_apply_events() -> None:
    other = PodInfo(uid="u-2", namespace="n", name="q")
    pods = {"u-2": other}
    added = apply_watch_event(pods, WatchEvent(type="ADDED", pod=INFO))
    assert added == {"u-2": other, "u-1": INFO}
    assert pods == {"u-2": other}
    changed = PodInfo(uid="u-1", namespace="team", name="p", phase="Succeeded")
    assert apply_watch_event(added, WatchEvent(type="MODIFIED", pod=changed))["u-1"] == changed
    assert apply_watch_event(added, WatchEvent(type="DELETED", pod=INFO)) == {"u-2": other}
    assert apply_watch_event(pods, WatchEvent(type="DELETED", pod=INFO)) == pods
    bookmark = apply_watch_event(added, WatchEvent(type="BOOKMARK", resource_version="1"))
    assert bookmark == added
    assert bookmark is not added


@pytest.mark.parametrize("error", [RecursionError, ValueError])
def test_an_error_object_the_encoder_cannot_write_gives_an_empty_message(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    # Deeper than json.dumps' stack (the decoder's and the encoder's limits are close, so
    # the failure is injected): the event is still an ERROR, with no code and no message.
    def refuse(obj: object) -> str:
        raise error("too deep")

    line = json.dumps({"type": "ERROR", "object": {"code": 410, "reason": "Expired"}})
    monkeypatch.setattr(json, "dumps", refuse)
    assert parse_watch_event(line) == WatchEvent(type="ERROR", code=None, message="")


def test_fields_an_event_does_not_carry_are_empty() -> None:
    bookmark = parse_watch_event(
        json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    )
    assert (bookmark.pod, bookmark.code, bookmark.message) == (None, None, "")
    error = parse_watch_event('{"type": "ERROR", "object": {"code": 500}}')
    assert (error.resource_version, error.pod, error.code, error.message) == ("", None, 500, "")
    added = parse_watch_event(json.dumps({"type": "ADDED", "object": POD}))
    assert (added.code, added.message) == (None, "")
