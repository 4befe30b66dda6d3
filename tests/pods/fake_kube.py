"""A fake Kubernetes API server for pods, speaking the real list/watch wire format.

The pod watch tests drive the real kubernetes-asyncio client against it over real HTTP(S).
It serves ``GET /api/v1/pods`` (list and ``watch=true``) from an in-memory cluster and
honours what the watch relies on:

- ``fieldSelector=spec.nodeName=<node>`` (``=`` or ``==``; anything else is a 400);
- resource versions: every change gets the next number; a list reports the current one; a
  watch from version N streams the changes after N, from ``0``/unset it first sends synthetic
  ADDED events; a watch from before the last :meth:`FakeKubeApi.compact` is answered with
  ``410 Expired``, as an ``ERROR`` event (like kube-apiserver) or as an HTTP status;
- ``allowWatchBookmarks`` (:meth:`FakeKubeApi.bookmark`) and ``timeoutSeconds``;
- paginated lists (``limit`` and ``continue``): the pages of one list come from one snapshot;
  a ``continue`` token that has expired (:meth:`FakeKubeApi.expire_continue_tokens`, or
  :meth:`FakeKubeApi.compact`) is answered with ``410 Expired``, a ``continue`` with a
  ``resourceVersion`` with ``400``; like the API server's watch cache, a list at
  ``resourceVersion=0`` ignores ``limit`` (all pods in one page) unless
  ``paginate_cached_lists`` is set;
- bearer-token authentication when a token is configured;
- outages: :meth:`FakeKubeApi.stop` closes the listener and every connection (clients get
  connection refused), :meth:`FakeKubeApi.serve` again on the same port brings it back;
  :meth:`FakeKubeApi.fail_with` answers every request with an error status instead.

It is an ASGI app served by hypercorn's trio worker in the test's own nursery, so a test can
use MockClock-free real time with short settings.  Every request is recorded in
:attr:`FakeKubeApi.requests`; :attr:`FakeKubeApi.on_page` is called after each list page is
sent (a test changes the cluster in the middle of a paginated list there).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid as uuid_module
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

_Scope = dict[str, Any]
_Receive = Callable[[], Awaitable[dict[str, Any]]]
_Send = Callable[[dict[str, Any]], Awaitable[None]]


def _parse_bool(text: str) -> bool:
    # Go's strconv.ParseBool, which kube-apiserver uses for query flags.
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False", ""):
        return False
    raise ValueError(text)


@dataclass(frozen=True)
class RequestRecord:
    """One request as the fake saw it."""

    path: str
    params: Mapping[str, str]
    watch: bool
    resource_version: str | None
    authorization: str | None

    @property
    def field_selector(self) -> str | None:
        return self.params.get("fieldSelector")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeApi:
    """An in-memory cluster of pods behind the Kubernetes list/watch API.

    Args:
        token: if set, requests must carry ``Authorization: Bearer <token>`` (else 401).
        gone_as_status: answer a watch from a compacted version with HTTP 410 instead of a 200
            stream holding one ``ERROR`` event.
        paginate_cached_lists: honour ``limit`` at ``resourceVersion=0`` too (newer API
            servers paginate lists served from their cache; older ones send everything).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        gone_as_status: bool = False,
        paginate_cached_lists: bool = False,
    ) -> None:
        self.token = token
        self.gone_as_status = gone_as_status
        self.paginate_cached_lists = paginate_cached_lists
        #: Called with the number of pages sent so far, after each page of a list.
        self.on_page: Callable[[int], None] | None = None
        self.pages_sent = 0
        self.requests: list[RequestRecord] = []
        self.open_watches = 0
        self.closed_watches = 0
        self.port: int | None = None
        self._rv = 100
        self._oldest_rv = self._rv
        self._pods: dict[str, dict[str, Any]] = {}
        # uid -> the pod's JSON, encoded once per change (bloated pods are large).
        self._encoded: dict[str, bytes] = {}
        # snapshot id -> (resource version, the listed pods' JSON): the pages of one list.
        self._snapshots: dict[int, tuple[int, list[bytes]]] = {}
        self._next_snapshot = 0
        # (resource version, event type, object); bookmarks are ("BOOKMARK", {metadata}).
        self._history: list[tuple[int, str, dict[str, Any]]] = []
        self._changed = trio.Event()
        self._watch_generation = 0
        self._fail_status: int | None = None
        self._scope: trio.CancelScope | None = None

    # Cluster state ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def pods_on(self, node: str) -> dict[str, dict[str, Any]]:
        """uid -> pod object for the pods currently on ``node``."""
        return {uid: pod for uid, pod in self._pods.items() if pod["spec"].get("nodeName") == node}

    def _record(self, kind: str, pod: dict[str, Any]) -> None:
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        encoded = json.dumps(pod).encode()
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self._encoded.pop(uid, None)
        else:
            self._encoded[uid] = encoded
        self._history.append((self._rv, kind, json.loads(encoded)))
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def add_pod(
        self,
        name: str,
        *,
        node: str = "node-a",
        namespace: str = "default",
        uid: str | None = None,
        containers: Sequence[str] = ("main",),
        init_containers: Sequence[str] = (),
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        phase: str = "Running",
    ) -> str:
        """Create a pod (ADDED) in ``phase``; returns its UID."""
        uid = uid or str(uuid_module.uuid4())
        pod: dict[str, Any] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": dict(annotations or {}),
                "labels": dict(labels or {}),
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": c, "image": "busybox"} for c in containers],
                "initContainers": [{"name": c, "image": "busybox"} for c in init_containers],
            },
            "status": {
                "phase": phase,
                "containerStatuses": [{"name": c, "restartCount": 0} for c in containers],
            },
        }
        self._pods[uid] = pod
        self._record("ADDED", pod)
        return uid

    def modify_pod(
        self,
        uid: str,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        phase: str | None = None,
        restart: str | None = None,
    ) -> None:
        """Change a pod (MODIFIED): its annotations, labels or ``status.phase``, or count a
        restart of container ``restart`` (its ``restartCount`` goes up, as the kubelet
        reports when it restarts a crashed container in place: same pod, same UID)."""
        pod = self._pods[uid]
        if annotations is not None:
            pod["metadata"]["annotations"] = dict(annotations)
        if labels is not None:
            pod["metadata"]["labels"] = dict(labels)
        if phase is not None:
            pod["status"]["phase"] = phase
        if restart is not None:
            for status in pod["status"]["containerStatuses"]:
                if status["name"] == restart:
                    status["restartCount"] += 1
        self._record("MODIFIED", pod)

    def delete_pod(self, uid: str) -> None:
        """Remove a pod (DELETED)."""
        pod = self._pods.pop(uid)
        self._record("DELETED", pod)

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current resource version to watches that allow them."""
        self._history.append(
            (self._rv, "BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": str(self._rv)}})
        )
        self._notify()

    def send_raw(self, line: bytes) -> None:
        """Send ``line`` (plus a newline) verbatim to every open watch (a garbled event)."""
        self._history.append((self._rv, "RAW", {"line": line.decode("latin-1")}))
        self._notify()

    def send_error(self, code: int, reason: str, message: str) -> None:
        """Send an ``ERROR`` event carrying this Status to every open watch."""
        self._history.append((self._rv, "ERROR", _status(code, reason, message)))
        self._notify()

    def compact(self) -> None:
        """Forget history: a new watch from an older resource version gets 410 Expired, and
        so does every ``continue`` token handed out so far."""
        self._oldest_rv = self._rv
        self.expire_continue_tokens()

    def expire_continue_tokens(self) -> None:
        """Make every ``continue`` token handed out so far answer ``410 Expired``."""
        self._snapshots.clear()

    def end_watches(self) -> None:
        """End every open watch stream now, dropping undelivered events (a clean close, as
        the server's timeout or an API server restart does)."""
        self._watch_generation += 1
        self._notify()

    def fail_with(self, status: int | None) -> None:
        """Answer every request with this HTTP status (None: serve normally again)."""
        self._fail_status = status

    # Serving --------------------------------------------------------------------------------

    async def serve(
        self,
        *,
        port: int = 0,
        certfile: str | None = None,
        keyfile: str | None = None,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on 127.0.0.1 until :meth:`stop`; ``started()`` reports the base URL."""
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.errorlog = logging.getLogger("tests.fake_kube")
        config.graceful_timeout = 0
        if certfile is not None:
            config.certfile = certfile
            config.keyfile = keyfile
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                binds: list[str] = await nursery.start(serve, self._app, config)
                self.port = int(binds[0].rsplit(":", 1)[1])
                task_status.started(binds[0])

    def stop(self) -> None:
        """Close the listener and every connection at once (an API server outage)."""
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None

    async def _app(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        params = {k: v[-1] for k, v in parse_qs(scope["query_string"].decode()).items()}
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            watch = _parse_bool(params.get("watch", ""))
        except ValueError:
            await self._reply(send, 400, _status(400, "BadRequest", "invalid watch flag"))
            return
        record = RequestRecord(
            path=scope["path"],
            params=params,
            watch=watch,
            resource_version=params.get("resourceVersion"),
            authorization=headers.get("authorization"),
        )
        self.requests.append(record)
        if self._fail_status is not None:
            await self._reply(
                send, self._fail_status, _status(self._fail_status, "InternalError", "injected")
            )
            return
        if self.token is not None and record.authorization != f"Bearer {self.token}":
            await self._reply(send, 401, _status(401, "Unauthorized", "Unauthorized"))
            return
        if scope["path"] != "/api/v1/pods" or scope["method"] != "GET":
            await self._reply(send, 404, _status(404, "NotFound", f"no route {scope['path']}"))
            return
        try:
            node = self._node_selector(params.get("fieldSelector", ""))
        except ValueError as exc:
            await self._reply(send, 400, _status(400, "BadRequest", str(exc)))
            return
        if watch:
            await self._watch(record, node, receive, send)
        else:
            await self._list(record, node, send)

    @staticmethod
    def _node_selector(selector: str) -> str | None:
        if not selector:
            return None
        for op in ("==", "="):
            field, sep, value = selector.partition(op)
            if sep and field == "spec.nodeName" and "," not in value:
                return value
        raise ValueError(f'field label not supported: "{selector}"')

    def _matches(self, pod: Mapping[str, Any], node: str | None) -> bool:
        return node is None or pod["spec"].get("nodeName") == node

    async def _reply(self, send: _Send, status: int, body: Mapping[str, Any]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def _list(self, record: RequestRecord, node: str | None, send: _Send) -> None:
        params = record.params
        try:
            limit = int(params.get("limit") or 0)
        except ValueError:
            await self._reply(send, 400, _status(400, "BadRequest", "invalid limit"))
            return
        token = params.get("continue")
        if token:
            if record.resource_version:
                message = "specifying resource version is not allowed when using continue"
                await self._reply(send, 400, _status(400, "BadRequest", message))
                return
            try:
                position = json.loads(base64.urlsafe_b64decode(token))
                snapshot_id, start = int(position["id"]), int(position["start"])
            except (ValueError, KeyError, TypeError):
                await self._reply(send, 400, _status(400, "BadRequest", "invalid continue"))
                return
            if snapshot_id not in self._snapshots:
                message = (
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."
                )
                await self._reply(send, 410, _status(410, "Expired", message))
                return
        else:
            matching = [
                self._encoded[uid] for uid, pod in self._pods.items() if self._matches(pod, node)
            ]
            snapshot_id, start = self._next_snapshot, 0
            self._next_snapshot += 1
            self._snapshots[snapshot_id] = (self._rv, matching)
            if record.resource_version == "0" and not self.paginate_cached_lists:
                limit = 0  # the watch cache sends everything at once
        rv, items = self._snapshots[snapshot_id]
        end = len(items) if limit <= 0 else min(len(items), start + limit)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if end < len(items):
            position_json = json.dumps({"id": snapshot_id, "start": end}).encode()
            meta["continue"] = base64.urlsafe_b64encode(position_json).decode()
            meta["remainingItemCount"] = len(items) - end
        else:
            self._snapshots.pop(snapshot_id, None)
        head = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        # The items go out one by one, as a streaming encoder would send them.
        await send({"type": "http.response.body", "body": head[:-1].encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b', "items": [', "more_body": True})
        for index, item in enumerate(items[start:end]):
            body = item if index == 0 else b"," + item
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"]}"})
        self.pages_sent += 1
        if self.on_page is not None:
            self.on_page(self.pages_sent)

    async def _watch(
        self, record: RequestRecord, node: str | None, receive: _Receive, send: _Send
    ) -> None:
        params = record.params
        bookmarks = _parse_bool(params.get("allowWatchBookmarks", ""))
        timeout = float(params["timeoutSeconds"]) if "timeoutSeconds" in params else None
        start = record.resource_version
        if start not in (None, "", "0") and int(start) < self._oldest_rv:
            expired = _status(
                410, "Expired", f"too old resource version: {start} ({self._oldest_rv})"
            )
            if self.gone_as_status:
                await self._reply(send, 410, expired)
                return
            await self._start_stream(send)
            await self._send_event(send, "ERROR", expired)
            await send({"type": "http.response.body", "body": b""})
            return
        await self._start_stream(send)
        self.open_watches += 1
        try:
            async with trio.open_nursery() as nursery:

                async def disconnected() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(disconnected)
                with trio.move_on_after(timeout if timeout is not None else float("inf")):
                    await self._stream(send, node, start, bookmarks)
                await send({"type": "http.response.body", "body": b""})
                nursery.cancel_scope.cancel()
        finally:
            self.open_watches -= 1
            self.closed_watches += 1

    async def _start_stream(self, send: _Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )

    async def _send_event(self, send: _Send, kind: str, obj: Mapping[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        await send({"type": "http.response.body", "body": line, "more_body": True})

    async def _stream(
        self, send: _Send, node: str | None, start: str | None, bookmarks: bool
    ) -> None:
        generation = self._watch_generation
        if start in (None, "", "0"):
            for pod in list(self._pods.values()):
                if self._matches(pod, node):
                    await self._send_event(send, "ADDED", pod)
            since = self._rv
        else:
            since = int(start)
        position = next(
            (i for i, (rv, _, _) in enumerate(self._history) if rv > since), len(self._history)
        )
        while self._watch_generation == generation:
            rv, kind, obj = (
                self._history[position] if position < len(self._history) else (0, "", {})
            )
            if not kind:
                await self._changed.wait()
                continue
            position += 1
            if kind == "BOOKMARK":
                if bookmarks:
                    await self._send_event(send, kind, obj)
            elif kind == "RAW":
                line = obj["line"].encode("latin-1") + b"\n"
                await send({"type": "http.response.body", "body": line, "more_body": True})
            elif kind == "ERROR" or (rv > since and self._matches(obj, node)):
                await self._send_event(send, kind, obj)
