"""The Kubernetes pod watch: this node's pods, kept live with list + watch.

How this works: :func:`serve_pod_watch` lists the node's pods, publishes them in a
:class:`KubernetesPodSource` (an immutable ``uid -> PodInfo`` mapping, replaced on every event,
so readers in any task or thread need no lock), then watches from the list's resource version.
A normal end resumes, ``410 Gone`` relists, other failures back off with jitter and keep the
last set, but the source is not *authoritative* (the lister deletes nothing) until the resumed
watch delivered something.  kubernetes-asyncio runs on a trio-asyncio loop opened inside the
caller's task, every await through ``aio_as_trio``; this is the only asyncio module.  The JSON
is decoded by the pure :mod:`hami_trio.pods.decode`, incrementally: a list is read in pages
(``limit``/``continue``) and each page item by item, a watch line by line, never more than one
object at a time; what is kept is bounded per pod and for all pods (``KeepRules``,
``PodBudget``), and every cut is counted and logged.  Start-up never waits for the API server.
Details, states and the reasons: docs/pod-watch.md.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
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
    CUT_REASONS,
    MAX_OBJECT_BYTES,
    Cut,
    KeepRules,
    ListPage,
    PodBudget,
    PodListDecoder,
    WatchDecodeError,
    WatchEvent,
    parse_status,
    parse_watch_event,
)
from hami_trio.pods.source import PodInfo

__all__ = [
    "DEFAULT_MAX_HELD_BYTES",
    "Backoff",
    "KubernetesPodSource",
    "PodWatcher",
    "WatchSettings",
    "serve_pod_watch",
]

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Backoff and settings.


_DEFAULT_KEEP: Final = KeepRules()


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
        keep: which labels and annotations are kept and their caps (:class:`KeepRules`; the
            agent adds ``--pod-labels-allowlist``).  The cap for all pods together is the
            source's (:class:`KubernetesPodSource`).
        list_page_size: pods per list request (``limit``); 0 lists in one request.
    """

    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    watch_timeout: float = 300.0
    connect_timeout: float = 10.0
    list_timeout: float = 60.0
    read_grace: float = 60.0
    min_watch_duration: float = 1.0
    keep: KeepRules = _DEFAULT_KEEP
    list_page_size: int = 100

    def __post_init__(self) -> None:
        Backoff(self.backoff_initial, self.backoff_max)  # validates the pair
        for name in ("watch_timeout", "connect_timeout", "list_timeout", "read_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WatchSettings.{name} must be > 0")
        if self.list_page_size < 0:
            raise ValueError("WatchSettings.list_page_size must be >= 0")


#: The most bytes all pods of the node may hold together (:class:`PodBudget`): with the
#: per-pod cap, over a hundred pods at that cap, about a thousand times what an ordinary pod
#: holds.
DEFAULT_MAX_HELD_BYTES: Final = 32 * 1024 * 1024

_CUT_EXPLAINED: Final[Mapping[str, str]] = {
    "label-too-long": "the label value is longer than the cap",
    "annotation-too-long": "the annotation value is longer than the cap",
    "pod-too-large": "the pod holds more than the per-pod cap; only its identity is kept",
    "total-too-large": "all pods together hold more than the cap; the largest keep only their "
    "identity",
}


# --------------------------------------------------------------------------------------------
# The source: state shared with the lister and the metrics collector.


class KubernetesPodSource:
    """The pods on this node as the watch knows them; implements ``PodSource``.

    Create it, then run :func:`serve_pod_watch` on it in the agent's nursery.  Reads
    (:attr:`ready`, :attr:`authoritative`, :meth:`lookup`, :meth:`pods`) are safe from any task
    or thread: the pod mapping is replaced, never mutated.

    Args:
        node_name: this node's name (validated).
        registry: where ``hami_trio_pod_watch_synced``, ``hami_trio_pod_watch_relists_total``,
            ``hami_trio_pod_watch_cuts_total`` and ``hami_trio_pod_watch_held_bytes`` are
            registered; ``None`` registers nothing.
        max_held_bytes: the most all pods together may hold (:class:`PodBudget`).

    Raises:
        ConfigError: ``node_name`` is not a node name.
    """

    def __init__(
        self,
        node_name: str,
        *,
        registry: CollectorRegistry | None = None,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
    ) -> None:
        self.node_name = validate_node_name(node_name)
        self.max_held_bytes = max_held_bytes
        self._pods: Mapping[str, PodInfo] = MappingProxyType({})
        self._budget = self.new_budget()
        self._cuts: dict[str, int] = dict.fromkeys(CUT_REASONS, 0)
        self._cut_log = RateLimiter(60.0, max_keys=len(CUT_REASONS), clock=trio.current_time)
        self._ready = False
        self._connected = False
        self._resource_version: str | None = None
        self._relists = 0
        self._lists = 0
        self._synced_gauge: Gauge | None = None
        self._relists_counter: Counter | None = None
        self._cuts_counter: Counter | None = None
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
            self._cuts_counter = Counter(
                "hami_trio_pod_watch_cuts",
                "Pod labels, annotations and whole pods the pod watch did not keep, by reason",
                ["reason"],
                registry=registry,
            )
            for reason in CUT_REASONS:
                self._cuts_counter.labels(reason=reason)
            Gauge(
                "hami_trio_pod_watch_held_bytes",
                "Estimated bytes the pod watch holds for the pods of this node",
                registry=registry,
            ).set_function(lambda: self._budget.total)

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

    @property
    def held_bytes(self) -> int:
        """Estimated bytes held for the known pods (at most :attr:`max_held_bytes`, but for
        pods cut to their identity)."""
        return self._budget.total

    def cuts(self) -> Mapping[str, int]:
        """``reason -> count`` of everything not kept so far (see :class:`Cut`)."""
        return MappingProxyType(dict(self._cuts))

    def new_budget(self) -> PodBudget:
        """An empty budget of this source's size, reporting its cuts here (for a list)."""
        return PodBudget(self.max_held_bytes, on_cut=self.report_cut)

    def report_cut(self, cut: Cut) -> None:
        """Count ``cut`` and log it (at most one line a minute per reason)."""
        self._cuts[cut.reason] += 1
        if self._cuts_counter is not None:
            self._cuts_counter.labels(reason=cut.reason).inc()
        what = f"{cut.key} ({cut.size} bytes)" if cut.key else f"the pod ({cut.size} bytes held)"
        self._cut_log.log(
            _log,
            logging.WARNING,
            cut.reason,
            "pod watch: pod %s/%s: not keeping %s: %s; that pod's rows may be missing",
            cut.namespace,
            cut.name,
            what,
            _CUT_EXPLAINED[cut.reason],
        )

    # Driven by serve_pod_watch (trio thread) ---------------------------------------------------

    def set_connected(self, connected: bool) -> None:
        """Whether the watch stream is up now (the list is then authoritative)."""
        self._connected = connected
        if self._synced_gauge is not None:
            self._synced_gauge.set(1 if self.authoritative else 0)

    def replace(self, pods: PodBudget, resource_version: str) -> None:
        """A (re)list arrived: ``pods`` at ``resource_version`` are all there is."""
        self._budget = pods
        self._pods = MappingProxyType(pods.pods())
        self._resource_version = resource_version
        if self._lists:
            self._relists += 1
            if self._relists_counter is not None:
                self._relists_counter.inc()
        self._lists += 1
        self._ready = True
        self.set_connected(True)

    def apply(self, event: WatchEvent) -> None:
        """One watch event: a pod put or removed, the resource version moved on."""
        if event.pod is not None:
            if event.type == "DELETED":
                self._budget.remove(event.pod.uid)
            else:
                self._budget.put(event.pod)
            self._pods = MappingProxyType(self._budget.pods())
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


class _ContinueExpired(Exception):
    """A paginated list's ``continue`` token expired (410): start that list again."""


#: How often a list whose continue token expired starts again paginated; then in one request.
_PAGED_ATTEMPTS: Final = 3
#: The most bytes of an error response read (for its Status message).
_MAX_ERROR_BODY: Final = 64 * 1024
_CHUNK: Final = 64 * 1024


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
        self._source.set_connected(False)
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
        """List the node's pods page by page into a new budget, then replace the set.

        A ``continue`` token that expired in the middle (``410``) starts the list again from
        nothing, as a consistent read (what was read of it is dropped: no pod is duplicated or
        lost); after :data:`_PAGED_ATTEMPTS` such starts, the list is read in one request.
        """
        attempt = 0
        while True:
            page_size = self._settings.list_page_size if attempt < _PAGED_ATTEMPTS else 0
            try:
                budget, rv = await self._list_pages(resource_version, page_size)
            except _ContinueExpired as exc:
                attempt += 1
                resource_version = None
                _log.info("pod watch: %s; starting the list again", exc)
                continue
            break
        first = not self._source.ready
        self._source.replace(budget, rv)
        _log.log(
            logging.INFO if first else logging.DEBUG,
            "pod watch: listed %d pods on node %s (resourceVersion %s)",
            len(budget),
            self._source.node_name,
            rv,
        )

    async def _list_pages(
        self, resource_version: str | None, page_size: int
    ) -> tuple[PodBudget, str]:
        budget = self._source.new_budget()
        token = ""
        while True:
            kwargs: dict[str, Any] = {
                "field_selector": self._selector,
                "_preload_content": False,
                "_request_timeout": (
                    self._settings.connect_timeout,
                    self._settings.list_timeout,
                ),
            }
            if page_size:
                kwargs["limit"] = page_size
            if token:
                kwargs["_continue"] = token  # a continued list must not name a version
            elif resource_version is not None:
                kwargs["resource_version"] = resource_version
            page = await self._list_page(kwargs, budget, continued=bool(token))
            if not page.continue_token:
                return budget, page.resource_version
            token = page.continue_token

    async def _list_page(
        self, kwargs: dict[str, Any], budget: PodBudget, *, continued: bool
    ) -> ListPage:
        decoder = PodListDecoder(
            keep=self._settings.keep, on_skip=self._skip, on_cut=self._source.report_cut
        )
        try:
            response = await _aio(self._raw_list_pods, **kwargs)
            try:
                if response.status != 200:
                    code, message = parse_status(await _aio(response.content.read, _MAX_ERROR_BODY))
                    if continued and (response.status == 410 or code == 410):
                        raise _ContinueExpired(f"list continuation expired (HTTP 410 {message})")
                    raise _Retry(f"HTTP {response.status} {message}".rstrip())
                while True:
                    chunk = await _aio(response.content.read, _CHUNK)
                    if not chunk:
                        break
                    for pod in decoder.feed(chunk):
                        budget.put(pod)
                last, page = decoder.finish()
            finally:
                response.close()
        except _TRANSIENT as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        except WatchDecodeError as exc:
            raise _Retry(str(exc)) from exc
        for pod in last:
            budget.put(pod)
        return page

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
                    code, message = parse_status(await _aio(response.content.read, _MAX_ERROR_BODY))
                    if response.status == 410 or code == 410:
                        raise _Relist(f"watch expired (HTTP 410 {message})")
                    raise _Retry(f"HTTP {response.status} {message}".rstrip())
                # After a failure the source is authoritative again only once the resumed
                # watch delivered something (an event or a bookmark): events missed during
                # the outage are replayed first, and until then an unknown pod may only be
                # one we have not heard about yet.  A clean resume keeps the state as is.
                pending = bytearray()
                while True:
                    chunk = await _aio(response.content.read, _CHUNK)
                    if not chunk:
                        return events  # the server ended the watch (timeoutSeconds)
                    scanned = len(pending)
                    pending += chunk
                    start = 0
                    while (end := pending.find(b"\n", scanned)) != -1:
                        line = bytes(pending[start:end])
                        start = scanned = end + 1
                        if not line.strip():
                            continue
                        self._handle(line)
                        events += 1
                        self._backoff.reset()
                        if not self._source.authoritative:
                            self._source.set_connected(True)
                    del pending[:start]
                    if len(pending) > MAX_OBJECT_BYTES:
                        raise _Relist(f"watch event longer than {MAX_OBJECT_BYTES} bytes")
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
            event = parse_watch_event(
                line, keep=self._settings.keep, on_cut=self._source.report_cut
            )
        except WatchDecodeError as exc:
            raise _Relist(f"undecodable watch event ({exc})") from exc
        if event.type == "ERROR":
            if event.code == 410:
                raise _Relist(f"watch expired ({event.message})")
            raise _Retry(f"watch error {event.code}: {event.message}")
        self._source.apply(event)


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
                source.set_connected(False)
                # Close the aiohttp session even when cancelled, within a bounded time.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 5.0):
                    await _aio(api.close)
    if failure is not None:
        raise failure
