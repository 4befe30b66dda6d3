"""A fake NVML binding with pynvml's interface and pynvml's real error classes.

It models the parts of NVML the host GPU sampler uses, including the rules a real driver
enforces: every device call needs an initialised library (else ``NVML_ERROR_UNINITIALIZED``)
and handles from an earlier session are invalid after ``nvmlShutdown``.  It records which
threads called it, so tests can check that NVML is never called on the trio thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NVMLError = pynvml.NVMLError
NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass
class FakeGpu:
    """One device and what NVML reports for it; ``*_error`` fields are NVML error codes."""

    name: str = "A100-SXM4-80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_used: int = 1 << 30
    gpu_util: int = 37
    memory_util: int = 12
    memory_error: int | None = None
    utilization_error: int | None = None


@dataclass
class FakeNvml:
    """Drop-in for the ``pynvml`` module (see :class:`hami_trio.metrics.hostgpu.NvmlLibrary`)."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None
    init_calls: int = 0
    shutdown_calls: int = 0
    threads: set[int] = field(default_factory=set)
    _session: int = 0
    _initialized: bool = False

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED

    @property
    def initialized(self) -> bool:
        return self._initialized

    def lose_session(self) -> None:
        """The driver went away under the caller: every call fails until the next init."""
        self._initialized = False

    def _enter(self) -> None:
        self.threads.add(threading.get_ident())
        if not self._initialized:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        self.threads.add(threading.get_ident())
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._initialized = True
        self._session += 1

    def nvmlShutdown(self) -> None:
        self._enter()
        self.shutdown_calls += 1
        self._initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[int, int]:
        self._enter()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return (self._session, index)

    def _gpu(self, handle: tuple[int, int]) -> FakeGpu:
        self._enter()
        session, index = handle
        if session != self._session:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # a stale handle
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: tuple[int, int]) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: tuple[int, int]) -> bytes:
        return self._gpu(handle).name.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[int, int]) -> SimpleNamespace:
        gpu = self._gpu(handle)
        if gpu.memory_error is not None:
            raise NVMLError(gpu.memory_error)
        return SimpleNamespace(
            total=80 << 30, used=gpu.memory_used, free=(80 << 30) - gpu.memory_used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: tuple[int, int]) -> SimpleNamespace:
        gpu = self._gpu(handle)
        if gpu.utilization_error is not None:
            raise NVMLError(gpu.utilization_error)
        return SimpleNamespace(gpu=gpu.gpu_util, memory=gpu.memory_util)
