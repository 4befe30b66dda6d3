"""Host GPU metrics from NVML, behind a small interface, released during MIG changes.

How this works: :class:`HostGpuSampler` owns one NVML session, opened on first use and kept
between scrapes; :meth:`HostGpuSampler.sample` reads each device's memory in use, GPU and
memory controller utilisation into frozen :class:`HostGpuSample` values, which
:func:`host_gpu_families` turns into upstream vGPUmonitor's families.  NVML calls block, so
it runs only in worker threads, serialised by a lock.  Without NVML, a driver or a GPU the
families are absent (one log line, quiet retries every ``retry_interval``); a failing device
is skipped for that scrape.  :meth:`HostGpuSampler.pause` shuts NVML down while the MIG lock
exists and :meth:`HostGpuSampler.resume` lets the next sample open it again; this module is
the only pauser (:func:`serve_nvml_release`, and a sample that finds the lock gone), the
collector only reads.  The binding is injected (:class:`NvmlLibrary`: ``pynvml`` in
production, a fake in tests).  docs/metrics.md (Host GPU metrics).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import trio
from prometheus_client.core import GaugeMetricFamily, Metric

from hami_trio.logs import RateLimiter

__all__ = [
    "HostGpuSample",
    "HostGpuSampler",
    "NvmlLibrary",
    "host_gpu_families",
    "serve_nvml_release",
]

_log = logging.getLogger(__name__)
_RESUMED = "MIG apply lock gone: host GPU metrics resumed"


class NvmlLibrary(Protocol):
    """The part of nvidia-ml-py's ``pynvml`` module the sampler uses.

    Every call may raise ``pynvml.NVMLError`` (or a subclass).  Strings may come back as
    ``bytes`` from older bindings.
    """

    NVMLError: type[Exception]
    NVML_ERROR_NOT_SUPPORTED: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...


@dataclass(frozen=True, slots=True)
class HostGpuSample:
    """One device as NVML reported it in one sample.

    ``memory_used`` is None when the device does not report memory (NOT_SUPPORTED).
    """

    index: int
    uuid: str
    device_type: str
    memory_used: int | None
    utilization: int
    memory_utilization: int


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _default_nvml() -> NvmlLibrary:
    import pynvml  # nvidia-ml-py; importing works without the driver, nvmlInit does not

    return pynvml  # type: ignore[no-any-return]


class HostGpuSampler:
    """A thread-safe NVML session that samples every GPU of the host.

    Args:
        nvml: the NVML binding (default: ``pynvml``, imported lazily).
        retry_interval: after a failed ``nvmlInit``, wait this long before trying again.
        clock: monotonic clock for ``retry_interval`` (tests inject one).
    """

    def __init__(
        self,
        nvml: NvmlLibrary | None = None,
        *,
        retry_interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._retry_interval = retry_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._initialized = False
        self._paused = False
        self._paused_until: Callable[[], bool] | None = None
        self._next_init_attempt: float | None = None
        self._init_failure_logged = False
        self._device_errors = RateLimiter(300.0, max_keys=64, clock=clock)

    @property
    def initialized(self) -> bool:
        """Whether an NVML session is open now."""
        return self._initialized

    @property
    def paused(self) -> bool:
        """Whether sampling is paused (MIG lock held)."""
        return self._paused

    def _library(self) -> NvmlLibrary:
        if self._nvml is None:
            self._nvml = _default_nvml()
        return self._nvml

    def _ensure_initialized(self, nvml: NvmlLibrary) -> bool:
        if self._initialized:
            return True
        now = self._clock()
        if self._next_init_attempt is not None and now < self._next_init_attempt:
            return False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self._next_init_attempt = now + self._retry_interval
            if not self._init_failure_logged:
                self._init_failure_logged = True
                _log.warning(
                    "NVML unavailable (%s): host GPU metrics are disabled; retrying every %.0fs",
                    exc,
                    self._retry_interval,
                )
            return False
        if self._init_failure_logged:
            _log.info("NVML is available now: host GPU metrics enabled")
            self._init_failure_logged = False
        self._initialized = True
        self._next_init_attempt = None
        return True

    def _shutdown(self, nvml: NvmlLibrary) -> None:
        if not self._initialized:
            return
        self._initialized = False
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            _log.warning("nvmlShutdown failed: %s", exc)

    def sample(self) -> tuple[HostGpuSample, ...] | None:
        """Read every device (blocking: call from a worker thread).

        Returns:
            One sample per device that answered, in index order; None when NVML is not
            available or sampling is paused.
        """
        with self._lock:
            if self._paused:
                until = self._paused_until
                if until is None or until():
                    return None
                self._resume()
                _log.info(_RESUMED)
            nvml = self._library()
            if not self._ensure_initialized(nvml):
                return None
            try:
                count = nvml.nvmlDeviceGetCount()
            except nvml.NVMLError as exc:
                # The session went bad (driver reloaded, ...): start a new one next time.
                self._device_errors.log(
                    _log, logging.WARNING, "count", "nvmlDeviceGetCount: %s", exc
                )
                self._shutdown(nvml)
                return None
            samples = []
            for index in range(count):
                try:
                    samples.append(self._sample_device(nvml, index))
                except nvml.NVMLError as exc:
                    self._device_errors.log(
                        _log,
                        logging.WARNING,
                        index,
                        "NVML query of GPU %d failed, skipping it: %s",
                        index,
                        exc,
                    )
            return tuple(samples)

    def _sample_device(self, nvml: NvmlLibrary, index: int) -> HostGpuSample:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory_used: int | None
        try:
            memory_used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            memory_used = None  # unified memory (e.g. Grace Hopper): no framebuffer figure
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        return HostGpuSample(
            index=index,
            uuid=uuid,
            device_type=f"NVIDIA-{name}",
            memory_used=memory_used,
            utilization=int(rates.gpu),
            memory_utilization=int(rates.memory),
        )

    def pause(self, until: Callable[[], bool] | None = None) -> None:
        """Shut NVML down and keep it down until :meth:`resume` (MIG lock held).

        With ``until`` (whether the MIG lock still holds), a sample that finds it False
        resumes by itself, so host metrics return with the first scrape after the lock is
        gone rather than at the next look of :func:`serve_nvml_release`.  Blocks until a
        sample in progress finishes: call it from a worker thread.
        """
        with self._lock:
            self._paused = True
            self._paused_until = until
            if self._nvml is not None:
                self._shutdown(self._nvml)

    def resume(self) -> bool:
        """Allow sampling again; the next sample opens a new NVML session.

        Returns:
            Whether sampling was paused (False: a sample had resumed it already).
        """
        with self._lock:
            was_paused = self._paused
            self._resume()
            return was_paused

    def _resume(self) -> None:
        self._paused = False
        self._paused_until = None
        self._next_init_attempt = None

    def close(self) -> None:
        """Shut NVML down (at exit); a later sample would open it again."""
        with self._lock:
            if self._nvml is not None:
                self._shutdown(self._nvml)


async def serve_nvml_release(
    sampler: HostGpuSampler,
    mig_locked: Callable[[], bool],
    *,
    poll_interval: float = 0.5,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Release NVML within ``poll_interval`` of the MIG lock appearing; allow it again after.

    Runs until cancelled, then closes the NVML session.  ``mig_locked`` is typically
    ``lambda: monitor.paused``.  Blocking NVML calls run in a worker thread.

    Args:
        sampler: the host GPU sampler to pause and resume.
        mig_locked: whether the MIG apply lock holds the monitor now.
        poll_interval: seconds between two looks at ``mig_locked``.
        task_status: trio's start protocol (started at once).
    """
    task_status.started()
    try:
        while True:
            locked = mig_locked()
            if locked and not sampler.paused:
                await trio.to_thread.run_sync(partial(sampler.pause, until=mig_locked))
                _log.info("MIG apply lock held: NVML released, host GPU metrics paused")
            elif not locked and sampler.paused and await trio.to_thread.run_sync(sampler.resume):
                _log.info(_RESUMED)
            await trio.sleep(poll_interval)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(sampler.close)


def host_gpu_families(
    samples: Sequence[HostGpuSample] | None,
    node: str,
    *,
    legacy: bool = False,
    const_labels: Iterable[tuple[str, str]] = (),
) -> list[Metric]:
    """The host GPU families of upstream's vGPUmonitor for ``samples``.

    ``hami_host_gpu_memory_used_bytes`` and ``hami_host_gpu_utilization_ratio`` carry ``node,
    device_index, device_uuid, device_type``; ``hami_host_gpu_memory_controller_utilization_ratio``
    has no ``node`` label (as upstream).  With ``legacy``, ``HostGPUMemoryUsage`` and
    ``HostCoreUtilization`` with ``nodeid, deviceidx, deviceuuid, devicetype`` are added.
    ``const_labels`` (e.g. ``zone="vGPU"``) are appended to every sample.

    Returns:
        The families (empty when ``samples`` is None: NVML unavailable or paused).
    """
    if samples is None:
        return []
    extra = tuple(const_labels)
    names = tuple(name for name, _ in extra)
    values = tuple(value for _, value in extra)
    host = ("node", "device_index", "device_uuid", "device_type")
    memory = GaugeMetricFamily(
        "hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes", labels=host + names
    )
    util = GaugeMetricFamily(
        "hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)", labels=host + names
    )
    mem_util = GaugeMetricFamily(
        "hami_host_gpu_memory_controller_utilization_ratio",
        "GPU memory controller utilization ratio (0-100)",
        labels=host[1:] + names,
    )
    families: list[Metric] = [memory, util, mem_util]
    legacy_labels = ("nodeid", "deviceidx", "deviceuuid", "devicetype", *names)
    legacy_memory = GaugeMetricFamily(
        "HostGPUMemoryUsage", "GPU device memory usage", labels=legacy_labels
    )
    legacy_util = GaugeMetricFamily(
        "HostCoreUtilization", "GPU core utilization", labels=legacy_labels
    )
    if legacy:
        families += [legacy_memory, legacy_util]
    for sample in samples:
        ids = (str(sample.index), sample.uuid, sample.device_type)
        if sample.memory_used is not None:
            memory.add_metric((node, *ids, *values), sample.memory_used)
            legacy_memory.add_metric((node, *ids, *values), sample.memory_used)
        util.add_metric((node, *ids, *values), sample.utilization)
        legacy_util.add_metric((node, *ids, *values), sample.utilization)
        mem_util.add_metric((*ids, *values), sample.memory_utilization)
    return families
