"""The monitor's tick loop: refresh, Observe, write back - paused while the MIG lock exists.

How this works.  :class:`Monitor` owns a :class:`~hami_trio.monitor.lister.ContainerLister`
and runs, every ``interval`` seconds of ``trio.current_time()`` (default 5 s):

1. ``lister.update()`` - read every container (with checkpoints, see the lister);
2. :func:`~hami_trio.monitor.feedback.observe` on the loaded snapshots (pure);
3. a last ``lstat`` of the MIG lock, then ``lister.apply(writes)`` (synchronous, no
   checkpoint: a tick's writes are never half-applied because of a cancellation).

Each tick runs under its own deadline (``tick_deadline``, default: the interval); a tick that
overruns is abandoned at its next checkpoint, logged, and nothing of it is published.

MIG lock (SPEC M-7).  While ``/tmp/hami/hami-mig-apply.lock`` (configurable) exists, the
feedback loop's cancel scope is cancelled and no shared region is read or written; the loop
resumes (with an immediate tick) once the lock is gone.  The lock is watched with inotify on
its directory (``inotify_simple`` under ``trio.lowlevel.wait_readable``), which cancels a
running tick within one checkpoint, and ``lstat``-ed before every tick and before every batch
of writes, so a lock that exists at start-up pauses from the start (upstream misses that) and
a lost watch only costs latency.  The directory is created 0755 at start-up; any failure
there is logged, never fatal.  Pause and resume are logged once each.

Self-metrics (names fixed by the project's metric contract) go into the injected registry:
``hami_trio_monitor_tick_duration_seconds``, ``hami_trio_monitor_containers``,
``hami_trio_monitor_files_rejected_total{reason}``, ``hami_trio_monitor_mig_paused`` and
``hami_trio_monitor_removals_total{outcome}`` (gone pods' directories; the removal runs
beside the ticks, see the lister).

API for the daemon and the metrics collector::

    async with trio.open_nursery() as nursery:
        monitor = await nursery.start(
            functools.partial(serve_monitor, config, pod_source=source, registry=registry)
        )
        monitor.containers()   # Mapping[ContainerKey, ContainerState]; never touches a file
        monitor.paused         # True while the MIG lock holds the loop
        monitor.request_stop() # finish the current tick, then serve_monitor returns

``task_status.started(monitor)`` is called after the first tick has completed (so the first
scrape has data), or at once if the MIG lock holds the loop paused at start-up.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import inotify_simple
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hami_trio.config import parse_go_duration
from hami_trio.errors import ConfigError
from hami_trio.logs import RateLimiter
from hami_trio.monitor.feedback import observe
from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.lister import ContainerKey, ContainerLister, ContainerState
from hami_trio.monitor.podsource import PodSource
from hami_trio.monitor.usage import UsageSnapshot

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_MIG_LOCK_PATH",
    "DEFAULT_RESYNC_INTERVAL",
    "Monitor",
    "MonitorConfig",
    "prepare_lock_dir",
    "serve_monitor",
]

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0
DEFAULT_RESYNC_INTERVAL = 300.0
DEFAULT_MIG_LOCK_PATH = Path("/tmp/hami/hami-mig-apply.lock")
HOOK_PATH_ENV = "HOOK_PATH"
RESYNC_ENV = "HAMI_RESYNC_INTERVAL"
_TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LOCK_EVENTS = (
    inotify_simple.flags.CREATE
    | inotify_simple.flags.DELETE
    | inotify_simple.flags.MOVED_FROM
    | inotify_simple.flags.MOVED_TO
    | inotify_simple.flags.DELETE_SELF
    | inotify_simple.flags.MOVE_SELF
)


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Everything the monitor needs to run (SPEC M-1).  Build with :meth:`from_env`.

    ``tick_deadline`` None means "the interval".
    """

    hook_path: Path
    interval: float = DEFAULT_INTERVAL
    resync_interval: float = DEFAULT_RESYNC_INTERVAL
    mig_lock_path: Path = field(default=DEFAULT_MIG_LOCK_PATH)
    tick_deadline: float | None = None

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ConfigError(f"--interval: must be > 0 seconds, got {self.interval}")
        if self.tick_deadline is not None and not self.tick_deadline > 0:
            raise ConfigError(f"tick deadline must be > 0 seconds, got {self.tick_deadline}")
        if self.resync_interval < 0:
            raise ConfigError(f"{RESYNC_ENV}: must not be negative, got {self.resync_interval}")

    @property
    def containers_dir(self) -> Path:
        """``$HOOK_PATH/containers``."""
        return self.hook_path / "containers"

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        hook_path: str | os.PathLike[str] | None = None,
        interval: float | None = None,
        mig_lock_path: str | os.PathLike[str] | None = None,
        tick_deadline: float | None = None,
    ) -> MonitorConfig:
        """Read ``HOOK_PATH`` and ``HAMI_RESYNC_INTERVAL``; flags given here win.

        Args:
            env: the environment (``os.environ``).
            hook_path: ``--hook-path``, overriding ``HOOK_PATH``.
            interval: ``--interval`` in seconds.
            mig_lock_path: ``--mig-lock-path``.
            tick_deadline: per-tick deadline in seconds (default: the interval).

        Returns:
            The configuration.  An invalid ``HAMI_RESYNC_INTERVAL`` (not a Go duration, or
            negative) is logged as a warning and replaced by the default 5m, as HAMi does.

        Raises:
            ConfigError: ``HOOK_PATH`` unset/empty or not an existing directory; a
                non-positive interval.
        """
        raw_hook = os.fspath(hook_path) if hook_path is not None else env.get(HOOK_PATH_ENV, "")
        if not raw_hook:
            raise ConfigError(
                f"{HOOK_PATH_ENV} is not set: set it (or --hook-path) to the HAMi hook "
                "directory, e.g. /usr/local/vgpu, whose containers/ holds the .cache files"
            )
        hook = Path(raw_hook)
        if not hook.is_dir():
            raise ConfigError(f"{HOOK_PATH_ENV}={raw_hook!r} does not exist or is not a directory")
        resync = DEFAULT_RESYNC_INTERVAL
        text = env.get(RESYNC_ENV)
        if text:
            try:
                value = parse_go_duration(text, name=RESYNC_ENV)
                if value < 0:
                    raise ConfigError(f"{RESYNC_ENV}: negative duration {text!r}")
                resync = value
            except ConfigError as exc:
                logger.warning("%s; using the default %gs", exc, DEFAULT_RESYNC_INTERVAL)
        return cls(
            hook_path=hook,
            interval=DEFAULT_INTERVAL if interval is None else interval,
            resync_interval=resync,
            mig_lock_path=(DEFAULT_MIG_LOCK_PATH if mig_lock_path is None else Path(mig_lock_path)),
            tick_deadline=tick_deadline,
        )


def prepare_lock_dir(directory: Path) -> None:
    """Create the MIG lock directory with mode 0755 if it is missing (never fatal).

    An existing directory is left as it is (HAMi's device plugin creates the same one).
    Failures are logged: the monitor still works, the lock is then polled each tick.
    """
    try:
        os.makedirs(directory.parent, mode=0o755, exist_ok=True)
        os.mkdir(directory, 0o755)
    except FileExistsError:
        if not directory.is_dir():
            logger.warning("MIG lock directory %s exists but is not a directory", directory)
        return
    except OSError as exc:
        logger.warning("cannot create MIG lock directory %s: %s", directory, exc)
        return
    try:
        os.chmod(directory, 0o755)  # mkdir's mode went through the umask
    except OSError as exc:  # pragma: no cover - we just created it
        logger.warning("cannot chmod MIG lock directory %s: %s", directory, exc)


def _raise_fd_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to the hard limit: one descriptor per container."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:  # pragma: no cover - hard limit is allowed
            logger.warning("cannot raise the open-file limit to %d: %s", target, exc)


class _SelfMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tick = Histogram(
            "hami_trio_monitor_tick_duration_seconds",
            "Wall time of one monitor tick (refresh, Observe, write back).",
            buckets=_TICK_BUCKETS,
            registry=registry,
        )
        self.containers = Gauge(
            "hami_trio_monitor_containers",
            "Containers whose .cache file loaded in the latest tick.",
            registry=registry,
        )
        self.rejected = Counter(
            "hami_trio_monitor_files_rejected_total",
            "Times a container's .cache file started being rejected, by reason.",
            ["reason"],
            registry=registry,
        )
        self.paused = Gauge(
            "hami_trio_monitor_mig_paused",
            "1 while the MIG apply lock holds the feedback loop paused.",
            registry=registry,
        )
        for reason in RejectReason:
            self.rejected.labels(reason=reason.value)
        self.removals = Counter(
            "hami_trio_monitor_removals_total",
            "Removals of gone pods' container directories that ended, by outcome "
            "(removed, failed: something was left behind).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("removed", "failed"):
            self.removals.labels(outcome=outcome)


class _LockWatch:
    """inotify on the lock's directory; calls ``on_change`` for events about the lock."""

    def __init__(self, path: Path, on_change: Callable[[], None]) -> None:
        self._path = path
        self._on_change = on_change
        self._inotify: inotify_simple.INotify | None = None
        self._warned = False

    def ensure(self) -> None:
        """Set up the watch if it is not (still) there; failures are logged once."""
        if self._inotify is not None:
            return
        try:
            notify = inotify_simple.INotify(nonblocking=True)
        except OSError as exc:
            self._warn(exc)
            return
        try:
            notify.add_watch(os.fspath(self._path.parent), _LOCK_EVENTS)
        except OSError as exc:
            notify.close()
            self._warn(exc)
            return
        self._inotify = notify

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "cannot watch %s with inotify (%s); checking the MIG lock once per tick",
                self._path.parent,
                exc.strerror or exc,
            )

    async def run(self) -> None:
        """Forward inotify events until cancelled; re-arms when the directory is replaced."""
        while True:
            notify = self._inotify
            if notify is None:
                await trio.sleep(1.0)
                self.ensure()
                continue
            await trio.lowlevel.wait_readable(notify.fileno())
            try:
                events = notify.read(timeout=0)
            except OSError as exc:  # pragma: no cover - reading a ready inotify fd
                logger.warning("inotify read failed: %s", exc)
                events = []
            lost = any(event.mask & inotify_simple.flags.IGNORED for event in events)
            if lost:
                self.close()
            if lost or any(event.name == self._path.name or not event.name for event in events):
                self._on_change()

    def close(self) -> None:
        notify, self._inotify = self._inotify, None
        if notify is not None:
            notify.close()


class Monitor:
    """The vGPU monitor: one lister, the feedback loop and the MIG pause.

    Args:
        config: see :class:`MonitorConfig`.
        pod_source: the live pods (Kubernetes watch, or ``StaticPodSource``).
        registry: where the self-metrics go (a private registry if None).
        wall_clock: Unix time for directory ages (tests inject one).
    """

    def __init__(
        self,
        config: MonitorConfig,
        *,
        pod_source: PodSource,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._metrics = _SelfMetrics(registry if registry is not None else CollectorRegistry())
        self._lister = ContainerLister(
            config.containers_dir,
            pod_source,
            resync_interval=config.resync_interval,
            on_reject=lambda reason: self._metrics.rejected.labels(reason=reason).inc(),
            wall_clock=wall_clock,
            on_removal=lambda outcome: self._metrics.removals.labels(outcome=outcome).inc(),
        )
        self._watch = _LockWatch(config.mig_lock_path, self._lock_changed)
        self._paused = False
        self._stop = False
        self._serving = False
        self._ticks = 0
        self._running: trio.CancelScope | None = None
        self._wakeup = trio.Event()
        self._limiter = RateLimiter(60.0, clock=trio.current_time)
        self._lock_error_logged = False

    # -- read-only state ------------------------------------------------------------------

    @property
    def config(self) -> MonitorConfig:
        """The configuration this monitor runs with."""
        return self._config

    def containers(self) -> Mapping[ContainerKey, ContainerState]:
        """The latest completed tick's containers; never touches a file (see the lister)."""
        return self._lister.containers()

    @property
    def paused(self) -> bool:
        """True while the MIG lock holds the feedback loop."""
        return self._paused

    @property
    def ticks(self) -> int:
        """Ticks completed since start."""
        return self._ticks

    # -- control --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after the current tick (or at once if idle or paused); ``serve`` returns."""
        self._stop = True
        self._wakeup.set()

    def close(self) -> None:
        """Close every file handle.  :meth:`serve` does this on exit; call it yourself only
        after driving :meth:`tick` directly (benchmarks, tests)."""
        self._lister.close()

    def _stopping(self) -> bool:
        # A method, not the attribute: the loop re-reads it after every await.
        return self._stop

    def _lock_changed(self) -> None:
        if self._lock_present() and self._running is not None:
            self._running.cancel()
        self._wakeup.set()

    def _lock_present(self) -> bool:
        try:
            os.lstat(self._config.mig_lock_path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return False
            if not self._lock_error_logged:
                self._lock_error_logged = True
                logger.warning("cannot check MIG lock %s: %s", self._config.mig_lock_path, exc)
            return False
        return True

    # -- one tick --------------------------------------------------------------------------

    async def tick(self) -> int:
        """Refresh every container, run Observe and apply the writes, once.

        :meth:`serve` calls this every interval; call it directly only when not serving.

        Returns:
            The number of control words written.
        """
        started = time.perf_counter()
        view = await self._lister.update()
        snapshots: dict[ContainerKey, UsageSnapshot] = {
            key: state.snapshot for key, state in view.items() if state.snapshot is not None
        }
        self._metrics.containers.set(len(snapshots))
        writes = observe(snapshots)
        written = 0
        if writes and not self._lock_present():
            written = self._lister.apply(writes)
        self._ticks += 1
        self._metrics.tick.observe(time.perf_counter() - started)
        return written

    async def _guarded_tick(self) -> None:
        deadline = self._config.tick_deadline or self._config.interval
        with trio.move_on_after(deadline) as scope:
            await self.tick()
        if scope.cancelled_caught:
            self._limiter.log(
                logger,
                logging.WARNING,
                "deadline",
                "monitor tick exceeded its %gs deadline and was abandoned",
                deadline,
            )

    async def _wait_until(self, deadline: float, done: Callable[[], bool]) -> None:
        """Sleep until ``done()`` or ``deadline``; re-checks ``done`` on every wake-up.

        The event is replaced *before* ``done`` is evaluated, so a wake-up that races with
        the check is never lost.
        """
        while True:
            self._wakeup = trio.Event()
            if done() or trio.current_time() >= deadline:
                return
            with trio.move_on_at(deadline):
                await self._wakeup.wait()

    async def _wait_paused(self) -> None:
        """Wait for the lock to go (inotify wake-up, or a re-check every interval)."""
        while not self._stop and self._lock_present():
            await self._wait_until(
                trio.current_time() + self._config.interval,
                lambda: self._stop or not self._lock_present(),
            )
            self._watch.ensure()

    # -- the loop --------------------------------------------------------------------------

    def _set_paused(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        self._metrics.paused.set(1 if paused else 0)
        if paused:
            logger.warning(
                "MIG apply lock %s exists: monitor paused, shared regions untouched",
                self._config.mig_lock_path,
            )
        else:
            logger.info("MIG apply lock %s removed: monitor resumed", self._config.mig_lock_path)

    async def serve(
        self, *, task_status: trio.TaskStatus[Monitor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until :meth:`request_stop` (returns) or cancellation; closes every handle.

        Calls ``task_status.started(self)`` after the first tick, or at once when the MIG
        lock holds the loop paused at start-up.

        Raises:
            RuntimeError: the monitor is already serving.
        """
        if self._serving:
            raise RuntimeError("this Monitor is already serving")
        self._serving = True
        _raise_fd_limit()
        prepare_lock_dir(self._config.mig_lock_path.parent)
        self._watch.ensure()
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started(self)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch.run)
                nursery.start_soon(self._lister.serve_removals)
                next_tick = trio.current_time()
                while not self._stopping():
                    if self._lock_present():
                        self._set_paused(True)
                        mark_started()
                        await self._wait_paused()
                        if self._stopping():
                            break
                        self._set_paused(False)
                        next_tick = trio.current_time()
                        continue
                    with trio.CancelScope() as running:
                        self._running = running
                        while True:
                            await self._wait_until(next_tick, self._stopping)
                            if self._stopping() or self._lock_present():
                                break
                            self._watch.ensure()
                            await self._guarded_tick()
                            mark_started()
                            next_tick += self._config.interval
                            now = trio.current_time()
                            if next_tick <= now:  # overran: skip the missed ticks
                                next_tick = now + self._config.interval
                    self._running = None
                nursery.cancel_scope.cancel()
        finally:
            self._running = None
            self._watch.close()
            self._lister.close()
            self._serving = False


async def serve_monitor(
    config: MonitorConfig,
    *,
    pod_source: PodSource,
    registry: CollectorRegistry | None,
    task_status: trio.TaskStatus[Monitor] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Build a :class:`Monitor` and serve it (see the module docstring for the contract).

    Args:
        config: the monitor's configuration.
        pod_source: the live pods.
        registry: where the self-metrics go (None: a private registry).
        task_status: receives the :class:`Monitor` after its first tick (or at once when
            paused by the MIG lock at start-up).
    """
    monitor = Monitor(config, pod_source=pod_source, registry=registry)
    await monitor.serve(task_status=task_status)
