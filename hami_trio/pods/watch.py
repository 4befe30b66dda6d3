"""The Kubernetes pod watch: this node's pods, kept live with list + watch.

How this works: :func:`serve_pod_watch` lists the node's pods, publishes them in a
:class:`KubernetesPodSource` (an immutable ``uid -> PodInfo`` mapping, replaced on every event,
so readers in any task or thread need no lock), then watches from the list's resource version.
A normal end resumes, ``410 Gone`` relists, other failures back off with jitter and keep the
last set, but the source is not *authoritative* (the lister deletes nothing) until the resumed
watch delivered something.  kubernetes-asyncio runs on a trio-asyncio loop opened inside the
caller's task, every await through ``aio_as_trio``; this is the only asyncio module.  The JSON
is decoded by the pure :mod:`hami_trio.pods.decode`.  Start-up never waits for the API server.
Details, states and the reasons: docs/pod-watch.md.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, ParamSpec, TypeVar, cast

import aiohttp
import trio
import trio_asyncio
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from prometheus_client import CollectorRegistry, Counter, Gauge

from hami_trio.errors import PodSourceError
from hami_trio.logs import RateLimiter
from hami_trio.pods.access import SERVICE_HOST_ENV, SERVICE_PORT_ENV, KubeAccess, validate_node_name
from hami_trio.pods.decode import (
    WatchDecodeError,
    WatchEvent,
    apply_watch_event,
    parse_pod_list,
    parse_status,
    parse_watch_event,
)
from hami_trio.pods.source import PodInfo

__all__ = [
    "Backoff",
    "KubernetesPodSource",
    "PodWatcher",
    "WatchSettings",
    "serve_pod_watch",
]

_log = logging.getLogger("hami_trio.monitor.pods")  # the name in the logs (kept across moves)


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
                SERVICE_HOST_ENV: access.service_host,
                SERVICE_PORT_ENV: access.service_port,
            },
        ).load_and_set(configuration)
    return k8s_client.ApiClient(configuration)


class PodWatcher:
    """One pod watch: the list/watch loop around a configured kubernetes-asyncio client.

    :func:`serve_pod_watch` builds one from the configuration and runs it inside its
    trio-asyncio loop.  ``core`` is used only through ``list_pod_for_all_namespaces`` (with
    ``_preload_content=False``), so a test can run :meth:`run` inside
    ``trio_asyncio.open_loop()`` against a fake API under ``trio.testing.MockClock`` and
    observe the exact backoff schedule; ``rng`` draws the jitter and the watch timeouts.
    """

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
                await PodWatcher(source, k8s_client.CoreV1Api(api), settings, rng).run()
            finally:
                source._set_connected(False)
                # Close the aiohttp session even when cancelled, within a bounded time.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 5.0):
                    await _aio(api.close)
    if failure is not None:
        raise failure
