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
    CUT_REASONS,
    MAX_OBJECT_BYTES,
    MAX_PHASE_CHARS,
    Cut,
    KeepRules,
    ListPage,
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


# -- what is kept: caps, rules and the budget, exactly -----------------------------------------


def test_the_default_rules_and_the_reasons() -> None:
    assert MAX_OBJECT_BYTES == 8 * 1024 * 1024 == PodListDecoder().max_object_bytes
    keep = KeepRules()
    assert (keep.max_label_bytes, keep.max_annotation_bytes, keep.max_pod_bytes) == (
        1024,
        65536,
        262144,
    )
    assert CUT_REASONS == (
        "label-too-long",
        "annotation-too-long",
        "pod-too-large",
        "total-too-large",
    )
    assert ListPage("1") == ListPage("1", "")


@pytest.mark.parametrize("name", ["max_label_bytes", "max_annotation_bytes", "max_pod_bytes"])
def test_keep_rules_caps_must_be_positive(name: str) -> None:
    with pytest.raises(ValueError, match=f"^KeepRules.{name} must be > 0$"):
        KeepRules(**{name: 0})  # type: ignore[arg-type]
    assert getattr(KeepRules(**{name: 1}), name) == 1  # type: ignore[arg-type]


def test_with_labels_keeps_every_other_rule() -> None:
    rules = KeepRules(
        labels=frozenset({"a"}),
        annotations=frozenset({"b"}),
        max_label_bytes=5,
        max_annotation_bytes=6,
        max_pod_bytes=7000,
    )
    assert rules.with_labels(["c", "a"]) == KeepRules(
        labels=frozenset({"a", "c"}),
        annotations=frozenset({"b"}),
        max_label_bytes=5,
        max_annotation_bytes=6,
        max_pod_bytes=7000,
    )


def test_a_value_of_exactly_its_cap_is_kept() -> None:
    keep = KeepRules(labels=frozenset({"l"}), max_label_bytes=4, max_annotation_bytes=3)
    obj = {
        "metadata": {
            "uid": "u",
            "labels": {"l": "é" * 2},
            "annotations": {ALLOCATED_ANNOTATION: "abc"},
        }
    }
    cuts: list[Cut] = []
    pod = pod_info_from_object(obj, keep=keep, on_cut=cuts.append)
    assert (dict(pod.labels), dict(pod.annotations), cuts) == (
        {"l": "éé"},
        {ALLOCATED_ANNOTATION: "abc"},
        [],
    )
    obj["metadata"]["labels"] = {"l": "é" * 2 + "x"}
    pod = pod_info_from_object(obj, keep=keep, on_cut=cuts.append)
    assert dict(pod.labels) == {}
    assert cuts == [Cut("label-too-long", "", "", "l", 5)]


def test_held_bytes_is_the_strings_plus_fixed_overheads() -> None:
    bare = PodInfo(uid="u", namespace="n", name="p")
    assert held_bytes(bare) == 512 + 3 * (1 + 64) + 64  # uid, namespace, name, phase ""
    full = PodInfo(
        uid="u",
        namespace="n",
        name="p",
        phase="Running",
        containers=("main",),
        init_containers=("é",),
        labels={"k": "v"},
        annotations={"a": "bc"},
    )
    assert held_bytes(full) == 512 + 3 * 65 + (7 + 64) + (4 + 64) + (2 + 64) + 2 * 65 + 65 + 66


def test_a_pod_of_exactly_its_cap_is_kept_whole_with_its_priorities() -> None:
    obj = {
        "metadata": {"uid": "u", "namespace": "n", "name": "p"},
        "spec": {
            "containers": [
                {"name": "main", "env": [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]},
            ]
        },
    }
    whole = pod_info_from_object(obj)
    assert dict(whole.priorities) == {"main": 0}
    size = held_bytes(whole)
    cuts: list[Cut] = []
    assert (
        pod_info_from_object(obj, keep=KeepRules(max_pod_bytes=size), on_cut=cuts.append) == whole
    )
    assert cuts == []
    cut = pod_info_from_object(obj, keep=KeepRules(max_pod_bytes=size - 1), on_cut=cuts.append)
    assert cut == PodInfo(uid="u", namespace="n", name="p")
    assert cuts == [Cut("pod-too-large", "n", "p", "", size)]


def test_too_deep_json_is_refused_in_words() -> None:
    assert refusal(parse_watch_event, "[" * 100_000) == "watch event is not JSON: nested too deeply"
    body = '{"metadata": {"resourceVersion": "1"}, "items": [' + "[" * 100_000
    assert refusal(parse_pod_list, body) == "pod list is not JSON: nested too deeply"


def _pod_of(uid: str, *, containers: tuple[str, ...] = (), **more: Any) -> PodInfo:
    return PodInfo(uid=uid, namespace="ns", name=uid, containers=containers, **more)


def test_budget_caps_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^PodBudget needs max_bytes > 0$"):
        PodBudget(0)
    one = PodBudget(1)
    assert (one.max_bytes, one.total, len(one)) == (1, 0, 0)


def test_budget_totals_cuts_and_removals_exactly() -> None:
    cuts: list[Cut] = []
    a = _pod_of("a", containers=("x" * 100,))  # 512 + 65 + 66 + 65 + 64 (phase) + 164 = 936
    b = _pod_of("b", containers=("y" * 50,))  # 886
    ident = held_bytes(_pod_of("a"))  # 772
    assert (held_bytes(a), held_bytes(b), ident) == (936, 886, 772)
    budget = PodBudget(936 + 886, on_cut=cuts.append)
    budget.put(a)
    budget.put(b)
    assert (budget.total, cuts) == (936 + 886, [])  # exactly the cap: nothing cut
    budget.put(a)  # the same pod again: counted once
    assert (budget.total, len(budget)) == (936 + 886, 2)
    c = _pod_of("c", init_containers=("z",))  # not an identity: init containers alone
    assert held_bytes(c) == 837
    budget.put(c)  # over: cut to their identities, the largest first, until only they are
    assert cuts == [
        Cut("total-too-large", "ns", "a", "", 936),
        Cut("total-too-large", "ns", "b", "", 886),
        Cut("total-too-large", "ns", "c", "", 837),
    ]
    assert budget.pods() == {"a": _pod_of("a"), "b": _pod_of("b"), "c": _pod_of("c")}
    assert budget.total == 3 * 772
    budget.remove("a")
    budget.remove("nobody")
    assert (budget.total, len(budget)) == (2 * 772, 2)
    budget.put(_pod_of("d", containers=("m",)))  # containers alone: not an identity either
    assert cuts[-1] == Cut("total-too-large", "ns", "d", "", 837)
    assert budget.total == 3 * 772


def test_budget_skips_stale_entries_and_identities() -> None:
    cuts: list[Cut] = []
    budget = PodBudget(2000, on_cut=cuts.append)
    budget.put(_pod_of("s", containers=("x" * 300,)))  # 1136: its entry goes stale
    budget.put(_pod_of("s", containers=("x",)))  # 837
    # "u", then again as an identity of the very same size: an entry that is not stale
    budget.put(_pod_of("u", containers=("x" * 10,)))  # 846
    budget.put(PodInfo(uid="u", namespace="ns", name="u" + "y" * 74))  # 846, identity
    assert budget.total == 837 + 846
    budget.put(_pod_of("v", containers=("c",)))  # 837: over by 520
    # the stale 1136 of "s" and the identity "u" are passed over; "s" and "v" are cut, and
    # the identities left take the total past the cap (only they can)
    assert [(c.name, c.size) for c in cuts] == [("s", 837), ("v", 837)]
    assert budget.total == 772 + 846 + 772


def test_budget_drops_stale_entries_and_still_cuts_the_largest() -> None:
    cuts: list[Cut] = []
    budget = PodBudget(10_000, on_cut=cuts.append)
    # 67 sizes of one pod: 67 entries, 66 of them stale, are more than 2 * 1 + 64, so they
    # are dropped after the last put and the heap rebuilt from what is held
    for i in range(67):
        budget.put(_pod_of("a", containers=("x" * (3000 + i),)))
    budget.put(_pod_of("b", containers=("y" * 2000,)))
    assert cuts == []
    budget.put(_pod_of("c", containers=("z" * 2500,)))  # over: the largest, "a", is cut
    assert cuts == [Cut("total-too-large", "ns", "a", "", 512 + 65 + 66 + 65 + 64 + 3066 + 64)]
    assert budget.total == 772 + held_bytes(_pod_of("b", containers=("y" * 2000,))) + held_bytes(
        _pod_of("c", containers=("z" * 2500,))
    )


# -- the list decoder, exactly -----------------------------------------------------------------

_RV = '{"metadata": {"resourceVersion": "1"}, "items": '


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{}", "object has no metadata"),
        ("{}{}", "pod list is not JSON: extra data at 2"),
        ("{5: 1}", "pod list is not JSON: expected a key at 1"),
        (
            '{"metadata',
            "pod list is not JSON: Unterminated string starting at: line 1 column 1 (char 0)",
        ),
        (
            '{"metadata": {"resourceVersion": "1"',
            "pod list is not JSON: Expecting ',' delimiter: line 1 column 24 (char 23)",
        ),
        (_RV + "5}", "pod list items is not a list"),
        (_RV + "nul", "pod list is not JSON: Expecting value: line 1 column 1 (char 0)"),
        (_RV + "[", "pod list is not JSON: the body ended early"),
        (_RV + "[]} {}", "pod list is not JSON: extra data at 52"),
        ('{"metadata": {}, "items": []}', "pod list has no metadata.resourceVersion"),
    ],
)
def test_list_decoder_refusals_in_words(body: str, message: str) -> None:
    assert refusal(parse_pod_list, body) == message


def test_list_decoder_raises_extra_data_as_soon_as_it_is_fed() -> None:
    for body in (b"{} {}", (_RV + "[]} {}").encode(), (_RV + "null} {}").encode()):
        decoder = PodListDecoder()
        with pytest.raises(WatchDecodeError, match=r"^pod list is not JSON: extra data at \d+$"):
            decoder.feed(body)


def test_list_decoder_takes_a_complete_item_at_the_end_of_a_chunk() -> None:
    decoder = PodListDecoder()
    first = decoder.feed((_RV + '[{"metadata":{"uid":"a"}}').encode())
    assert first == [PodInfo(uid="a", namespace="", name="")]
    # compact separators: nothing between an item's end, the comma and the next item
    assert decoder.feed(b',{"metadata":{"uid":"b"}},{"metadata":{"uid":"c"}}') == [
        PodInfo(uid="b", namespace="", name=""),
        PodInfo(uid="c", namespace="", name=""),
    ]
    assert decoder.feed(b"]}") == []
    assert decoder.finish() == ([], ListPage("1", ""))
    decoder = PodListDecoder()
    decoder.feed((_RV + '[{"metadata":{"uid":"a"}},{"metadata":{"uid":"b"}}]}').encode())
    assert decoder.finish() == ([], ListPage("1", ""))


def test_list_decoder_null_items_split_over_chunks() -> None:
    decoder = PodListDecoder()
    assert decoder.feed((_RV + "nu").encode()) == []
    assert decoder.feed(b"ll}") == []
    assert decoder.finish() == ([], ListPage("1", ""))


def test_list_decoder_reports_cuts_and_keeps_surrogates_as_go_does() -> None:
    keep = KeepRules(labels=frozenset({"l"}), max_label_bytes=2)
    item = '{"metadata": {"uid": "u\ud800", "labels": {"l": "long"}}}'
    cuts: list[Cut] = []
    rv, pods = parse_pod_list(_RV + "[" + item + "]}", keep=keep, on_cut=cuts.append)
    assert (rv, pods) == ("1", (PodInfo(uid="u\ufffd", namespace="", name=""),))
    assert cuts == [Cut("label-too-long", "", "", "l", 4)]
    decoder = PodListDecoder(keep=keep, on_cut=cuts.append)
    # a lone surrogate as UTF-8 bytes ("surrogatepass", as Go's decoder reads it)
    body = (_RV + "[" + item + "]}").encode("utf-8", "surrogatepass")
    assert decoder.feed(body) == [PodInfo(uid="u\ufffd", namespace="", name="")]
    assert len(cuts) == 2


def test_list_decoder_refuses_a_cut_off_utf8_sequence_at_the_end() -> None:
    decoder = PodListDecoder()
    decoder.feed((_RV + "[]}").encode() + b"\xc3")
    with pytest.raises(WatchDecodeError) as info:
        decoder.finish()
    assert str(info.value) == (
        "pod list is not JSON: 'utf-8' codec can't decode byte 0xc3 in position 0: "
        "unexpected end of data"
    )


def test_list_decoder_waits_for_twice_as_much_before_trying_again() -> None:
    decoder = PodListDecoder(max_object_bytes=20)
    # 20 characters of an item after the list's start: not more than the cap
    decoder.feed((_RV + '[{"a": "').encode() + b"x" * 13)
    decoder.feed(b"x" * 19)  # 39: below twice 20, not tried again
    with pytest.raises(WatchDecodeError) as info:
        decoder.feed(b"x")  # 40: tried again, and longer than the cap
    assert str(info.value) == "pod list holds an object longer than 20 bytes"
