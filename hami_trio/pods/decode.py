"""Pure decoders of the Kubernetes wire format: pod lists, watch events, API statuses.

Every function takes bytes or JSON text and returns :class:`~hami_trio.pods.source.PodInfo`
values (only the fields the agent uses); a bad pod costs that pod, never the list.  The watch
(:mod:`hami_trio.pods.watch`) calls them; fuzz and property tests call them directly.

Whoever creates a pod writes its labels and annotations, and can bind it to any node, so what
is kept is bounded by :class:`KeepRules`: only the allow-listed labels and the annotations the
agent decodes, each within a byte cap, and at most ``max_pod_bytes`` per pod (beyond it only
the pod's identity stays); :class:`PodBudget` bounds all pods together, cutting the largest
first.  Every cut is reported as a :class:`Cut`.  :class:`PodListDecoder` reads a list
response incrementally, one item at a time, so a list of huge pods never exists in memory as
a whole.
"""

from __future__ import annotations

import codecs
import heapq
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.pods.migalloc import MIG_ALLOCATIONS_ANNOTATION
from hami_trio.pods.priority import spec_priorities
from hami_trio.pods.source import PodInfo

__all__ = [
    "CUT_REASONS",
    "MAX_OBJECT_BYTES",
    "MAX_PHASE_CHARS",
    "NODE_LABEL",
    "Cut",
    "CutReason",
    "EventType",
    "KeepRules",
    "ListPage",
    "PodBudget",
    "PodListDecoder",
    "WatchDecodeError",
    "WatchEvent",
    "apply_watch_event",
    "held_bytes",
    "parse_pod_list",
    "parse_status",
    "parse_watch_event",
    "pod_info_from_object",
]

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
_OBJECT_EVENTS: Final = frozenset({"ADDED", "MODIFIED", "DELETED"})


class WatchDecodeError(ValueError):
    """A list body or watch line is not what the Kubernetes API sends.

    Raised by the pure decoders; the watch treats it like an expired watch and relists.
    """


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One decoded line of a watch stream.

    ``pod`` is set for ADDED/MODIFIED/DELETED; ``resource_version`` for those and BOOKMARK
    (it may be ``""`` if the server left it out); ``code``/``message`` for ERROR.
    """

    type: EventType
    resource_version: str = ""
    pod: PodInfo | None = None
    code: int | None = None
    message: str = ""


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
#: The longest ``status.phase`` kept (Kubernetes' phases are at most 9 characters).
MAX_PHASE_CHARS: Final = 32
#: The label HAMi's scheduler puts on the pods it binds to a node (the exported selection).
NODE_LABEL: Final = "hami.io/vgpu-node"
#: The longest single object (a list item or a watch line) read, in bytes.  The API server
#: stores at most about 1.5 MiB per object (etcd's limit); anything longer is not what it
#: sends, and reading it whole would cost memory for nothing.
MAX_OBJECT_BYTES: Final = 8 * 1024 * 1024

CutReason = Literal["label-too-long", "annotation-too-long", "pod-too-large", "total-too-large"]
#: Every reason a :class:`Cut` can have (the metric's ``reason`` label values).
CUT_REASONS: Final[tuple[CutReason, ...]] = (
    "label-too-long",
    "annotation-too-long",
    "pod-too-large",
    "total-too-large",
)


@dataclass(frozen=True, slots=True)
class Cut:
    """Something a pod carried that the agent did not keep.

    ``key`` names the label or annotation (``""`` for a whole pod), ``size`` is what it would
    have held, in bytes (the value's for a key, :func:`held_bytes` for a pod).
    """

    reason: CutReason
    namespace: str
    name: str
    key: str
    size: int


@dataclass(frozen=True, slots=True)
class KeepRules:
    """What the agent keeps of a pod.

    Attributes:
        labels: the label keys kept (the node label, plus ``--pod-labels-allowlist``).
        annotations: the annotation keys kept (those the agent decodes).
        max_label_bytes: a longer label value (UTF-8) is left out and reported.
        max_annotation_bytes: a longer annotation value is left out and reported (the
            decoders refuse longer ones anyway; a cut value is never handed on as if whole).
        max_pod_bytes: a pod that would hold more (:func:`held_bytes`) keeps only its
            identity (UID, namespace, name, phase): its directories stay its own, its rows go.
    """

    labels: frozenset[str] = frozenset({NODE_LABEL})
    annotations: frozenset[str] = frozenset({ALLOCATED_ANNOTATION, MIG_ALLOCATIONS_ANNOTATION})
    max_label_bytes: int = 1024
    max_annotation_bytes: int = 64 * 1024
    max_pod_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", frozenset(self.labels))
        object.__setattr__(self, "annotations", frozenset(self.annotations))
        for name in ("max_label_bytes", "max_annotation_bytes", "max_pod_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"KeepRules.{name} must be > 0")

    def with_labels(self, keys: Iterable[str]) -> KeepRules:
        """These rules, also keeping the labels ``keys``."""
        return KeepRules(
            labels=self.labels | frozenset(keys),
            annotations=self.annotations,
            max_label_bytes=self.max_label_bytes,
            max_annotation_bytes=self.max_annotation_bytes,
            max_pod_bytes=self.max_pod_bytes,
        )


_DEFAULT_KEEP: Final = KeepRules()
#: What one kept string costs besides its characters (a CPython str and its reference).
_STRING_OVERHEAD: Final = 64
#: What a PodInfo costs besides its strings (the object, its tuples and mapping proxies).
_POD_OVERHEAD: Final = 512


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def held_bytes(pod: PodInfo) -> int:
    """An estimate of the memory ``pod`` holds: its strings' UTF-8 bytes plus a fixed
    overhead per string and per pod."""
    strings = [
        pod.uid,
        pod.namespace,
        pod.name,
        pod.phase,
        *pod.containers,
        *pod.init_containers,
        *pod.labels.keys(),
        *pod.labels.values(),
        *pod.annotations.keys(),
        *pod.annotations.values(),
    ]
    return _POD_OVERHEAD + sum(_utf8_len(text) + _STRING_OVERHEAD for text in strings)


def _is_identity(pod: PodInfo) -> bool:
    return not (pod.containers or pod.init_containers or pod.labels or pod.annotations)


def _identity(pod: PodInfo) -> PodInfo:
    """Only what names the pod: its container directories stay its own, nothing else; the
    annotations it had are marked withheld (known to exist, values unknown)."""
    return PodInfo(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        phase=pod.phase,
        withheld=pod.withheld | frozenset(pod.annotations),
    )


def _text(value: str) -> str:
    """``value`` with lone surrogates replaced by U+FFFD, as Go's JSON decoder does.

    A JSON string may escape half a UTF-16 pair (``"\\ud800"``); Python keeps it as a code
    point that cannot be encoded as UTF-8, which would break every later use (labels, logs).
    The API server, written in Go, would never send one; we see what it would have stored.
    """
    if value.isascii() or _SURROGATE.search(value) is None:
        return value
    return _SURROGATE.sub("\ufffd", value)


def _kept_map(
    value: object,
    keys: frozenset[str],
    max_bytes: int,
    reason: CutReason,
    cuts: list[tuple[CutReason, str, int]],
) -> dict[str, str]:
    """The entries of ``value`` whose key is one of ``keys`` and whose value fits."""
    if not isinstance(value, dict):
        return {}
    kept = {}
    # Look the wanted keys up instead of walking the map: a pod may carry thousands.
    for key in keys:
        item = value.get(key)
        if not isinstance(item, str):
            continue
        size = _utf8_len(item)
        if size > max_bytes:
            cuts.append((reason, key, size))
            continue
        kept[_text(key)] = _text(item)
    return kept


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        _text(entry["name"])
        for entry in value
        if isinstance(entry, dict) and isinstance(entry.get("name"), str)
    )


def _metadata(obj: object) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise WatchDecodeError(f"expected a JSON object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise WatchDecodeError("object has no metadata")
    return meta


def pod_info_from_object(
    obj: object,
    *,
    keep: KeepRules = _DEFAULT_KEEP,
    on_cut: Callable[[Cut], None] | None = None,
) -> PodInfo:
    """Extract the :class:`PodInfo` the monitor needs from a pod as the API sends it.

    Args:
        obj: the decoded JSON of one ``v1.Pod``.
        keep: which labels and annotations to keep, and the byte caps (:class:`KeepRules`).
        on_cut: told of every label or annotation value over its cap, and of a pod over
            ``keep.max_pod_bytes`` (which then keeps only its identity).

    Returns:
        The pod's UID, namespace, name, container and init container names, the kept
        annotations and labels, ``status.phase`` (cut to :data:`MAX_PHASE_CHARS`) and the
        priority each container's spec sets (:func:`~hami_trio.pods.priority.spec_priorities`).
        Malformed entries (a container without a string name, a non-string label) are left
        out; a field of the wrong type reads as empty; lone surrogates in any string become
        U+FFFD (see :func:`_text`).  Only a missing UID fails: without it the pod cannot be
        named, and no container directory can belong to it.

    Raises:
        WatchDecodeError: not an object, no metadata, or no UID.
    """
    meta = _metadata(obj)
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        raise WatchDecodeError("pod has no metadata.uid")
    namespace = meta.get("namespace")
    name = meta.get("name")
    spec = cast(dict[str, Any], obj).get("spec")
    spec = spec if isinstance(spec, dict) else {}
    status = cast(dict[str, Any], obj).get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    cuts: list[tuple[CutReason, str, int]] = []
    pod = PodInfo(
        uid=_text(uid),
        namespace=_text(namespace) if isinstance(namespace, str) else "",
        name=_text(name) if isinstance(name, str) else "",
        containers=_names(spec.get("containers")),
        init_containers=_names(spec.get("initContainers")),
        annotations=_kept_map(
            meta.get("annotations"),
            keep.annotations,
            keep.max_annotation_bytes,
            "annotation-too-long",
            cuts,
        ),
        labels=_kept_map(
            meta.get("labels"), keep.labels, keep.max_label_bytes, "label-too-long", cuts
        ),
        phase=_text(phase[:MAX_PHASE_CHARS]) if isinstance(phase, str) else "",
        priorities=spec_priorities(spec),
        withheld=frozenset(
            _text(key) for reason, key, _ in cuts if reason == "annotation-too-long"
        ),
    )
    size = held_bytes(pod)
    if size > keep.max_pod_bytes:
        cuts.append(("pod-too-large", "", size))
        pod = _identity(pod)
    if on_cut is not None:
        for reason, key, cut_size in sorted(cuts):
            on_cut(Cut(reason, pod.namespace, pod.name, _text(key), cut_size))
    return pod


class PodBudget:
    """The pods held, with :func:`held_bytes` of all of them at most ``max_bytes``.

    When a pod put in takes the total over the cap, the largest pods are cut to their
    identity (UID, namespace, name, phase), largest first, until it fits again: the pods
    that cost the most lose their rows, never a small one because a large one came earlier,
    and no pod is dropped (its container directories stay its own).  A cut pod is whole
    again with its next change that fits.  Identities are never cut, so only they can take
    the total past the cap.  ``on_cut`` is told of each cut (reason ``total-too-large``).
    """

    def __init__(self, max_bytes: int, *, on_cut: Callable[[Cut], None] | None = None) -> None:
        if not max_bytes > 0:
            raise ValueError("PodBudget needs max_bytes > 0")
        self.max_bytes = max_bytes
        self._on_cut = on_cut
        self._pods: dict[str, PodInfo] = {}
        self._sizes: dict[str, int] = {}
        self._total = 0
        # (-size, uid) of the pods not cut yet; entries whose size changed are stale.
        self._largest: list[tuple[int, str]] = []

    @property
    def total(self) -> int:
        """:func:`held_bytes` of every pod held, together."""
        return self._total

    def pods(self) -> dict[str, PodInfo]:
        """A new ``uid -> PodInfo`` dict of the pods held."""
        return dict(self._pods)

    def __len__(self) -> int:
        return len(self._pods)

    def put(self, pod: PodInfo) -> None:
        """Hold ``pod`` (replacing the one with its UID), then fit the total."""
        self._forget(pod.uid)
        size = held_bytes(pod)
        self._pods[pod.uid] = pod
        self._sizes[pod.uid] = size
        self._total += size
        if not _is_identity(pod):
            heapq.heappush(self._largest, (-size, pod.uid))
        self._fit()

    def remove(self, uid: str) -> None:
        """Stop holding the pod with this UID (if held)."""
        self._forget(uid)

    def _forget(self, uid: str) -> None:
        if uid in self._pods:
            del self._pods[uid]
            self._total -= self._sizes.pop(uid)

    def _fit(self) -> None:
        while self._total > self.max_bytes and self._largest:
            negative, uid = heapq.heappop(self._largest)
            pod = self._pods.get(uid)
            if pod is None or self._sizes[uid] != -negative:
                continue  # gone or changed since: a stale entry
            if _is_identity(pod):
                continue
            cut = _identity(pod)
            size = held_bytes(cut)
            self._pods[uid] = cut
            self._total -= self._sizes[uid] - size
            self._sizes[uid] = size
            if self._on_cut is not None:
                self._on_cut(Cut("total-too-large", pod.namespace, pod.name, "", -negative))
        if len(self._largest) > 2 * len(self._pods) + 64:  # drop stale entries now and then
            self._largest = [
                (-size, uid)
                for uid, size in self._sizes.items()
                if not _is_identity(self._pods[uid])
            ]
            heapq.heapify(self._largest)


def _load_json(data: bytes | str, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WatchDecodeError(f"{what} is not JSON: {exc}") from exc
    except RecursionError as exc:  # nesting deeper than the parser's stack
        raise WatchDecodeError(f"{what} is not JSON: nested too deeply") from exc


@dataclass(frozen=True, slots=True)
class ListPage:
    """What a pod list response says besides its items."""

    resource_version: str
    #: The ``continue`` token of the next page (``""``: this was the last page).
    continue_token: str = ""


_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")
_SCANNER: Final = json.JSONDecoder()
_CONTAINERS: Final = frozenset('{["')
# What may still follow a number that a chunk cut short ("-0" of "-0.5", "1" of "1e3").
_NUMBER_TAIL: Final = re.compile(r"[0-9.eE+-]*")
# States of PodListDecoder.
_START, _KEY_OR_END, _KEY, _COLON, _VALUE, _MEMBER_END = range(6)
_ITEMS, _ITEM_OR_END, _ITEM, _ITEM_END, _DONE = range(6, 11)


class PodListDecoder:
    """Decode a ``PodList`` response incrementally: :meth:`feed` bytes as they arrive, get the
    pods completed so far, then :meth:`finish`.

    Each item is decoded on its own as soon as it is complete and only its
    :class:`PodInfo` is kept, so the memory needed is that of one item (at most
    ``max_object_bytes`` of JSON), whatever the size of the list.  An item that is not a pod
    with a UID is left out and ``on_skip(index, error)`` told; ``on_cut`` as for
    :func:`pod_info_from_object`.
    """

    def __init__(
        self,
        *,
        keep: KeepRules = _DEFAULT_KEEP,
        on_skip: Callable[[int, WatchDecodeError], None] | None = None,
        on_cut: Callable[[Cut], None] | None = None,
        max_object_bytes: int = MAX_OBJECT_BYTES,
    ) -> None:
        self.keep = keep
        self.on_skip = on_skip
        self.on_cut = on_cut
        self.max_object_bytes = max_object_bytes
        self._text_decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        self._buffer = ""
        self._pos = 0
        self._state = _START
        self._key = ""
        self._index = 0
        self._metadata: object = None
        self._wait = 0  # characters needed past _pos before a failed value is tried again
        self._done: list[PodInfo] = []

    def feed(self, data: bytes) -> list[PodInfo]:
        """Take the next bytes of the body; returns the pods they completed."""
        try:
            text = self._text_decoder.decode(data)
        except UnicodeDecodeError as exc:
            raise WatchDecodeError(f"pod list is not JSON: {exc}") from exc
        self._buffer = self._buffer[self._pos :] + text if self._pos else self._buffer + text
        self._pos = 0
        self._run(eof=False)
        done, self._done = self._done, []
        return done

    def finish(self) -> tuple[list[PodInfo], ListPage]:
        """The body has ended: the last pods and the list's metadata.

        Raises:
            WatchDecodeError: not JSON, not a complete list object, no ``items`` list, or no
                resource version.
        """
        try:
            self._buffer = self._buffer[self._pos :] + self._text_decoder.decode(b"", True)
        except UnicodeDecodeError as exc:
            raise WatchDecodeError(f"pod list is not JSON: {exc}") from exc
        self._pos = 0
        self._run(eof=True)
        if self._state != _DONE:
            raise WatchDecodeError("pod list is not JSON: the body ended early")
        meta = _metadata(cast(object, {"metadata": self._metadata}))
        rv = meta.get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise WatchDecodeError("pod list has no metadata.resourceVersion")
        token = meta.get("continue")
        done, self._done = self._done, []
        return done, ListPage(_text(rv), _text(token) if isinstance(token, str) else "")

    def _value(self, eof: bool) -> tuple[object, bool]:
        """Decode the JSON value at ``_pos``; ``(None, False)`` when more input is needed."""
        buffer, pos = self._buffer, self._pos
        available = len(buffer) - pos
        if not eof and available < self._wait:
            return None, False
        try:
            value, end = _SCANNER.raw_decode(buffer, pos)
        except ValueError as exc:
            if eof:
                raise WatchDecodeError(f"pod list is not JSON: {exc}") from exc
            if available > self.max_object_bytes:
                raise WatchDecodeError(
                    f"pod list holds an object longer than {self.max_object_bytes} bytes"
                ) from exc
            self._wait = 2 * available  # try again with twice as much: linear, not quadratic
            return None, False
        except RecursionError as exc:
            raise WatchDecodeError("pod list is not JSON: nested too deeply") from exc
        if not eof and buffer[pos] not in _CONTAINERS and _NUMBER_TAIL.fullmatch(buffer, end):
            return None, False  # a number or literal may go on in the next chunk
        self._wait = 0
        self._pos = end
        return value, True

    def _expect(self, char: str) -> None:
        found = self._buffer[self._pos]
        if found != char:
            raise WatchDecodeError(
                f"pod list is not JSON: expected {char!r} at {self._pos}, got {found!r}"
            )
        self._pos += 1

    def _run(self, *, eof: bool) -> None:
        while True:
            self._pos = cast(re.Match[str], _WHITESPACE.match(self._buffer, self._pos)).end()
            if self._pos >= len(self._buffer):
                return
            char = self._buffer[self._pos]
            state = self._state
            if state == _DONE:
                raise WatchDecodeError(f"pod list is not JSON: extra data at {self._pos}")
            if state in (_ITEMS, _ITEM_OR_END, _ITEM, _ITEM_END):
                more = self._items_step(state, char, eof)
            else:
                more = self._member_step(state, char, eof)
            if not more:
                return

    def _member_step(self, state: int, char: str, eof: bool) -> bool:
        """One step in the list object's own members; False when more input is needed."""
        if state == _START:
            self._expect("{")
            self._state = _KEY_OR_END
        elif state in (_KEY_OR_END, _KEY):
            if char == "}" and state == _KEY_OR_END:
                self._pos += 1
                self._state = _DONE
                return True
            if char != '"':
                raise WatchDecodeError(f"pod list is not JSON: expected a key at {self._pos}")
            key, complete = self._value(eof)
            if not complete:
                return False
            self._key = cast(str, key)
            self._state = _COLON
        elif state == _COLON:
            self._expect(":")
            self._state = _ITEMS if self._key == "items" else _VALUE
        elif state == _VALUE:
            value, complete = self._value(eof)
            if not complete:
                return False
            if self._key == "metadata":
                self._metadata = value
            self._state = _MEMBER_END
        else:  # _MEMBER_END
            if char == ",":
                self._state = _KEY
            else:
                self._expect("}")
                self._state = _DONE
            self._pos += char == ","
        return True

    def _items_step(self, state: int, char: str, eof: bool) -> bool:
        """One step in the ``items`` member; False when more input is needed."""
        if state == _ITEMS:
            if char == "[":
                self._pos += 1
                self._state = _ITEM_OR_END
            elif char == "n":  # Go encodes an empty slice as null in some versions
                value, complete = self._value(eof)
                if not complete:
                    return False
                if value is not None:
                    raise WatchDecodeError("pod list items is not a list")
                self._state = _MEMBER_END
            else:
                raise WatchDecodeError("pod list items is not a list")
        elif state in (_ITEM_OR_END, _ITEM):
            if char == "]" and state == _ITEM_OR_END:
                self._pos += 1
                self._state = _MEMBER_END
                return True
            item, complete = self._value(eof)
            if not complete:
                return False
            self._take(item)
            self._state = _ITEM_END
        elif char == ",":  # _ITEM_END
            self._pos += 1
            self._state = _ITEM
        else:
            self._expect("]")
            self._state = _MEMBER_END
        return True

    def _take(self, item: object) -> None:
        index, self._index = self._index, self._index + 1
        try:
            self._done.append(pod_info_from_object(item, keep=self.keep, on_cut=self.on_cut))
        except WatchDecodeError as exc:
            if self.on_skip is not None:
                self.on_skip(index, exc)


def parse_pod_list(
    body: bytes | str,
    *,
    keep: KeepRules = _DEFAULT_KEEP,
    on_skip: Callable[[int, WatchDecodeError], None] | None = None,
    on_cut: Callable[[Cut], None] | None = None,
) -> tuple[str, tuple[PodInfo, ...]]:
    """Decode a whole ``PodList`` response (with :class:`PodListDecoder`).

    An item that is not a pod with a UID is left out - ``on_skip(index, error)`` is told -
    and the other pods are kept: one bad object costs itself, never the list.  (A pod without
    a UID cannot own a container directory, so leaving it out deletes nothing.)

    Returns:
        The list's ``metadata.resourceVersion`` (where the watch resumes) and its pods.

    Raises:
        WatchDecodeError: not JSON, no ``items`` list or no resource version.
    """
    decoder = PodListDecoder(keep=keep, on_skip=on_skip, on_cut=on_cut)
    pods = decoder.feed(body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body)
    last, page = decoder.finish()
    return page.resource_version, (*pods, *last)


def parse_status(body: bytes | str) -> tuple[int | None, str]:
    """Read ``code`` and a human message from a ``v1.Status`` body (lenient).

    Returns:
        ``(code, "reason: message")``; ``(None, <the body, shortened>)`` when the body is not a
        Status object.
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        return None, _text(text.strip()[:200])
    code = doc.get("code")
    reason = doc.get("reason", "")
    message = doc.get("message", "")
    text = ": ".join(str(part)[:1000] for part in (reason, message) if part)
    return (code if isinstance(code, int) and not isinstance(code, bool) else None), _text(text)


def parse_watch_event(
    line: bytes | str,
    *,
    keep: KeepRules = _DEFAULT_KEEP,
    on_cut: Callable[[Cut], None] | None = None,
) -> WatchEvent:
    """Decode one line of a watch stream (``{"type": ..., "object": ...}``).

    Raises:
        WatchDecodeError: not JSON, an unknown type, a pod without UID, or a bookmark without a
            resource version.
    """
    doc = _load_json(line, "watch event")
    if not isinstance(doc, dict):
        raise WatchDecodeError("watch event is not a JSON object")
    kind = doc.get("type")
    obj = doc.get("object")
    if not isinstance(kind, str):
        raise WatchDecodeError(f"watch event type is not a string: {type(kind).__name__}")
    if kind in _OBJECT_EVENTS:
        # A deleted pod is let go at once: what it carried is not reported again.
        pod = pod_info_from_object(obj, keep=keep, on_cut=None if kind == "DELETED" else on_cut)
        rv = _metadata(obj).get("resourceVersion")
        return WatchEvent(
            type=cast(EventType, kind),
            resource_version=_text(rv) if isinstance(rv, str) else "",
            pod=pod,
        )
    if kind == "BOOKMARK":
        rv = _metadata(obj).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise WatchDecodeError("bookmark without metadata.resourceVersion")
        return WatchEvent(type="BOOKMARK", resource_version=_text(rv))
    if kind == "ERROR":
        try:
            status = json.dumps(obj)
        except (RecursionError, ValueError):  # deeper than the encoder's stack
            status = ""
        code, message = parse_status(status)
        return WatchEvent(type="ERROR", code=code, message=message)
    raise WatchDecodeError(f"unknown watch event type {kind[:40]!r}")


def apply_watch_event(pods: Mapping[str, PodInfo], event: WatchEvent) -> dict[str, PodInfo]:
    """The pod set after one ADDED/MODIFIED/DELETED event (a new dict; ``pods`` is untouched).

    Other event types return an unchanged copy.  Applying the same event twice gives the same
    set, which is what makes a replayed watch (after a reconnect) harmless.
    """
    updated = dict(pods)
    if event.pod is None:
        return updated
    if event.type == "DELETED":
        updated.pop(event.pod.uid, None)
    else:
        updated[event.pod.uid] = event.pod
    return updated
