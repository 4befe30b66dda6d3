"""One simulated HAMi-core workload: a separate process that behaves like a CUDA process.

How this works: run as ``python -m hami_trio.demo.workload PLAN_JSON`` with the environment
HAMi's device plugin gives a container, the process stays on the host side as a supervisor
that enters a sandbox (:func:`~hami_trio.demo.sandbox.enter_container`), forks and forwards
``SIGTERM``.  The child, PID 1 of its namespace, does what HAMi-core does in ``cuInit`` (the
real :func:`~hami_trio.broker.client.query_host_pid`, then its ``.cache`` file, magic last),
reports ``attached``, waits for the demo's ``go`` and then launches "kernels" every step
unless the monitor blocks it (the pure :class:`Tracker` decides), until end of input or
``SIGTERM``; it reports ``final`` and exits 0.  Reports are JSON lines
(:data:`REPORT_TYPES`).  docs/demo.md (How it maps to production, Sandboxes).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from hami_trio.broker.client import DEFAULT_CLIENT_SOCKET_PATH, NoAnswer, query_host_pid
from hami_trio.demo.sandbox import (
    SandboxSpec,
    drop_privileges,
    enter_container,
    mount_proc,
    set_parent_death_signal,
)
from hami_trio.demo.scenario import Behaviour, busy_at, memory_at, parse_memory_size
from hami_trio.errors import ConfigError
from hami_trio.goparse import broker_switch_from_env
from hami_trio.testing.regions import (
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)

__all__ = [
    "REPORT_TYPES",
    "HamiCoreSettings",
    "Tracker",
    "WorkloadPlan",
    "main",
]

#: The ``type`` of each JSON line a workload writes, in the order they come.
REPORT_TYPES: Final = ("attached", "status", "final", "error")

#: A gap between two launches longer than this many steps starts a new launch window.
_WINDOW_GAP_STEPS: Final = 4
#: How long a workload waits for the demo's ``go`` line.
_GO_TIMEOUT: Final = 60.0

State = Literal["running", "blocked", "idle"]


@dataclass(frozen=True, slots=True)
class HamiCoreSettings:
    """What HAMi-core reads from the container's environment."""

    priority: int
    memory_limit: int
    sm_limit: int
    gpu: str
    cache_file: Path
    broker_enabled: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HamiCoreSettings:
        """Parse the device plugin's variables (``CUDA_TASK_PRIORITY`` defaults to 1).

        Raises:
            ConfigError: a variable is missing or invalid (named in the message).
        """

        def need(name: str) -> str:
            value = env.get(name, "")
            if not value:
                raise ConfigError(f"{name} is not set")
            return value

        def integer(name: str, text: str) -> int:
            try:
                return int(text)
            except ValueError:
                raise ConfigError(f"{name}: {text!r} is not an integer") from None

        return cls(
            priority=integer("CUDA_TASK_PRIORITY", env.get("CUDA_TASK_PRIORITY", "1")),
            memory_limit=parse_memory_size(need("CUDA_DEVICE_MEMORY_LIMIT")),
            sm_limit=integer("CUDA_DEVICE_SM_LIMIT", env.get("CUDA_DEVICE_SM_LIMIT", "0")),
            gpu=need("NVIDIA_VISIBLE_DEVICES"),
            cache_file=Path(need("CUDA_DEVICE_MEMORY_SHARED_CACHE")),
            broker_enabled=broker_switch_from_env(env),
        )


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    """What the demo tells a workload besides HAMi-core's environment (argv JSON).

    Attributes:
        name: the container name (for messages).
        behaviour: busy windows, SM utilisation, memory plan.
        duration: seconds of the run (fractions in ``behaviour`` refer to it).
        step: seconds between two launch attempts.
        status_period: seconds between two ``status`` reports (also sent on a change).
        broker_dir: the broker's directory on the host.
        container_dir: this container's directory on the host.
        user_namespace: sandbox in a user namespace (the demo does not run as root).
        run_as: drop to this UID/GID inside the sandbox (None: keep the sandbox's root).
        socket_path: the broker socket as the workload sees it.
        exits_at: the fraction of the run at which the process ends abruptly, its slot left
            as it is (HAMi-core's exit clean-up does not run after a SIGKILL); None: never.
    """

    name: str
    behaviour: Behaviour
    duration: float
    step: float
    status_period: float
    broker_dir: str
    container_dir: str
    user_namespace: bool = False
    run_as: int | None = None
    socket_path: str = str(DEFAULT_CLIENT_SOCKET_PATH)
    exits_at: float | None = None

    def to_json(self) -> str:
        """The argv form (inverse of :meth:`from_json`)."""
        data = asdict(self)
        data["behaviour"] = self.behaviour.to_json()
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> WorkloadPlan:
        """Parse the argv form.

        Raises:
            ConfigError: not valid JSON or a field is missing or wrong.
        """
        try:
            data = json.loads(text)
            data["behaviour"] = Behaviour.from_json(data["behaviour"])
            return cls(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"workload plan: {exc}") from exc


@dataclass
class Tracker:
    """The workload's decisions and history (pure: the caller gives every time and word).

    Attributes:
        step: seconds between attempts (to tell launch windows apart).
        launches: kernels launched.
        blocked_seconds: time spent wanting to launch while ``recent_kernel < 0``.
        episodes: ``[start, end]`` of each blocked stretch (``end`` None while open).
        windows: ``[first, last]`` launch time of each stretch of launches.
    """

    step: float
    launches: int = 0
    blocked_seconds: float = 0.0
    episodes: list[list[float | None]] = field(default_factory=list)
    windows: list[list[float]] = field(default_factory=list)
    _blocked_since: float | None = None

    def decide(self, now: float, busy: bool, recent_kernel: int) -> State:
        """One step: ``running`` (launch now), ``blocked`` or ``idle``.

        Args:
            now: monotonic seconds.
            busy: whether the workload wants to launch now.
            recent_kernel: the word as read from the shared region just now.
        """
        if busy and recent_kernel < 0:
            if self._blocked_since is None:
                self._blocked_since = now
                self.episodes.append([now, None])
            return "blocked"
        self._close(now)
        if not busy:
            return "idle"
        self.launches += 1
        if self.windows and now - self.windows[-1][1] <= _WINDOW_GAP_STEPS * self.step:
            self.windows[-1][1] = now
        else:
            self.windows.append([now, now])
        return "running"

    def _close(self, now: float) -> None:
        if self._blocked_since is not None:
            self.blocked_seconds += now - self._blocked_since
            self.episodes[-1][1] = now
            self._blocked_since = None

    @property
    def blocked_since(self) -> float | None:
        """Start of the open blocked episode, if any."""
        return self._blocked_since

    def blocked_for(self, now: float) -> float:
        """Blocked time so far, the open episode included."""
        open_part = 0.0 if self._blocked_since is None else now - self._blocked_since
        return self.blocked_seconds + open_part

    def finish(self, now: float) -> None:
        """Close an open episode at the end of the run."""
        self._close(now)


class _Stop:
    """Set by SIGTERM or the end of standard input."""

    def __init__(self) -> None:
        self.requested = False

    def handler(self, signum: int, frame: object) -> None:
        self.requested = True


class _Input:
    """Lines from standard input without blocking past a deadline."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._buffer = b""
        self.closed = False

    def wait(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` for a line; None on timeout or end of input."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                ready, _, _ = select.select([self._fd], [], [], left)
            except InterruptedError:  # a signal: let the caller look at its flag
                return None
            if not ready:
                return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                self.closed = True
            self._buffer += chunk
        if b"\n" not in self._buffer:
            return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace")


def _report(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"type": kind, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _ask_broker(plan: WorkloadPlan, settings: HamiCoreSettings) -> dict[str, Any]:
    started = time.monotonic()
    answer = query_host_pid(plan.socket_path, enabled=settings.broker_enabled)
    elapsed = time.monotonic() - started
    if isinstance(answer, NoAnswer):
        return {
            "host_pid": None,
            "reason": answer.reason.value,
            "detail": answer.detail,
            "broker_seconds": elapsed,
        }
    return {"host_pid": answer, "reason": None, "detail": None, "broker_seconds": elapsed}


def _slot(pid: int, host_pid: int, memory: tuple[int, int, int], sm_util: int) -> ProcSlot:
    context, module, data = memory
    use = MemoryUse(context, module, data, 0, context + module + data)
    return ProcSlot(
        pid=pid, hostpid=host_pid, status=1, used=(use,), util=(UtilUse(sm_util=sm_util),)
    )


def _run(plan: WorkloadPlan, settings: HamiCoreSettings, stop: _Stop) -> int:
    """cuInit, then the run; returns the exit status."""
    broker = _ask_broker(plan, settings)
    pid = os.getpid()
    host_pid = broker["host_pid"] or 0  # HAMi-core leaves 0 until it found the PID another way
    behaviour = plan.behaviour
    write_region(
        settings.cache_file,
        RegionSpec(
            owner_pid=pid,
            num=1,
            uuids=(settings.gpu,),
            limits=(settings.memory_limit,),
            sm_limits=(settings.sm_limit,),
            priority=settings.priority,
        ),
        magic_last=True,
    )
    region = SimulatedWorkload(settings.cache_file)
    memory = memory_at(behaviour.memory, 0.0, busy=False)
    region.set_slot(0, _slot(pid, host_pid, memory, 0))
    region.set_proc_num(1)
    _report(
        "attached",
        name=plan.name,
        pid=pid,
        uid=os.getuid(),
        priority=settings.priority,
        cache_file=str(settings.cache_file),
        **broker,
    )

    stdin = _Input()
    go = None
    give_up = time.monotonic() + _GO_TIMEOUT
    while go is None and not (stop.requested or stdin.closed) and time.monotonic() < give_up:
        go = stdin.wait(0.1)
    tracker = Tracker(plan.step)
    if go is None and not (stop.requested or stdin.closed):
        _report("error", message=f"no 'go' line from the demo within {_GO_TIMEOUT:g}s")
        return 1
    # Stopped before the run began (the demo was interrupted): a normal, empty run.
    start = float(json.loads(go)["start"]) if go is not None else time.monotonic()
    last: tuple[State, tuple[int, int, int], int] | None = None
    last_report = 0.0
    state: State = "idle"
    next_step = max(start, time.monotonic())
    peak = 0
    crashed = False
    while not (stop.requested or stdin.closed):
        now = time.monotonic()
        fraction = (now - start) / plan.duration
        if plan.exits_at is not None and fraction >= plan.exits_at:
            crashed = True  # the slot stays as it is: nobody clears it
            break
        busy = busy_at(behaviour.busy, fraction) if now >= start else False
        recent, switch = region.read_control()
        state = tracker.decide(now, busy, recent)
        if state == "running":
            region.launch_kernel()
        memory = memory_at(behaviour.memory, fraction, busy and state != "idle")
        # HAMi-core attributes NVML's per-process SM utilisation by host PID: without one
        # it cannot, and the slot reads 0 (the "SM utilisation 0" report upstream).
        sm_util = behaviour.sm_util if state == "running" and host_pid else 0
        if last is None or (state, memory, sm_util) != last:
            region.set_slot(0, _slot(pid, host_pid, memory, sm_util))
        peak = max(peak, sum(memory))
        if last is None or state != last[0] or now - last_report >= plan.status_period:
            _report(
                "status",
                t=now,
                state=state,
                recent_kernel=recent,
                utilization_switch=switch,
                launches=tracker.launches,
                blocked_seconds=tracker.blocked_for(now),
                blocked_since=tracker.blocked_since,
                memory_used=sum(memory),
                sm_util=sm_util,
            )
            last_report = now
        last = (state, memory, sm_util)
        next_step += plan.step
        if next_step < time.monotonic():  # fell behind (a loaded machine): do not catch up
            next_step = time.monotonic() + plan.step
        stdin.wait(max(next_step - time.monotonic(), 0.0))
    now = time.monotonic()
    tracker.finish(now)
    _report(
        "final",
        t=now,
        launches=tracker.launches,
        blocked_seconds=tracker.blocked_seconds,
        episodes=tracker.episodes,
        windows=tracker.windows,
        peak_memory=peak,
        crashed=crashed,
    )
    return 0


def _container(plan: WorkloadPlan, settings: HamiCoreSettings) -> int:
    """PID 1 of the sandbox: finish the sandbox, then run."""
    set_parent_death_signal(signal.SIGKILL)  # the supervisor died: so do we
    mount_proc()
    if plan.run_as is not None:
        drop_privileges(plan.run_as, plan.run_as)
    stop = _Stop()
    # PID 1 of a namespace gets no signal it has no handler for.
    signal.signal(signal.SIGTERM, stop.handler)
    signal.signal(signal.SIGINT, stop.handler)
    return _run(plan, settings, stop)


def _supervise(child: int) -> int:
    """The host-side supervisor: forward SIGTERM/SIGINT, return the child's exit status."""

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


def _guarded(body: Callable[[], int]) -> int:
    try:
        return body()
    except (OSError, ConfigError, ValueError) as exc:
        _report("error", message=str(exc))
        return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m hami_trio.demo.workload PLAN_JSON``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hami_trio.demo.workload PLAN_JSON", file=sys.stderr)
        return 2
    try:
        plan = WorkloadPlan.from_json(args[0])
        settings = HamiCoreSettings.from_env(os.environ)
    except ConfigError as exc:
        _report("error", message=str(exc))
        return 2

    def sandboxed() -> int:
        try:
            enter_container(
                SandboxSpec(Path(plan.broker_dir), Path(plan.container_dir), plan.user_namespace)
            )
        except OSError as exc:
            how = "a user namespace" if plan.user_namespace else "namespaces"
            raise OSError(exc.errno, f"cannot build the sandbox with {how}: {exc}") from exc
        child = os.fork()
        if child == 0:
            os._exit(_guarded(lambda: _container(plan, settings)))
        return _supervise(child)

    return _guarded(sandboxed)


if __name__ == "__main__":
    sys.exit(main())
