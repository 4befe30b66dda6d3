"""Pure decoders of the Kubernetes wire format: pod lists, watch events, API statuses.

Every function takes bytes or JSON text and returns :class:`~hami_trio.pods.source.PodInfo`
values (only the fields the agent uses); a bad pod costs that pod, never the list.  The watch
(:mod:`hami_trio.pods.watch`) calls them; fuzz and property tests call them directly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from hami_trio.pods.priority import spec_priorities
from hami_trio.pods.source import PodInfo

__all__ = [
    "MAX_PHASE_CHARS",
    "EventType",
    "WatchDecodeError",
    "WatchEvent",
    "apply_watch_event",
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


def _text(value: str) -> str:
    """``value`` with lone surrogates replaced by U+FFFD, as Go's JSON decoder does.

    A JSON string may escape half a UTF-16 pair (``"\\ud800"``); Python keeps it as a code
    point that cannot be encoded as UTF-8, which would break every later use (labels, logs).
    The API server, written in Go, would never send one; we see what it would have stored.
    """
    if value.isascii() or _SURROGATE.search(value) is None:
        return value
    return _SURROGATE.sub("\ufffd", value)


def _str_map(value: object, prefixes: tuple[str, ...] | None) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {
        _text(key): _text(item)
        for key, item in value.items()
        if isinstance(key, str)
        and isinstance(item, str)
        and (prefixes is None or key.startswith(prefixes))
    }


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
    obj: object, *, annotation_prefixes: tuple[str, ...] | None = ("hami.io/",)
) -> PodInfo:
    """Extract the :class:`PodInfo` the monitor needs from a pod as the API sends it.

    Args:
        obj: the decoded JSON of one ``v1.Pod``.
        annotation_prefixes: keep only annotations whose key starts with one of these
            (``None`` keeps all).  The monitor reads only ``hami.io/`` annotations; dropping the
            rest (``kubectl.kubernetes.io/last-applied-configuration`` can be large) bounds
            memory.

    Returns:
        The pod's UID, namespace, name, container and init container names, annotations,
        labels, ``status.phase`` (cut to :data:`MAX_PHASE_CHARS`) and the priority each
        container's spec sets (:func:`~hami_trio.pods.priority.spec_priorities`).
        Malformed entries (a container without a string name, a non-string label) are left
        out; a field of the
        wrong type reads as empty; lone surrogates in any string become U+FFFD (see
        :func:`_text`).  Only a missing UID fails: without it the pod cannot be named, and no
        container directory can belong to it.

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
    return PodInfo(
        uid=_text(uid),
        namespace=_text(namespace) if isinstance(namespace, str) else "",
        name=_text(name) if isinstance(name, str) else "",
        containers=_names(spec.get("containers")),
        init_containers=_names(spec.get("initContainers")),
        annotations=_str_map(meta.get("annotations"), annotation_prefixes),
        labels=_str_map(meta.get("labels"), None),
        phase=_text(phase[:MAX_PHASE_CHARS]) if isinstance(phase, str) else "",
        priorities=spec_priorities(spec),
    )


def _load_json(data: bytes | str, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WatchDecodeError(f"{what} is not JSON: {exc}") from exc
    except RecursionError as exc:  # nesting deeper than the parser's stack
        raise WatchDecodeError(f"{what} is not JSON: nested too deeply") from exc


def parse_pod_list(
    body: bytes | str,
    *,
    annotation_prefixes: tuple[str, ...] | None = ("hami.io/",),
    on_skip: Callable[[int, WatchDecodeError], None] | None = None,
) -> tuple[str, tuple[PodInfo, ...]]:
    """Decode a ``PodList`` response.

    An item that is not a pod with a UID is left out - ``on_skip(index, error)`` is told -
    and the other pods are kept: one bad object costs itself, never the list.  (A pod without
    a UID cannot own a container directory, so leaving it out deletes nothing.)

    Returns:
        The list's ``metadata.resourceVersion`` (where the watch resumes) and its pods.

    Raises:
        WatchDecodeError: not JSON, no ``items`` list or no resource version.
    """
    doc = _load_json(body, "pod list")
    meta = _metadata(doc)
    rv = meta.get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise WatchDecodeError("pod list has no metadata.resourceVersion")
    items = doc.get("items")
    if items is None:  # Go encodes an empty slice as null in some versions
        items = []
    if not isinstance(items, list):
        raise WatchDecodeError("pod list items is not a list")
    pods: list[PodInfo] = []
    for index, item in enumerate(items):
        try:
            pods.append(pod_info_from_object(item, annotation_prefixes=annotation_prefixes))
        except WatchDecodeError as exc:
            if on_skip is not None:
                on_skip(index, exc)
    return _text(rv), tuple(pods)


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
    line: bytes | str, *, annotation_prefixes: tuple[str, ...] | None = ("hami.io/",)
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
        pod = pod_info_from_object(obj, annotation_prefixes=annotation_prefixes)
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
