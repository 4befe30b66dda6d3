"""The Kubernetes pod watch: which pods run on this node, kept live with list + watch.

How this works.  :func:`serve_pod_watch` lists the pods of this node
(``fieldSelector=spec.nodeName=$NODE_NAME``), publishes them in a
:class:`KubernetesPodSource`, then watches from the list's ``resourceVersion`` with
bookmarks.  Each event replaces the source's immutable ``uid -> PodInfo`` mapping (copy on
write), so readers in other tasks or threads - the monitor's lister, a metrics scrape in a
worker thread - always see one consistent set without locks.  Failures are handled like
client-go's reflector:

- a watch that ends normally (the server's ``timeoutSeconds``) is resumed from the last
  resource version, without a new list;
- ``410 Gone`` / ``Expired`` (as an HTTP status or an ``ERROR`` event) and undecodable events
  relist, and the new list replaces the set, so nothing is lost or duplicated;
- connection errors, TLS errors and other HTTP errors back off exponentially with jitter
  (capped) and retry; the last known pod set stays as it is, but the source stops being
  *authoritative* until the resumed watch has delivered an event or a bookmark (or a new
  list succeeded), so the lister deletes nothing for pods it might have missed.

The source is *ready* after the first successful list and stays ready (a node whose API
server is briefly unreachable must keep serving metrics); ``hami_trio_pod_watch_synced`` shows
the live state (1 only while connected and in sync).

The Kubernetes client is kubernetes-asyncio (aiohttp), the only asyncio code in hami-trio.
It runs on a trio-asyncio loop opened by :func:`serve_pod_watch` inside the caller's trio
task: every await into asyncio goes through ``trio_asyncio.aio_as_trio``, so trio
cancellation reaches the HTTP request, and all state changes happen in trio code.  We call the
generated API with ``_preload_content=False`` and decode the JSON ourselves (pure functions
below), which keeps the models' slow deserialisation out of the loop and lets us keep only the
fields the monitor uses.

Start-up never waits for the API server: ``task_status.started()`` is called once the client
is configured (a bad kubeconfig or a missing service account fails start-up with
:class:`~hami_trio.errors.PodSourceError`); readiness follows the first list.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal, ParamSpec, TypeVar, cast

import aiohttp
import trio
import trio_asyncio
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from prometheus_client import CollectorRegistry, Counter, Gauge

from hami_trio.errors import ConfigError, PodSourceError
from hami_trio.logs import RateLimiter
from hami_trio.monitor.podsource import PodInfo

__all__ = [
    "KUBECONFIG_ENV",
    "NODE_NAME_ENV",
    "SERVICE_ACCOUNT_DIR",
    "Backoff",
    "KubeAccess",
    "KubernetesPodSource",
    "WatchDecodeError",
    "WatchEvent",
    "WatchSettings",
    "apply_watch_event",
    "node_name_from_env",
    "parse_pod_list",
    "parse_status",
    "parse_watch_event",
    "pod_info_from_object",
    "serve_pod_watch",
    "validate_node_name",
]

_log = logging.getLogger(__name__)

#: The node this agent runs on (downward API ``spec.nodeName``).
NODE_NAME_ENV: Final = "NODE_NAME"
#: A kubeconfig path (or ``:``-separated list); when set it wins over the in-cluster config.
KUBECONFIG_ENV: Final = "KUBECONFIG"
#: Where Kubernetes mounts the service account token and CA into a pod.
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
_SERVICE_HOST_ENV: Final = "KUBERNETES_SERVICE_HOST"
_SERVICE_PORT_ENV: Final = "KUBERNETES_SERVICE_PORT"

# A node name is a DNS-1123 subdomain.  Checking it keeps the field selector well formed
# ("," or "=" in the value would change its meaning).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
_OBJECT_EVENTS: Final = frozenset({"ADDED", "MODIFIED", "DELETED"})


def validate_node_name(name: str, *, source: str = NODE_NAME_ENV) -> str:
    """Check that ``name`` is a Kubernetes node name (a DNS-1123 subdomain).

    Args:
        name: the value to check.
        source: the flag or variable it came from, for the error message.

    Returns:
        ``name`` unchanged.

    Raises:
        ConfigError: empty, longer than 253 characters, or not a DNS-1123 subdomain.
    """
    if not name:
        raise ConfigError(
            f"{source} is empty; it must name this node when Kubernetes is used "
            "(set it from the downward API spec.nodeName, or pass --no-kubernetes)"
        )
    if len(name) > 253 or _NODE_NAME.fullmatch(name) is None:
        raise ConfigError(f"{source}: {name!r} is not a valid Kubernetes node name")
    return name


def node_name_from_env(env: Mapping[str, str]) -> str:
    """``$NODE_NAME``, validated (see :func:`validate_node_name`).

    Raises:
        ConfigError: the variable is unset, empty or not a node name.
    """
    return validate_node_name(env.get(NODE_NAME_ENV, ""))


# --------------------------------------------------------------------------------------------
# Pure decoding of the Kubernetes wire format.


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
        The pod's UID, namespace, name, container and init container names, annotations and
        labels.  Malformed entries (a container without a string name, a non-string label) are
        left out; a field of the wrong type reads as empty; lone surrogates in any string
        become U+FFFD (see :func:`_text`).  Only a missing UID fails: without it the pod
        cannot be named, and no container directory can belong to it.

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
    return PodInfo(
        uid=_text(uid),
        namespace=_text(namespace) if isinstance(namespace, str) else "",
        name=_text(name) if isinstance(name, str) else "",
        containers=_names(spec.get("containers")),
        init_containers=_names(spec.get("initContainers")),
        annotations=_str_map(meta.get("annotations"), annotation_prefixes),
        labels=_str_map(meta.get("labels"), None),
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


# --------------------------------------------------------------------------------------------
# Backoff and settings.


class Backoff:
    """Capped exponential backoff with "equal jitter".

    The n-th delay (from 0) is drawn uniformly from ``[c/2, c]`` with
    ``c = min(cap, initial * 2**n)``: never zero, so a flapping API server is not hammered,
    spread out so that all nodes of a cluster do not reconnect in lockstep, and - because each
    interval starts where the previous one ended - never shorter than the one before until
    the cap.
    """

    def __init__(self, initial: float, cap: float, *, rng: random.Random | None = None) -> None:
        if not 0 < initial <= cap:
            raise ValueError(f"backoff needs 0 < initial <= cap, got {initial} and {cap}")
        self._initial = initial
        self._cap = cap
        self._rng = rng if rng is not None else random.Random()
        self._attempt = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; each call grows the next one until the cap."""
        ceiling = min(self._cap, self._initial * 2.0 ** min(self._attempt, 64))
        self._attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._attempt = 0


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """Tunables of the pod watch; the defaults follow client-go's reflector.

    Attributes:
        backoff_initial: first retry delay after a failure, seconds.
        backoff_max: cap of the retry delay, seconds.
        watch_timeout: each watch asks the server to end it after a random time in
            ``[watch_timeout, 2 * watch_timeout)`` seconds (spreads reconnects over time).
        connect_timeout: TCP + TLS connect timeout, seconds.
        list_timeout: read timeout of a list request, seconds.
        read_grace: a watch with no byte for its server timeout plus this many seconds is
            considered dead (a half-open connection).
        min_watch_duration: a watch that ends cleanly sooner than this without any event
            counts as a failure (backs off), so a server that closes at once cannot spin us.
        annotation_prefixes: annotation keys to keep (see :func:`pod_info_from_object`).
    """

    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    watch_timeout: float = 300.0
    connect_timeout: float = 10.0
    list_timeout: float = 60.0
    read_grace: float = 60.0
    min_watch_duration: float = 1.0
    annotation_prefixes: tuple[str, ...] | None = ("hami.io/",)

    def __post_init__(self) -> None:
        Backoff(self.backoff_initial, self.backoff_max)  # validates the pair
        for name in ("watch_timeout", "connect_timeout", "list_timeout", "read_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WatchSettings.{name} must be > 0")


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """How to reach the API server: a kubeconfig, or the pod's service account.

    Build it with :meth:`from_env`; the loading itself happens in :func:`serve_pod_watch`.
    """

    kubeconfig: str | None = None
    service_host: str = ""
    service_port: str = ""
    token_path: str = f"{SERVICE_ACCOUNT_DIR}/token"
    ca_path: str = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
    context: str | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        kubeconfig: str | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
    ) -> KubeAccess:
        """Choose the configuration like ``kubectl`` in a pod would.

        An explicit ``kubeconfig`` argument wins, then ``$KUBECONFIG``, then the in-cluster
        configuration (``$KUBERNETES_SERVICE_HOST``/``PORT`` plus the service account token
        and CA under ``service_account_dir``).

        Raises:
            PodSourceError: none of them is available.
        """
        path = kubeconfig or env.get(KUBECONFIG_ENV)
        if path:
            return cls(kubeconfig=path)
        host = env.get(_SERVICE_HOST_ENV, "")
        port = env.get(_SERVICE_PORT_ENV, "")
        if host and port:
            return cls(
                service_host=host,
                service_port=port,
                token_path=f"{service_account_dir}/token",
                ca_path=f"{service_account_dir}/ca.crt",
            )
        raise PodSourceError(
            "no Kubernetes API configuration: set KUBECONFIG, run in a pod with a service "
            f"account ({_SERVICE_HOST_ENV}/{_SERVICE_PORT_ENV} set), or pass --no-kubernetes"
        )

    def describe(self) -> str:
        """A short description for log lines (never the token)."""
        if self.kubeconfig is not None:
            return f"kubeconfig {self.kubeconfig}"
        return f"in-cluster https://{self.service_host}:{self.service_port}"


# --------------------------------------------------------------------------------------------
# The source: state shared with the lister and the metrics collector.


class KubernetesPodSource:
    """The pods on this node as the watch knows them; implements ``PodSource``.

    Create it, then run :func:`serve_pod_watch` on it in the agent's nursery.  Reads
    (:attr:`ready`, :attr:`authoritative`, :meth:`lookup`, :meth:`pods`) are safe from any task
    or thread: the pod mapping is replaced, never mutated.

    Args:
        node_name: this node's name (validated).
        registry: where ``hami_trio_pod_watch_synced`` and ``hami_trio_pod_watch_relists_total``
            are registered; ``None`` registers nothing.

    Raises:
        ConfigError: ``node_name`` is not a node name.
    """

    def __init__(self, node_name: str, *, registry: CollectorRegistry | None = None) -> None:
        self.node_name = validate_node_name(node_name)
        self._pods: Mapping[str, PodInfo] = MappingProxyType({})
        self._ready = False
        self._connected = False
        self._resource_version: str | None = None
        self._relists = 0
        self._lists = 0
        self._synced_gauge: Gauge | None = None
        self._relists_counter: Counter | None = None
        if registry is not None:
            self._synced_gauge = Gauge(
                "hami_trio_pod_watch_synced",
                "1 while the pod watch is connected and in sync with the API server, else 0",
                registry=registry,
            )
            self._relists_counter = Counter(
                "hami_trio_pod_watch_relists_total",
                "Pod lists after the first one (watch expired, undecodable event)",
                registry=registry,
            )

    # PodSource ------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once the first list succeeded; stays true while the API is unreachable."""
        return self._ready

    @property
    def authoritative(self) -> bool:
        """True while the set is complete and current: listed and the watch connected."""
        return self._ready and self._connected

    def lookup(self, uid: str) -> PodInfo | None:
        """The pod with this UID, or None (unknown, or not listed yet)."""
        return self._pods.get(uid)

    # Extra views -----------------------------------------------------------------------------

    def pods(self) -> Mapping[str, PodInfo]:
        """An immutable snapshot ``uid -> PodInfo`` of every known pod on this node."""
        return self._pods

    @property
    def resource_version(self) -> str | None:
        """Where the next watch resumes (None before the first list)."""
        return self._resource_version

    @property
    def relists(self) -> int:
        """How many lists followed the first one."""
        return self._relists

    # Driven by serve_pod_watch (trio thread) ---------------------------------------------------

    def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        if self._synced_gauge is not None:
            self._synced_gauge.set(1 if self.authoritative else 0)

    def _replace(self, pods: Iterable[PodInfo], resource_version: str) -> None:
        self._pods = MappingProxyType({pod.uid: pod for pod in pods})
        self._resource_version = resource_version
        if self._lists:
            self._relists += 1
            if self._relists_counter is not None:
                self._relists_counter.inc()
        self._lists += 1
        self._ready = True
        self._set_connected(True)

    def _apply(self, event: WatchEvent) -> None:
        if event.pod is not None:
            self._pods = MappingProxyType(apply_watch_event(self._pods, event))
        if event.resource_version:
            self._resource_version = event.resource_version


# --------------------------------------------------------------------------------------------
# The trio side of the watch.

_P = ParamSpec("_P")
_T = TypeVar("_T")


async def _aio(fn: Callable[_P, Awaitable[_T]], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Await an asyncio coroutine function from trio (inside ``trio_asyncio.open_loop``)."""
    return cast(_T, await trio_asyncio.aio_as_trio(fn)(*args, **kwargs))


class _Retry(Exception):
    """A transient failure: back off, keep the pods, resume the watch (or retry the list)."""


class _Relist(Exception):
    """The watch cannot resume from its resource version: list again."""


# What a flaky network or API server raises inside aiohttp / kubernetes-asyncio.  TimeoutError
# is asyncio's timeout; ValueError is aiohttp's "line too long"; ConfigException comes from
# the token refresh hook when the service account token file is unreadable.
_TRANSIENT: Final = (aiohttp.ClientError, OSError, TimeoutError, ValueError, ConfigException)


async def _open_api_client(access: KubeAccess) -> k8s_client.ApiClient:
    """Load the configuration and create the client (runs on the asyncio side)."""
    configuration = k8s_client.Configuration()
    if access.kubeconfig is not None:
        await k8s_config.load_kube_config(
            config_file=access.kubeconfig,
            context=access.context,
            client_configuration=configuration,
            persist_config=False,  # the kubeconfig is usually a read-only mount
        )
    else:
        InClusterConfigLoader(
            token_filename=access.token_path,
            cert_filename=access.ca_path,
            environ={
                _SERVICE_HOST_ENV: access.service_host,
                _SERVICE_PORT_ENV: access.service_port,
            },
        ).load_and_set(configuration)
    return k8s_client.ApiClient(configuration)


class _Watcher:
    """One pod watch: the list/watch loop around a configured kubernetes-asyncio client."""

    def __init__(
        self,
        source: KubernetesPodSource,
        core: k8s_client.CoreV1Api,
        settings: WatchSettings,
        rng: random.Random,
    ) -> None:
        self._source = source
        self._core = core
        self._settings = settings
        self._rng = rng
        self._backoff = Backoff(settings.backoff_initial, settings.backoff_max, rng=rng)
        self._selector = f"spec.nodeName={source.node_name}"
        self._failures = RateLimiter(60.0, max_keys=64, clock=trio.current_time)
        # With _preload_content=False the generated method returns the aiohttp response
        # instead of a V1PodList; its type hints do not know that.
        self._raw_list_pods = cast(
            Callable[..., Awaitable[aiohttp.ClientResponse]], core.list_pod_for_all_namespaces
        )

    async def run(self) -> None:
        """List, then watch forever; never returns except by cancellation."""
        need_list = True
        # The first list may be served from the API server's watch cache (cheap for a big
        # cluster); after an expired watch we ask for a consistent read so as not to go back.
        list_rv: str | None = "0"
        relists_in_a_row = 0
        while True:
            if need_list:
                if relists_in_a_row > 1:
                    await trio.sleep(self._backoff.next_delay())
                try:
                    await self._list(list_rv)
                except _Retry as exc:
                    await self._retry_later("list", exc)
                    continue
                need_list = False
                self._backoff.reset()
            started = trio.current_time()
            try:
                events = await self._watch()
            except _Relist as exc:
                _log.info("pod watch: %s; listing pods again", exc)
                need_list, list_rv = True, None
                relists_in_a_row += 1
                continue
            except _Retry as exc:
                await self._retry_later("watch", exc)
                continue
            relists_in_a_row = 0 if events else relists_in_a_row
            if not events and trio.current_time() - started < self._settings.min_watch_duration:
                # A server that closes every watch at once must not make us spin.
                await trio.sleep(self._backoff.next_delay())

    async def _retry_later(self, what: str, exc: Exception) -> None:
        self._source._set_connected(False)
        delay = self._backoff.next_delay()
        self._failures.log(
            _log,
            logging.WARNING,
            what,
            "pod watch: %s failed (%s); retrying in %.1fs, keeping %d known pods",
            what,
            exc,
            delay,
            len(self._source.pods()),
        )
        await trio.sleep(delay)

    async def _list(self, resource_version: str | None) -> None:
        kwargs: dict[str, Any] = {
            "field_selector": self._selector,
            "_preload_content": False,
            "_request_timeout": (self._settings.connect_timeout, self._settings.list_timeout),
        }
        if resource_version is not None:
            kwargs["resource_version"] = resource_version
        try:
            response = await _aio(self._raw_list_pods, **kwargs)
            try:
                body = await _aio(response.read)
            finally:
                response.close()
        except _TRANSIENT as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        if response.status != 200:
            _code, message = parse_status(body)
            raise _Retry(f"HTTP {response.status} {message}".rstrip())
        try:
            rv, pods = parse_pod_list(
                body, annotation_prefixes=self._settings.annotation_prefixes, on_skip=self._skip
            )
        except WatchDecodeError as exc:
            raise _Retry(str(exc)) from exc
        first = not self._source.ready
        self._source._replace(pods, rv)
        _log.log(
            logging.INFO if first else logging.DEBUG,
            "pod watch: listed %d pods on node %s (resourceVersion %s)",
            len(pods),
            self._source.node_name,
            rv,
        )

    async def _watch(self) -> int:
        """One watch request from the current resource version; returns the events seen."""
        server_timeout = int(self._settings.watch_timeout * (1.0 + self._rng.random()))
        kwargs: dict[str, Any] = {
            "watch": True,
            "field_selector": self._selector,
            "resource_version": self._source.resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": max(server_timeout, 1),
            "_preload_content": False,
            "_request_timeout": (
                self._settings.connect_timeout,
                server_timeout + self._settings.read_grace,
            ),
        }
        events = 0
        try:
            response = await _aio(self._raw_list_pods, **kwargs)
            try:
                if response.status != 200:
                    code, message = parse_status(await _aio(response.read))
                    if response.status == 410 or code == 410:
                        raise _Relist(f"watch expired (HTTP 410 {message})")
                    raise _Retry(f"HTTP {response.status} {message}".rstrip())
                # After a failure the source is authoritative again only once the resumed
                # watch delivered something (an event or a bookmark): events missed during
                # the outage are replayed first, and until then an unknown pod may only be
                # one we have not heard about yet.  A clean resume keeps the state as is.
                while True:
                    line = await _aio(response.content.readline)
                    if not line:
                        return events  # the server ended the watch (timeoutSeconds)
                    if not line.strip():
                        continue
                    self._handle(line)
                    events += 1
                    self._backoff.reset()
                    if not self._source.authoritative:
                        self._source._set_connected(True)
            finally:
                response.close()
        except _TRANSIENT as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc

    def _skip(self, index: int, exc: WatchDecodeError) -> None:
        self._failures.log(
            _log, logging.WARNING, "skip", "pod watch: leaving out list item %d: %s", index, exc
        )

    def _handle(self, line: bytes) -> None:
        try:
            event = parse_watch_event(line, annotation_prefixes=self._settings.annotation_prefixes)
        except WatchDecodeError as exc:
            raise _Relist(f"undecodable watch event ({exc})") from exc
        if event.type == "ERROR":
            if event.code == 410:
                raise _Relist(f"watch expired ({event.message})")
            raise _Retry(f"watch error {event.code}: {event.message}")
        self._source._apply(event)


async def serve_pod_watch(
    source: KubernetesPodSource,
    access: KubeAccess,
    *,
    settings: WatchSettings | None = None,
    rng: random.Random | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``source`` in sync with the pods of its node until cancelled.

    Opens a trio-asyncio loop, loads the client configuration (kubeconfig or in-cluster),
    calls ``task_status.started()`` - without waiting for the API server - and then lists and
    watches as described in the module docstring.  On cancellation the open request is
    aborted and the HTTP session closed before returning.

    Args:
        source: the pod source to fill.
        access: where the API server is and how to authenticate.
        settings: tunables (defaults: client-go's).
        rng: random source for jitter and watch timeouts (tests pass a seeded one).
        task_status: trio's start protocol.

    Raises:
        PodSourceError: the configuration cannot be loaded (missing or invalid kubeconfig,
            missing service account token or CA).  Raised before ``started()``.
    """
    settings = settings if settings is not None else WatchSettings()
    rng = rng if rng is not None else random.Random()
    failure: PodSourceError | None = None
    async with trio_asyncio.open_loop():
        try:
            api = await _aio(_open_api_client, access)
        except (ConfigException, OSError, ValueError) as exc:
            # Raised after the loop is closed: trio-asyncio's nursery would wrap it in an
            # ExceptionGroup, and callers (the CLI) expect a plain PodSourceError.
            failure = PodSourceError(
                f"cannot configure the Kubernetes client from {access.describe()}: {exc}"
            )
            failure.__cause__ = exc
        else:
            try:
                _log.info(
                    "pod watch: watching pods of node %s via %s",
                    source.node_name,
                    access.describe(),
                )
                task_status.started()
                await _Watcher(source, k8s_client.CoreV1Api(api), settings, rng).run()
            finally:
                source._set_connected(False)
                # Close the aiohttp session even when cancelled, within a bounded time.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 5.0):
                    await _aio(api.close)
    if failure is not None:
        raise failure
