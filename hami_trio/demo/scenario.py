"""The demo's scenario: which workloads run, what they do when, and where everything lives.

How this works: pure data and functions, no I/O.  A run is described in fractions of its
``duration``, so the same story plays in 6 seconds (CI) and in 30 (the README): the
high-priority ``inference`` bursts (:data:`INFERENCE_BURSTS`) on :data:`GPU_A` and blocks
``training`` there, ``notebook`` works alone on :data:`GPU_B`, further workloads alternate
between the two, and the MIG lock holds the monitor during :data:`MIG_WINDOW`.
:class:`DemoPaths` is the layout of the demo's private root; a workload gets HAMi-core's
settings as the device plugin's environment (:func:`hami_core_env`) and its
:class:`Behaviour` as JSON.  The timeline table: docs/demo.md (The scenario).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from hami_trio.errors import ConfigError
from hami_trio.goparse import BROKER_SWITCH_ENV

__all__ = [
    "CRASH_AT",
    "GPU_A",
    "GPU_B",
    "GPU_C",
    "INFERENCE_BURSTS",
    "MAX_WORKLOADS",
    "MIG_WINDOW",
    "Behaviour",
    "DemoPaths",
    "MemoryPlan",
    "WorkloadSpec",
    "busy_at",
    "check_timing",
    "default_workloads",
    "hami_core_env",
    "memory_at",
    "parse_memory_size",
]

MIB: Final = 1 << 20
GIB: Final = 1 << 30

#: Fake NVML UUIDs of the two simulated GPUs.
GPU_A: Final = "GPU-8f1c6a2e-5d3b-4c7a-9e21-0a1b2c3d4e5f"
GPU_B: Final = "GPU-3b7d9e04-1f2a-4b6c-8d5e-6f7a8b9c0d1e"
#: The third GPU: the workloads that show what the agent explains (no blocking there).
GPU_C: Final = "GPU-c41e07d2-9a3f-4e8b-b6d1-2f3e4a5b6c7d"
#: When the ``crashed`` workload's process dies, leaving its slot (a fraction of the run).
CRASH_AT: Final = 0.30

#: When the high-priority workload launches kernels (fractions of the run).
INFERENCE_BURSTS: Final = ((0.10, 0.30), (0.65, 0.85))
#: When the MIG apply lock exists (fractions of the run).
MIG_WINDOW: Final = (0.40, 0.60)
#: The most workloads one demo starts (each is a Python process).
MAX_WORKLOADS: Final = 16
#: The shortest phase of the scenario, as a fraction of the run (a burst is 20 %).
_SHORTEST_PHASE: Final = 0.20
#: Monitor ticks the shortest phase must hold for blocking to be visible.
_TICKS_PER_PHASE: Final = 3

Windows = tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Device memory of one workload over the run (bytes).

    ``data`` grows linearly from ``data_start`` to ``data_end`` over the run; while the
    workload launches kernels it holds ``burst`` more (activations, workspaces).
    """

    context: int
    module: int
    data_start: int
    data_end: int
    burst: int = 0


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What a simulated workload does (the part HAMi-core does not configure).

    Attributes:
        busy: fractions of the run during which it launches kernels.
        sm_util: SM utilisation (percent) it reports while launching.
        memory: its device memory over time.
    """

    busy: Windows
    sm_util: int
    memory: MemoryPlan

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (inverse of :meth:`from_json`)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Behaviour:
        """Rebuild from :meth:`to_json` output.

        Raises:
            ConfigError: a field is missing or has the wrong type.
        """
        try:
            busy = tuple((float(start), float(end)) for start, end in data["busy"])
            return cls(busy, int(data["sm_util"]), MemoryPlan(**data["memory"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"workload behaviour: invalid JSON {json.dumps(data)}") from exc


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One simulated workload: a container of a fake pod.

    Attributes:
        name: the container name (``[a-z0-9-]``).
        role: what it stands for, shown in the banner.
        priority: ``CUDA_TASK_PRIORITY`` (lower number = higher priority).
        gpu: the fake GPU UUID it runs on.
        memory_limit: its vGPU memory limit in bytes (``CUDA_DEVICE_MEMORY_LIMIT``).
        sm_limit: its core limit in percent (``CUDA_DEVICE_SM_LIMIT``).
        behaviour: what it does over the run.
        broker: its pod has the broker switch (``LIBVGPU_HOSTPID_BROKER=1``); without it
            HAMi-core never learns its host PID here (the slot's ``hostpid`` stays 0).
        exits_at: the fraction of the run at which its process dies without HAMi-core's exit
            clean-up (as after a SIGKILL), leaving its slot behind; None: it runs to the end.
    """

    name: str
    role: str
    priority: int
    gpu: str
    memory_limit: int
    sm_limit: int
    behaviour: Behaviour
    broker: bool = True
    exits_at: float | None = None


def default_workloads(count: int) -> tuple[WorkloadSpec, ...]:
    """The scenario's workloads (see the module docstring).

    Raises:
        ConfigError: ``count`` is below 2 (the story needs a high- and a low-priority
            workload on one GPU) or above :data:`MAX_WORKLOADS`.
    """
    if not 2 <= count <= MAX_WORKLOADS:
        raise ConfigError(
            f"--workloads: {count} is out of range: the demo needs 2..{MAX_WORKLOADS} "
            "(at least one high- and one low-priority workload sharing a GPU)"
        )
    specs = [
        WorkloadSpec(
            "inference",
            "online inference, high priority, bursts of requests",
            0,
            GPU_A,
            8 * GIB,
            60,
            Behaviour(
                INFERENCE_BURSTS,
                92,
                MemoryPlan(300 * MIB, 500 * MIB, 3 * GIB, 3 * GIB, burst=GIB),
            ),
        ),
        WorkloadSpec(
            "training",
            "batch training, low priority, always busy",
            1,
            GPU_A,
            12 * GIB,
            100,
            Behaviour(((0.0, 1.0),), 71, MemoryPlan(300 * MIB, 200 * MIB, 2 * GIB, 8 * GIB)),
        ),
        WorkloadSpec(
            "notebook",
            "interactive notebook, low priority, alone on its GPU",
            1,
            GPU_B,
            4 * GIB,
            30,
            Behaviour(
                ((0.05, 0.20), (0.45, 0.55), (0.75, 0.95)),
                24,
                MemoryPlan(300 * MIB, 100 * MIB, 512 * MIB, GIB, burst=256 * MIB),
            ),
        ),
        WorkloadSpec(
            "no-broker",
            "an old pod without the broker switch: its host PID stays unknown",
            1,
            GPU_C,
            4 * GIB,
            50,
            Behaviour(((0.05, 0.95),), 35, MemoryPlan(300 * MIB, 100 * MIB, GIB, 2 * GIB)),
            broker=False,
        ),
        WorkloadSpec(
            "crashed",
            "a job whose process is killed at 30 %, leaving its slot (usage stuck at peak)",
            1,
            GPU_C,
            4 * GIB,
            50,
            Behaviour(((0.05, CRASH_AT),), 20, MemoryPlan(300 * MIB, 100 * MIB, GIB, 6 * GIB)),
            exits_at=CRASH_AT,
        ),
    ]
    for index in range(5, count):
        # Workers alternate GPUs at the low priority: on GPU-A they are blocked with
        # training, on GPU-B they share with the notebook (utilization_switch = 1).  They
        # start before the first burst and stop in the MIG window, long after that burst,
        # so that each block is followed by launches again.
        specs.append(
            WorkloadSpec(
                f"worker-{index - 4}",
                "batch worker, low priority",
                1,
                GPU_A if index % 2 else GPU_B,
                2 * GIB,
                50,
                Behaviour(
                    ((0.02 * (index % 5), 0.58),),
                    40,
                    MemoryPlan(300 * MIB, 100 * MIB, 256 * MIB, GIB),
                ),
            )
        )
    return tuple(specs[:count])


def check_timing(duration: float, interval: float) -> None:
    """Refuse a run too short for its monitor interval to show anything.

    Raises:
        ConfigError: a value is not positive, or a burst (20 % of the run) would hold fewer
            than three monitor ticks.
    """
    if not duration > 0:
        raise ConfigError(f"--duration: must be > 0 seconds, got {duration}")
    if not interval > 0:
        raise ConfigError(f"--interval: must be > 0 seconds, got {interval}")
    shortest = _TICKS_PER_PHASE * interval / _SHORTEST_PHASE
    if duration < shortest - 1e-9:
        raise ConfigError(
            f"--duration {duration:g} is too short for --interval {interval:g}: each phase of "
            f"the demo (20 % of the run) needs {_TICKS_PER_PHASE} monitor ticks; use "
            f"--duration {shortest:g} or more, or a shorter --interval"
        )


def busy_at(windows: Windows, fraction: float) -> bool:
    """Whether a workload with these busy windows launches kernels at ``fraction`` of the run.

    Windows are half-open ``[start, end)``; the run ends at 1.0 (nothing is busy after it).
    """
    return fraction < 1.0 and any(start <= fraction < end for start, end in windows)


def memory_at(plan: MemoryPlan, fraction: float, busy: bool) -> tuple[int, int, int]:
    """``(context, module, data)`` bytes at ``fraction`` of the run (clamped to 0..1)."""
    progress = min(max(fraction, 0.0), 1.0)
    data = plan.data_start + int((plan.data_end - plan.data_start) * progress)
    return plan.context, plan.module, data + (plan.burst if busy else 0)


_SIZE = re.compile(r"(\d+)([kmg]?)", re.IGNORECASE)
_UNITS: Final = {"": 1, "k": 1 << 10, "m": MIB, "g": GIB}


def parse_memory_size(text: str, *, name: str = "CUDA_DEVICE_MEMORY_LIMIT") -> int:
    """Parse HAMi-core's memory size spelling: digits with an optional ``k``, ``m`` or ``g``.

    Raises:
        ConfigError: anything else (named after ``name``).
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{name}: {text!r} is not a size like 1g, 1024m, 1048576k or 1073741824")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def hami_core_env(spec: WorkloadSpec, cache_file: str | Path) -> dict[str, str]:
    """The HAMi-core environment of a workload, as HAMi's device plugin sets it.

    Args:
        spec: the workload.
        cache_file: ``CUDA_DEVICE_MEMORY_SHARED_CACHE`` as the workload sees it.
    """
    return {
        "NVIDIA_VISIBLE_DEVICES": spec.gpu,
        "CUDA_DEVICE_MEMORY_LIMIT": f"{spec.memory_limit // MIB}m",
        "CUDA_DEVICE_SM_LIMIT": str(spec.sm_limit),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache_file),
        "CUDA_TASK_PRIORITY": str(spec.priority),
        **({BROKER_SWITCH_ENV: "1"} if spec.broker else {}),
    }


@dataclass(frozen=True, slots=True)
class DemoPaths:
    """Where the demo's agent and workloads keep their files, under one private root."""

    root: Path

    @property
    def hook_path(self) -> Path:
        """``HOOK_PATH`` of the agent."""
        return self.root / "hook"

    @property
    def containers(self) -> Path:
        """``$HOOK_PATH/containers``: one directory per container."""
        return self.hook_path / "containers"

    @property
    def broker_dir(self) -> Path:
        """The broker's directory (the host's ``/var/run/hami/hostpid``)."""
        return self.root / "hostpid"

    @property
    def socket_path(self) -> Path:
        """The broker socket."""
        return self.broker_dir / "broker.sock"

    @property
    def mig_lock(self) -> Path:
        """The MIG apply lock (the host's ``/tmp/hami/hami-mig-apply.lock``)."""
        return self.root / "hami" / "hami-mig-apply.lock"

    @property
    def logs(self) -> Path:
        """The agent's and the workloads' logs."""
        return self.root / "logs"

    def container_dir(self, pod_uid: str, name: str) -> Path:
        """``$HOOK_PATH/containers/{pod_uid}_{name}``."""
        return self.containers / f"{pod_uid}_{name}"


def new_pod_uid() -> str:
    """A fresh fake pod UID (Kubernetes UIDs are UUIDs)."""
    return str(uuid.uuid4())
