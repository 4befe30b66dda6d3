"""The agent: one trio nursery for the broker, the pod watch, the monitor and the endpoints.

How this works: :func:`serve_agent` opens one nursery and starts the tasks of :data:`TASKS`
with ``nursery.start()``, in that order (one start step each), each only once the previous
one is ready, then reports an :class:`AgentHandle`.  They share one Prometheus registry;
``/readyz`` runs real checks.  Every task runs under a supervisor: when one fails (or
returns unasked), trio cancels the others, each cleans up, and :func:`serve_agent` raises one
plain exception - the task's own :class:`~hami_trio.errors.HamiTrioError` if it failed before
it was ready, else :class:`~hami_trio.errors.AgentError` naming the task.
:meth:`AgentHandle.request_stop` drains within ``shutdown_timeout``; :func:`run_agent` adds
the signals (first drains, second cancels).  The ``debug`` task (:mod:`hami_trio.agent.debug`)
is no readiness check, but an address it cannot bind fails the start like the metrics
port's.  Tasks, readiness checks, stopping: docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio
from prometheus_client import CollectorRegistry

from hami_trio._trio import StartRecorder, leaf_errors, serve_under_signals, signal_name
from hami_trio._version import __version__
from hami_trio.agent.config import AgentConfig
from hami_trio.agent.debug import (
    PARTS,
    BrokerSummary,
    DebugExtras,
    MonitorSummary,
    PodWatchSummary,
    Selection,
    allocation_of,
    debug_state,
    export_of,
    insight_extras,
    part,
    render,
)
from hami_trio.agent.grants import pod_grants
from hami_trio.broker.server import BrokerHandle
from hami_trio.errors import AgentError, HamiTrioError
from hami_trio.goparse import BindAddress
from hami_trio.monitor.loop import Monitor
from hami_trio.pods.source import PodInfo, PodSource, StaticPodSource

if TYPE_CHECKING:
    from hami_trio.http.routes import Route, RouteAnswer
    from hami_trio.metrics.endpoint import ReadinessCheck
    from hami_trio.metrics.hostgpu import HostGpuSampler, NvmlLibrary
    from hami_trio.pods.watch import KubernetesPodSource

__all__ = ["TASKS", "AgentHandle", "mig_dir_detached", "run_agent", "serve_agent"]

logger = logging.getLogger(__name__)

#: The agent's tasks in start order (``broker`` and ``pod-watch`` only when configured).
TASKS: Final = (
    "broker",
    "pod-watch",
    "monitor",
    "lock-parent",
    "metrics",
    "debug",
    "nvml",
    "mig-mount",
)
#: The content type of the debug view's answers.
_JSON: Final = b"application/json"
#: How often the agent tries again to take the broker's socket path while another broker
#: serves it (seconds).
FOREIGN_BROKER_RETRY: Final = 30.0


class _Starter(Protocol):
    def __call__(self, *, task_status: Any) -> Awaitable[None]: ...


class _TaskFailure(Exception):
    """Internal: one supervised task failed; carries its name and error out of the nursery."""

    def __init__(self, task: str, started: bool, error: Exception) -> None:
        super().__init__(f"{task}: {error}")
        self.task = task
        self.started = started
        self.error = error


def _describe(error: BaseException) -> str:
    if isinstance(error, HamiTrioError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _public_error(failure: _TaskFailure) -> HamiTrioError:
    """What :func:`serve_agent` raises for a task's failure (see the module docstring)."""
    error = failure.error
    if isinstance(error, AgentError):
        return error
    if not failure.started and isinstance(error, HamiTrioError):
        return error
    what = "failed" if failure.started else "failed to start"
    return AgentError(
        failure.task, f"{failure.task} {what}: {_describe(error)}", started=failure.started
    )


def _task_failures(group: BaseExceptionGroup[BaseException]) -> list[_TaskFailure]:
    return [exc for exc in leaf_errors(group) if isinstance(exc, _TaskFailure)]


class AgentHandle:
    """What :func:`serve_agent` reports once every task is ready.

    Everything here may be read from any task; :meth:`request_stop` returns at once.
    """

    def __init__(
        self, agent: _Agent, metrics_address: BindAddress, debug_address: BindAddress | None
    ) -> None:
        self._agent = agent
        self._metrics_address = metrics_address
        self._debug_address = debug_address

    @property
    def config(self) -> AgentConfig:
        """The configuration the agent runs with."""
        return self._agent.config

    @property
    def registry(self) -> CollectorRegistry:
        """The one registry ``/metrics`` renders (every task's metrics)."""
        return self._agent.registry

    @property
    def metrics_address(self) -> BindAddress:
        """Where ``/metrics``, ``/healthz`` and ``/readyz`` listen (the real port if 0 was
        asked for; host ``""`` means every interface)."""
        return self._metrics_address

    @property
    def debug_address(self) -> BindAddress | None:
        """Where the debug view (``/debug/state``) listens; None when it is off."""
        return self._debug_address

    def debug_document(self, selection: Selection | None = None) -> dict[str, Any]:
        """The debug view's document as of now (what ``/debug/state`` answers)."""
        return self._agent.debug_document(selection or Selection())

    @property
    def broker(self) -> BrokerHandle | None:
        """The broker (socket path, live counters), or None when it is off."""
        return self._agent.broker

    @property
    def monitor(self) -> Monitor:
        """The monitor (``containers()``, ``paused``, ``ticks``)."""
        assert self._agent.monitor is not None
        return self._agent.monitor

    @property
    def pod_source(self) -> PodSource:
        """The pods the monitor knows (the Kubernetes watch, or a static source)."""
        assert self._agent.pod_source is not None
        return self._agent.pod_source

    def readiness(self) -> dict[str, bool]:
        """Each readiness check by name, evaluated now (what ``/readyz`` reports)."""
        return {name: bool(check()) for name, check in self._agent.checks.items()}

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._agent.stopping

    def request_stop(self) -> None:
        """Drain and stop: the broker stops accepting and finishes its in-flight exchanges,
        the monitor finishes its tick, then everything else is cancelled.

        :func:`serve_agent` returns once that is done, or once ``shutdown_timeout`` passed
        (what is left is then cancelled).  Calling it again does nothing.
        """
        self._agent.request_stop()


class _MigLockDirCheck:
    """Readiness line ``mig-lock-dir``: fails, with the reason, while the directory is refused.

    Informational (see :func:`~hami_trio.metrics.endpoint.make_handler`): it never makes the agent
    unready, because whoever can create the directory first could otherwise take the node's
    metrics endpoint out of the Service.
    """

    informational = True

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor

    def __call__(self) -> bool:
        return self._monitor.mig_lock_problem is None

    def reason(self) -> str:
        problem = self._monitor.mig_lock_problem
        return "" if problem is None else problem.message


def mig_dir_detached(directory: os.PathLike[str] | str) -> bool:
    """Whether ``directory`` resolves to a directory that was deleted (link count 0).

    On an ordinary filesystem a path never resolves to a deleted directory; it does when the
    path is a bind mount (the chart's hostPath of ``/tmp/hami``) whose source was removed on
    the host: the mount keeps the dead directory, and a MIG lock created in the host's new
    ``/tmp/hami`` would never be seen.  Missing or unreadable: False (the monitor reports it).
    """
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_nlink == 0


async def _watch_mig_mount(
    directory: os.PathLike[str] | str,
    interval: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Fail the agent once the MIG lock's directory mount went stale (only a remount helps).

    Raises:
        AgentError: the directory was deleted on the host; the restart (exit status 1)
            lets the kubelet mount the host's current directory again (DirectoryOrCreate).
    """
    task_status.started()
    while True:
        await trio.sleep(interval)
        if mig_dir_detached(directory):
            raise AgentError(
                "mig-mount",
                f"MIG lock directory {directory} was deleted on the host while mounted: this "
                "mount can no longer see MIG locks; exiting so that it is mounted again",
                started=True,
            )


class _Agent:
    """The state :func:`serve_agent` shares between its tasks and the handle."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self.broker: BrokerHandle | None = None
        #: Why the broker waits (another broker serves its socket path), None otherwise.
        self.broker_foreign: str | None = None
        self.monitor: Monitor | None = None
        self.pod_source: PodSource | None = None
        self.pod_watch: KubernetesPodSource | None = None
        # What the other parts add to each debug entry (process states, blocking, the
        # allocation, the export decision); None parts are rendered as null.
        self.debug_extras = DebugExtras()
        self.checks: dict[str, ReadinessCheck] = {}
        self.stopping = False
        self._stop = trio.Event()
        self._finished = {"broker": trio.Event(), "monitor": trio.Event()}

    def request_stop(self) -> None:
        self.stopping = True
        self._stop.set()

    async def supervise(
        self, name: str, serve: _Starter, *, task_status: trio.TaskStatus[Any]
    ) -> None:
        """Run one task; record its name and whether it started if it fails or returns."""
        status = StartRecorder(task_status)
        try:
            await serve(task_status=status)
        except Exception as exc:
            # Exception, not BaseException: trio.Cancelled must pass through untouched.
            raise _TaskFailure(name, status.done, exc) from exc
        if not self.stopping:
            raise _TaskFailure(
                name,
                status.done,
                AgentError(name, f"{name} stopped although no stop was requested", started=True),
            )
        if name in self._finished:
            self._finished[name].set()

    async def serve_broker_beside_others(
        self,
        serve: Callable[..., Awaitable[None]],
        *,
        task_status: trio.TaskStatus[BrokerHandle | None],
    ) -> None:
        """Serve the broker; while another broker serves its socket path, wait beside it.

        A :class:`~hami_trio.errors.ForeignBrokerError` before ready (HAMi's device-plugin
        broker during a cut-over, or a second agent) does not fail the agent: it reports
        ``None``, says so once (log, ``hami_trio_broker_foreign_listener``, the debug view)
        and tries again every :data:`FOREIGN_BROKER_RETRY` seconds - never touching the
        other broker's socket or lock - until the path is free or the agent stops.
        """
        from prometheus_client import Gauge

        from hami_trio.errors import ForeignBrokerError

        foreign = Gauge(
            "hami_trio_broker_foreign_listener",
            "1 while another broker serves the broker's socket path (it answers there or holds "
            "the lock), so this agent's broker waits beside it instead of fighting it.",
            registry=self.registry,
        )
        reported = False

        def started(handle: BrokerHandle) -> None:
            nonlocal reported
            if self.broker_foreign is not None:
                logger.info(
                    "the other broker is gone: this agent's broker listens on %s",
                    handle.socket_path,
                    extra={"event": "foreign_broker_gone"},
                )
            self.broker, self.broker_foreign = handle, None
            foreign.set(0)
            if not reported:
                reported = True
                task_status.started(handle)
            elif self.stopping:
                handle.stop()

        class _Status:
            def started(self, value: BrokerHandle) -> None:
                started(value)

        while not self.stopping:
            try:
                await serve(registry=self.registry, task_status=_Status())
                return
            except ForeignBrokerError as exc:
                if self.broker is not None:
                    raise  # raised only before ready: never after a start
                if self.broker_foreign != str(exc):
                    logger.warning(
                        "another broker serves the broker's socket path, so this agent "
                        "runs without its broker and tries again every %gs: %s. Switch the "
                        "other one off (HAMi's device plugin: devicePlugin.hostPIDBroker."
                        "enabled=false; see docs/migration.md)",
                        FOREIGN_BROKER_RETRY,
                        exc,
                        extra={"event": "foreign_broker"},
                    )
                self.broker_foreign = str(exc)
                foreign.set(1)
            if not reported:
                reported = True
                task_status.started(None)
            with trio.move_on_after(FOREIGN_BROKER_RETRY):
                await self._stop.wait()

    def broker_ready(self) -> bool:
        """Readiness: the broker listens (see :meth:`broker_listening`), or it waits beside
        another broker that serves the path (the node's workloads are served)."""
        if self.broker is None and self.broker_foreign is not None:
            return not self.stopping
        return self.broker_listening()

    def broker_listening(self) -> bool:
        """Readiness: the broker's socket path still names the socket it bound."""
        broker = self.broker
        if broker is None or self.stopping:
            return False
        try:
            st = os.lstat(broker.socket_path)
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == broker.identity

    async def run(
        self,
        nursery: trio.Nursery,
        nvml: NvmlLibrary | None,
        task_status: trio.TaskStatus[AgentHandle],
    ) -> None:
        """Start the tasks of :data:`TASKS` in order, report the handle, serve until asked to
        stop, then drain."""
        from hami_trio.metrics.collector import BuildInfoCollector
        from hami_trio.metrics.hostgpu import HostGpuSampler

        self.registry.register(BuildInfoCollector())
        await self._start_broker(nursery)
        all_pods = await self._start_pod_watch(nursery)
        sampler = HostGpuSampler(nvml)
        monitor = await self._start_monitor(nursery, sampler, all_pods)
        await self._start_lock_parent(nursery)
        bound = await self._start_metrics(nursery, monitor)
        debug_bound = await self._start_debug(nursery)
        await self._start_nvml(nursery, sampler, monitor)
        await self._start_mig_mount(nursery)
        self._log_ready(bound, debug_bound)
        task_status.started(AgentHandle(self, bound, debug_bound))

        await self._stop.wait()
        await self._drain()
        nursery.cancel_scope.cancel()

    async def _start_broker(self, nursery: trio.Nursery) -> None:
        """``broker``: only when configured; waits beside a foreign broker."""
        # Imported here, not at the top: the other hami-trio commands never need them.
        from hami_trio.broker.server import serve_broker

        config = self.config
        if config.broker is not None:
            self.broker = await nursery.start(
                self.supervise,
                "broker",
                partial(self.serve_broker_beside_others, partial(serve_broker, config.broker)),
            )
            self.checks["broker"] = self.broker_ready

    async def _start_pod_watch(
        self, nursery: trio.Nursery
    ) -> Callable[[], Mapping[str, PodInfo]] | None:
        """``pod-watch``: only with Kubernetes; returns every pod of the node, or None."""
        config = self.config
        registry = self.registry
        all_pods: Callable[[], Mapping[str, PodInfo]] | None = None
        if config.kubernetes is not None:
            # Only here: kubernetes-asyncio, aiohttp and trio-asyncio cost about 50 MiB of
            # RSS and half a second, which --no-kubernetes never needs.
            from hami_trio.pods.watch import KubernetesPodSource, WatchSettings, serve_pod_watch

            watch = KubernetesPodSource(config.node_name, registry=registry)
            # Only the labels the agent exports are kept (a pod may carry thousands).
            keep = WatchSettings().keep.with_labels(config.pod_labels_allowlist)
            settings = WatchSettings(keep=keep)
            await nursery.start(
                self.supervise,
                "pod-watch",
                partial(serve_pod_watch, watch, config.kubernetes, settings=settings),
            )
            self.pod_source, all_pods = watch, watch.pods
            self.pod_watch = watch
            self.checks["pod-watch"] = lambda: watch.ready
        else:
            self.pod_source = StaticPodSource()
        return all_pods

    async def _start_monitor(
        self,
        nursery: trio.Nursery,
        sampler: HostGpuSampler,
        all_pods: Callable[[], Mapping[str, PodInfo]] | None,
    ) -> Monitor:
        """``monitor``, with the collectors, the debug extras and the checks that read it."""
        from hami_trio.metrics.collector import VGpuCollector
        from hami_trio.metrics.endpoint import progress_check
        from hami_trio.metrics.pods import PodCollector

        config = self.config
        registry = self.registry
        assert self.pod_source is not None
        monitor = Monitor(
            config.monitor,
            pod_source=self.pod_source,
            registry=registry,
            # With Kubernetes, what a pod's annotation and spec give each container is what
            # the feedback counts it with, not what its .cache file claims.
            grants=None if config.kubernetes is None else pod_grants,
        )
        self.monitor = monitor
        # The process and blocking extras are made per document, over its usage read.
        self._wall_offset = time.time() - trio.current_time()
        self.debug_extras = DebugExtras(
            allocation=allocation_of,
            export=export_of(
                node_name=config.node_name,
                kubernetes=config.kubernetes is not None,
                paused=lambda: monitor.paused,
            ),
            feedback=monitor.claim,
        )
        vgpu = VGpuCollector(
            monitor,
            self.pod_source,
            node_name=config.node_name,
            kubernetes=config.kubernetes is not None,
            all_pods=all_pods,
            host=sampler,
            legacy=config.legacy_metrics,
            insights=True,
        )
        if all_pods is not None:  # allocations and pod metadata come from Kubernetes
            # Registered first: a scrape collects in registration order, so the pod rows'
            # failures are in the same scrape's hami_trio_collector_errors_total.
            registry.register(
                PodCollector(
                    all_pods,
                    node_name=config.node_name,
                    label_allowlist=config.pod_labels_allowlist,
                    report_failure=vgpu.report_failure,
                )
            )
        registry.register(vgpu)
        # A tick may take up to its deadline; three intervals without one is a stall.
        monitor_config = config.monitor
        stall = 3 * monitor_config.interval + (
            monitor_config.tick_deadline or monitor_config.interval
        )
        self.checks["monitor"] = progress_check(
            lambda: monitor.ticks, max_stall=stall, idle=lambda: monitor.paused
        )
        self.checks["mig-lock-dir"] = _MigLockDirCheck(monitor)
        await nursery.start(self.supervise, "monitor", monitor.serve)
        return monitor

    async def _start_lock_parent(self, nursery: trio.Nursery) -> None:
        """``lock-parent``: the allocation lock's parent directory, checked every tick."""
        from hami_trio.allocation.watch import (
            LockParentWatch,
            MountPointCheck,
            serve_lock_parent_watch,
        )

        config = self.config
        lock_parent = LockParentWatch(
            str(config.lock_parent_path),
            owner=os.geteuid(),
            broker=config.broker is not None,
            registry=self.registry,
        )
        # --prepare-lock-parent: prepared like an allocation before the first check.
        prepare = config.prepare_lock_parent
        await nursery.start(
            self.supervise,
            "lock-parent",
            partial(serve_lock_parent_watch, lock_parent, config.monitor.interval, prepare=prepare),
        )
        if prepare and config.broker is not None:
            self.checks["lock-mount-point"] = MountPointCheck(lock_parent)

    async def _start_metrics(self, nursery: trio.Nursery, monitor: Monitor) -> BindAddress:
        """``metrics``: ``/metrics``, ``/healthz`` and ``/readyz``; returns where it listens."""
        from hami_trio.metrics.endpoint import serve_http

        config = self.config
        bound: BindAddress = await nursery.start(
            self.supervise,
            "metrics",
            partial(
                serve_http,
                config.metrics_bind,
                self.registry,
                self.checks,
                limits=config.http_limits,
                # One body per tick: every scrape between two ticks shares it.
                freshness=config.monitor.interval,
                generation=lambda: monitor.ticks,
                # The usage read a body shows, made before the registry is collected.
                prepare=monitor.usage,
            ),
        )
        return bound

    async def _start_debug(self, nursery: trio.Nursery) -> BindAddress | None:
        """``debug``: only with a debug address; returns where it listens, or None."""
        from hami_trio.http.routes import serve_routes

        config = self.config
        if config.debug_bind is None:
            return None
        debug_bound: BindAddress = await nursery.start(
            self.supervise,
            "debug",
            partial(
                serve_routes,
                config.debug_bind,
                self.debug_routes(),
                name="--debug-bind-address",
                limits=config.http_limits,
            ),
        )
        return debug_bound

    async def _start_nvml(
        self, nursery: trio.Nursery, sampler: HostGpuSampler, monitor: Monitor
    ) -> None:
        """``nvml``: releases NVML while the monitor is paused."""
        from hami_trio.metrics.hostgpu import serve_nvml_release

        await nursery.start(
            self.supervise, "nvml", partial(serve_nvml_release, sampler, lambda: monitor.paused)
        )

    async def _start_mig_mount(self, nursery: trio.Nursery) -> None:
        """``mig-mount``: fails the agent once the MIG lock's directory mount went stale."""
        monitor_config = self.config.monitor
        await nursery.start(
            self.supervise,
            "mig-mount",
            partial(_watch_mig_mount, monitor_config.mig_lock_path.parent, monitor_config.interval),
        )

    def _log_ready(self, bound: BindAddress, debug_bound: BindAddress | None) -> None:
        config = self.config
        monitor_config = config.monitor
        broker_text = (
            str(self.broker.socket_path)
            if self.broker is not None
            else "waiting beside another broker"
            if self.broker_foreign is not None
            else "off"
        )
        pods_text = (
            config.kubernetes.describe()
            if config.kubernetes is not None
            else "off (--no-kubernetes)"
        )
        debug_text = "off" if debug_bound is None else str(debug_bound)
        logger.info(
            "agent ready: broker %s, pod watch %s, monitor on %s, metrics on %s, debug view %s",
            broker_text,
            pods_text,
            monitor_config.containers_dir,
            bound,
            debug_text,
            extra={
                "event": "ready",
                "broker_socket": broker_text,
                "pod_watch": pods_text,
                "containers_dir": str(monitor_config.containers_dir),
                "metrics_address": str(bound),
                "debug_address": debug_text,
            },
        )

    def _broker_summary(self) -> BrokerSummary | None:
        broker, config = self.broker, self.config.broker
        if broker is not None:
            return BrokerSummary(
                str(broker.socket_path),
                {str(k): n for k, n in broker.stats.counts.items()},
                broker.in_flight,
            )
        if config is not None and self.broker_foreign is not None:
            return BrokerSummary(str(config.socket_path), {}, 0, foreign=self.broker_foreign)
        return None

    def debug_document(self, selection: Selection) -> dict[str, Any]:
        """The debug view as of now; reads only immutable views (safe in a worker thread)."""
        monitor, pod_source = self.monitor, self.pod_source
        assert monitor is not None
        assert pod_source is not None
        problem = monitor.mig_lock_problem
        watch = self.pod_watch
        if watch is None:
            pods = PodWatchSummary(
                "static",
                pod_source.ready,
                pod_source.authoritative,
                node_name=self.config.node_name,
            )
        else:
            pods = PodWatchSummary(
                "kubernetes",
                watch.ready,
                watch.authoritative,
                pods=len(watch.pods()),
                resource_version=watch.resource_version,
                relists=watch.relists,
                node_name=watch.node_name,
            )
        # One usage read for the document: its containers and insights belong together.
        usage = monitor.usage()
        process_state, blocking = insight_extras(
            lambda: usage.insights, wall_offset=self._wall_offset
        )
        extras = dataclasses.replace(
            self.debug_extras, process_state=process_state, blocking=blocking
        )
        return debug_state(
            usage.containers,
            pod_source,
            now=time.time(),
            node_name=self.config.node_name,
            version=__version__,
            monitor=MonitorSummary(
                containers_dir=str(monitor.config.containers_dir),
                interval=monitor.config.interval,
                ticks=monitor.ticks,
                paused=monitor.paused,
                mig_lock_problem=None if problem is None else problem.message,
                removals_pending=monitor.lister.removals.pending,
                checks_liveness=monitor.checks_liveness,
                foreign_writer=monitor.foreign_writer,
                usage_read_at=usage.read_at,
            ),
            pods=pods,
            broker=self._broker_summary(),
            extras=extras,
            selection=selection,
        )

    def debug_routes(self) -> dict[str, Route]:
        """``/debug/state`` (the whole document) and ``/debug/<part>`` for each part."""

        def route(name: str | None) -> Route:
            def answer(params: Mapping[str, list[str]]) -> RouteAnswer:
                document = self.debug_document(Selection.from_query(params))
                return 200, _JSON, render(document if name is None else part(document, name))

            return answer

        routes = {"/debug/state": route(None)}
        routes |= {f"/debug/{name}": route(name) for name in PARTS}
        return routes

    async def _drain(self) -> None:
        """Stop the broker and the monitor gracefully, within ``shutdown_timeout``."""
        timeout = self.config.shutdown_timeout
        with trio.move_on_after(timeout) as deadline:
            if self.broker is not None:
                self.broker.stop()
            assert self.monitor is not None
            self.monitor.request_stop()
            await self._finished["monitor"].wait()
            if self.config.broker is not None:
                await self._finished["broker"].wait()
        if deadline.cancelled_caught:
            logger.warning(
                "graceful stop took longer than %gs; cancelling what is left",
                timeout,
                extra={"event": "drain_timeout"},
            )
        served = self.broker.stats.total if self.broker is not None else 0
        ticks = self.monitor.ticks if self.monitor is not None else 0
        logger.info(
            "agent stopped (%d broker exchanges served, %d monitor ticks)",
            served,
            ticks,
            extra={"event": "stopped", "broker_exchanges": served, "monitor_ticks": ticks},
        )


async def serve_agent(
    config: AgentConfig,
    *,
    nvml: NvmlLibrary | None = None,
    task_status: trio.TaskStatus[AgentHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the whole agent until :meth:`AgentHandle.request_stop` or cancellation.

    Start it with ``handle = await nursery.start(serve_agent, config)``: the handle comes only
    once every task is ready (see the module docstring for the order).

    Args:
        config: what to run (:func:`~hami_trio.agent.config.resolve_config`).
        nvml: the NVML binding for host GPU metrics (default ``pynvml``; tests pass a fake).
        task_status: trio's start protocol; receives the :class:`AgentHandle`.

    Raises:
        HamiTrioError: a task could not start; the task's own error (for example
            :class:`~hami_trio.errors.BrokerStartupError`,
            :class:`~hami_trio.errors.HttpServerError`,
            :class:`~hami_trio.errors.PodSourceError`).  Nothing is left running and the
            broker's socket is gone.
        AgentError: a task failed after the start (or failed to start with an error that is
            not a HamiTrioError); every other task was cancelled and cleaned up.
    """
    agent = _Agent(config)
    try:
        async with trio.open_nursery() as nursery:
            await agent.run(nursery, nvml, task_status)
    except BaseExceptionGroup as group:
        failures = _task_failures(group)
        if not failures:
            raise
        first, *others = failures
        for other in others:
            logger.error("%s also failed: %s", other.task, _describe(other.error))
        logger.debug("%s failed", first.task, exc_info=first.error)
        error = _public_error(first)
        if error is first.error:
            raise error from error.__cause__
        raise error from first.error


async def run_agent(
    config: AgentConfig,
    *,
    nvml: NvmlLibrary | None = None,
    task_status: trio.TaskStatus[AgentHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve_agent` driven by SIGTERM and SIGINT: what ``hami-trio run`` runs.

    The first signal drains (one that comes during the start-up lets it finish, then drains),
    a second one cancels everything at once; either way this returns normally.  Signals are
    caught from before the first task starts, so none can kill the process half-way.

    Raises:
        HamiTrioError: as :func:`serve_agent`.
    """
    what = (
        "the current tick and the broker's in-flight exchanges"
        if config.broker is not None
        else "the current tick"
    )

    def first(signum: int) -> None:
        name = signal_name(signum)
        logger.info(
            "%s, stopping after %s (at most %gs; a second signal cancels at once)",
            name,
            what,
            config.shutdown_timeout,
            extra={"event": "stopping", "signal": name},
        )
        # During the start-up, the drain begins once it finished (each of its steps is
        # bounded: a broker probe, a kubeconfig load, one monitor tick, a bind).

    def second(signum: int) -> None:
        logger.warning(
            "%s again: cancelling what is still running",
            signal_name(signum),
            extra={"event": "cancelling"},
        )

    await serve_under_signals(
        partial(serve_agent, config, nvml=nvml),
        AgentHandle.request_stop,
        first=first,
        second=second,
        errors=HamiTrioError,
        task_status=task_status,
    )
