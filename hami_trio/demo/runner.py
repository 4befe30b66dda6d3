"""The demo's orchestration: the agent, the workloads, the timeline, the shutdown.

How this works, in one trio nursery tree (every child process is waited for): a private root
holds the hook path with one directory per container, the broker's directory, the MIG lock
and the logs; the agent runs through the injected ``serve_agent`` outside the run's cancel
scope (so it is always stopped last, with its drain); each workload runs as ``python -m
hami_trio.demo.workload`` in its own session and sandbox; once all attached, the demo checks
their host PIDs in ``/proc`` and sends one start time.  While the run lasts it scrapes
``/metrics``, redraws the view and holds the MIG lock from 40 % to 60 %; at the end or the
first signal it scrapes once more, closes the workloads' input, stops the agent, checks that
nothing is left and summarises (:func:`~hami_trio.demo.report.summarize`).  docs/demo.md.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol, TextIO

import trio

from hami_trio._trio import StartRecorder, serve_under_signals, signal_name, sole_error
from hami_trio.agent.status import fetch_state, format_status
from hami_trio.demo.report import RunRecord, WorkloadRecord, render_summary, summarize
from hami_trio.demo.sandbox import NOBODY, SANDBOX_CACHE_DIR
from hami_trio.demo.scenario import (
    MIG_WINDOW,
    DemoPaths,
    check_timing,
    default_workloads,
    hami_core_env,
    new_pod_uid,
)
from hami_trio.demo.scrape import SCRAPE_TIMEOUT, scrape
from hami_trio.demo.view import Screen
from hami_trio.demo.workload import WorkloadPlan
from hami_trio.errors import ConfigError, DemoError, HamiTrioError
from hami_trio.goparse import BindAddress

__all__ = [
    "AgentServer",
    "AgentSettings",
    "DemoOptions",
    "RunningAgent",
    "run_demo",
]

logger = logging.getLogger(__name__)

#: Seconds every workload gets to ask the broker and attach its region.
ATTACH_TIMEOUT: Final = 30.0
#: Seconds workloads get to report and exit after their input is closed.
STOP_TIMEOUT: Final = 5.0
#: How far ahead of "now" the common start time is set (every workload must read it first).
_GO_LEAD: Final = 0.3


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """The ``hami-trio demo`` flags.

    Raises:
        ConfigError: a value is out of range (named after its flag).
    """

    workloads: int = 5
    duration: float = 30.0
    interval: float = 1.0
    root: Path | None = None
    metrics_bind: BindAddress = field(default_factory=lambda: BindAddress("127.0.0.1", 0))
    summary_json: Path | None = None

    def __post_init__(self) -> None:
        default_workloads(self.workloads)
        check_timing(self.duration, self.interval)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """What the demo asks of the agent."""

    paths: DemoPaths
    interval: float
    metrics_bind: BindAddress
    log_file: Path
    #: The debug view (``hami-trio status``); a free loopback port, never the default 9395
    #: (a real agent on this machine may hold it).
    debug_bind: BindAddress = field(default_factory=lambda: BindAddress("127.0.0.1", 0))


class RunningAgent(Protocol):
    """What the demo needs of a running agent."""

    @property
    def metrics_url(self) -> str:
        """``http://host:port/metrics``."""

    @property
    def command(self) -> str:
        """The equivalent ``hami-trio run`` command line (shown in the banner)."""

    @property
    def debug_address(self) -> BindAddress | None:
        """Where its debug view listens (``hami-trio status --address``); None: off."""

    @property
    def request_stop(self) -> Callable[[], None]:
        """Drain and stop the agent; the serving function returns once it is done."""


class AgentServer(Protocol):
    """Runs the agent: reports a :class:`RunningAgent` once it is ready, returns once it was
    asked to stop and has drained, raises :class:`~hami_trio.errors.HamiTrioError` when it
    cannot start or fails (:func:`hami_trio.demo.agent.serve_demo_agent`)."""

    def __call__(
        self, settings: AgentSettings, *, task_status: trio.TaskStatus[Any]
    ) -> Awaitable[None]: ...


#: How long the agent may take to drain after the run before the demo cancels it.
AGENT_STOP_TIMEOUT: Final = 15.0


def _prepare_root(root: Path | None) -> tuple[Path, bool]:
    """The demo's root and whether it is temporary (removed at the end)."""
    if root is None:
        return Path(tempfile.mkdtemp(prefix="hami-trio-demo-")), True
    root = root.absolute()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"--root: {root} exists and is not an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    return root, False


def check_output(path: Path | None) -> None:
    """Check before the run that ``--summary-json`` can be written at its end.

    Raises:
        ConfigError: its directory is missing or not writable, or it is a directory.
    """
    if path is None:
        return
    parent = path.absolute().parent
    if os.path.isdir(path):
        raise ConfigError(f"--summary-json: {path} is a directory")
    if not parent.is_dir():
        raise ConfigError(f"--summary-json: {parent} does not exist or is not a directory")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        what = "file" if target == path else "directory"
        raise ConfigError(f"--summary-json: cannot write the {what} {target}")


def _sandbox_words(as_root: bool) -> str:
    if as_root:
        return (
            "sandbox: own mount + PID namespaces, broker dir mounted read-only, "
            f"workloads run as uid {NOBODY}"
        )
    return (
        f"NOT ROOT: each workload gets a user namespace (uid {os.geteuid()} mapped to 0) for "
        "its mount + PID namespaces; the broker client's checks are unchanged"
    )


def _proc_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (tells a process from a later one with its PID)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie is dead: only its parent has not collected it yet
        return None
    return int(fields[19])


def _only_child(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def _event_for(
    w: WorkloadRecord, record: RunRecord, old: Mapping[str, Any] | None, new: Mapping[str, Any]
) -> str | None:
    """The story line for a workload's state change, if it is worth one."""
    name = w.spec.name
    before = None if old is None else old.get("state")
    after = new.get("state")
    if after == "blocked":
        higher = [
            o.spec.name
            for o in record.workloads
            if o.spec.gpu == w.spec.gpu and o.spec.priority < w.spec.priority
        ]
        why = f"{', '.join(higher)} outranks it on its GPU" if higher else "nobody outranks it!"
        return f"{name} blocked by the monitor: recent_kernel = -1 ({why})"
    if before == "blocked":
        since = None if old is None else old.get("blocked_since")
        held = ""
        if isinstance(since, float) and isinstance(new.get("t"), float):
            held = f" after {new['t'] - since:.1f}s"
        return f"{name} unblocked{held}: launching kernels again"
    if after == "running" and before in (None, "idle"):
        return f"{name} starts launching kernels (priority {w.spec.priority})"
    if after == "idle" and before == "running":
        return f"{name} goes idle"
    return None


def _handle_report(record: RunRecord, w: WorkloadRecord, report: Mapping[str, Any]) -> None:
    kind = report.get("type")
    now = time.monotonic()
    if kind == "attached":
        w.attached = dict(report)
        if report.get("host_pid"):
            record.event(
                now,
                f"{w.spec.name} attached: PID {report.get('pid')} in its sandbox, host PID "
                f"{report['host_pid']} from the broker in {report['broker_seconds'] * 1000:.2f} ms",
            )
        else:
            record.event(
                now,
                f"{w.spec.name} attached WITHOUT a host PID: {report.get('reason')} - "
                f"{report.get('detail')}",
            )
    elif kind == "status":
        old = w.status
        w.status = dict(report)
        if old is None or old.get("state") != report.get("state"):
            text = _event_for(w, record, old, report)
            if text is not None:
                record.event(now, text)
    elif kind == "final":
        w.final = dict(report)
        if report.get("crashed"):
            record.event(
                now,
                f"{w.spec.name}'s process died without HAMi-core's clean-up: its slot (and "
                "its memory) stays in the region",
            )
    elif kind == "error":
        w.error = str(report.get("message"))
        record.event(now, f"{w.spec.name} failed: {w.error}")


async def _read_reports(
    record: RunRecord, w: WorkloadRecord, proc: trio.Process, attached: trio.Event
) -> None:
    assert proc.stdout is not None
    pending = b""
    # Shielded: a cancelled run still wants each workload's final report, and the end of its
    # output is certain (``_stop_workloads`` kills what does not exit in time).
    with trio.CancelScope(shield=True):
        async for chunk in proc.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    report = json.loads(line)
                except ValueError:
                    record.event(time.monotonic(), f"{w.spec.name}: unreadable {line[:80]!r}")
                    continue
                if isinstance(report, dict):
                    _handle_report(record, w, report)
                    if report.get("type") in ("attached", "error"):
                        attached.set()
        w.exit_code = await proc.wait()
    if w.attached is None and w.error is None:
        w.error = f"exited with status {w.exit_code} before attaching"
    attached.set()


def _open_log(path: Path) -> int:
    """A workload's stderr: a file in the root's ``logs`` (a local, instant open)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


def _log_tail(path: Path, lines: int = 5) -> str:
    """The end of a log for an error message (the temporary root is removed afterwards)."""
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n  | {line}" for line in tail)


def _spawn_env(w: WorkloadRecord, cache_name: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    if "PYTHONPATH" in os.environ:  # a source checkout run without installing
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env |= hami_core_env(w.spec, SANDBOX_CACHE_DIR / cache_name)
    return env


async def _stop_workloads(procs: list[tuple[WorkloadRecord, trio.Process]]) -> None:
    """Close every workload's input, wait, kill what is left; always waits for all."""
    for _, proc in procs:
        if proc.stdin is not None:
            try:
                await proc.stdin.aclose()
            except trio.BrokenResourceError:
                pass
    with trio.move_on_after(STOP_TIMEOUT):
        for _, proc in procs:
            await proc.wait()
    for w, proc in procs:
        if proc.returncode is None:
            proc.kill()
        if w.host_pid is not None and _proc_start_time(w.host_pid) is not None:
            try:
                os.kill(w.host_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for _, proc in procs:
        await proc.wait()


@asynccontextmanager
async def _workloads(
    record: RunRecord, paths: DemoPaths, options: DemoOptions
) -> AsyncIterator[list[tuple[WorkloadRecord, trio.Process]]]:
    """Start every workload and wait until all attached; stop them all on exit."""
    as_root = os.geteuid() == 0
    step = min(0.05, options.interval / 4)
    procs: list[tuple[WorkloadRecord, trio.Process]] = []
    identities: dict[int, int | None] = {}
    async with trio.open_nursery() as nursery:
        try:
            events: list[trio.Event] = []
            for w in record.workloads:
                plan = WorkloadPlan(
                    name=w.spec.name,
                    behaviour=w.spec.behaviour,
                    duration=options.duration,
                    step=step,
                    status_period=min(0.5, options.interval),
                    broker_dir=str(paths.broker_dir),
                    container_dir=str(w.directory),
                    user_namespace=not as_root,
                    run_as=NOBODY if as_root else None,
                    exits_at=w.spec.exits_at,
                )
                cache_name = f"{new_pod_uid()}.cache"  # HAMi names it after a fresh UUID
                log = _open_log(paths.logs / f"{w.spec.name}.log")
                try:
                    proc = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "hami_trio.demo.workload", plan.to_json()],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        env=_spawn_env(w, cache_name),
                        start_new_session=True,
                    )
                finally:
                    os.close(log)
                procs.append((w, proc))
                w.supervisor_pid = proc.pid
                identities[proc.pid] = _proc_start_time(proc.pid)
                event = trio.Event()
                events.append(event)
                nursery.start_soon(_read_reports, record, w, proc, event)
            with trio.move_on_after(ATTACH_TIMEOUT):
                for event in events:
                    await event.wait()
            for w in record.workloads:
                if w.error is not None or w.attached is None:
                    reason = w.error or f"did not attach within {ATTACH_TIMEOUT:g}s"
                    hint = ""
                    if not as_root and "user namespace" in reason:
                        hint = (
                            " (run the demo as root, or enable unprivileged user namespaces: "
                            "sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)"
                        )
                    raise DemoError(
                        f"workload {w.spec.name}: {reason}{hint}"
                        + _log_tail(paths.logs / f"{w.spec.name}.log")
                    )
                assert w.supervisor_pid is not None
                w.host_pid = _only_child(w.supervisor_pid)
            yield procs
        finally:
            with trio.CancelScope(shield=True):
                await _stop_workloads(procs)


async def _sleep_until(deadline: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline`` (the workloads' clock)."""
    await trio.sleep(max(deadline - time.monotonic(), 0.0))


async def _scrape_once(record: RunRecord, url: str) -> None:
    try:
        with trio.fail_after(SCRAPE_TIMEOUT + 1):
            sample = await scrape(url)
    except (OSError, ValueError, trio.TooSlowError) as exc:
        record.failed_scrapes += 1
        logger.debug("scrape of %s failed: %s", url, exc)
        return
    previous = record.latest()
    record.samples.append(sample)
    if previous is not None and previous.mig_paused != sample.mig_paused:
        if sample.mig_paused:
            record.event(sample.t, "agent: monitor PAUSED (hami_trio_monitor_mig_paused = 1)")
        else:
            record.event(sample.t, f"agent: monitor resumed, tick {sample.ticks}")


async def _timeline(
    record: RunRecord,
    paths: DemoPaths,
    procs: list[tuple[WorkloadRecord, trio.Process]],
    screen: Screen,
    url: str,
) -> None:
    start = time.monotonic() + _GO_LEAD
    record.start = start
    go = (json.dumps({"start": start}) + "\n").encode()
    for _, proc in procs:
        assert proc.stdin is not None
        await proc.stdin.send_all(go)
    duration = record.duration
    period = min(0.5, record.interval)
    try:
        async with trio.open_nursery() as nursery:

            async def scraping() -> None:
                while True:
                    await _scrape_once(record, url)
                    await trio.sleep(period)

            async def drawing() -> None:
                while True:
                    screen.update(record, record.latest(), time.monotonic())
                    await trio.sleep(0.25)

            nursery.start_soon(scraping)
            nursery.start_soon(drawing)
            await _sleep_until(start + MIG_WINDOW[0] * duration)
            paths.mig_lock.touch(exist_ok=False)
            record.mig_created = time.monotonic()
            record.event(record.mig_created, f"demo: MIG apply lock created ({paths.mig_lock})")
            await _sleep_until(start + MIG_WINDOW[1] * duration)
            paths.mig_lock.unlink()
            record.mig_removed = time.monotonic()
            record.event(record.mig_removed, "demo: MIG apply lock removed")
            await _sleep_until(start + duration)
            nursery.cancel_scope.cancel()
    finally:
        paths.mig_lock.unlink(missing_ok=True)
    await _scrape_once(record, url)  # the broker's final counters for the summary
    screen.update(record, record.latest(), time.monotonic())


def _check_leftovers(record: RunRecord, paths: DemoPaths) -> None:
    for w in record.workloads:
        for role, pid in (("supervisor", w.supervisor_pid), ("workload", w.host_pid)):
            if pid is not None and _proc_start_time(pid) is not None:
                record.stray_processes.append(f"{w.spec.name} {role} (PID {pid})")
    record.socket_left = os.path.lexists(paths.socket_path)


async def _agent(
    serve: AgentServer,
    settings: AgentSettings,
    record: RunRecord,
    run: trio.CancelScope,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[RunningAgent],
) -> None:
    """Run the agent; a failure after its start ends the run and is recorded, not raised."""
    status = StartRecorder(task_status)
    try:
        await serve(settings, task_status=status)
    except HamiTrioError as exc:
        if not status.done:
            raise  # nursery.start() raises it: the demo cannot start
        record.agent_error = str(exc)
        record.event(time.monotonic(), f"agent FAILED: {exc}")
        run.cancel()
    finally:
        stopped.set()


def status_command(address: BindAddress) -> str:
    """The ``hami-trio status`` command line that reads the demo agent's debug view."""
    return f"hami-trio status --address {address}"


async def _status_table(record: RunRecord, address: BindAddress) -> None:
    """Fetch the debug view over HTTP, as ``hami-trio status`` does, into the record.

    A failure is recorded in the summary, never a check: the demo's exit status stays what
    its checks say.
    """
    try:
        document = await trio.to_thread.run_sync(
            partial(fetch_state, address, timeout=SCRAPE_TIMEOUT)
        )
    except HamiTrioError as exc:
        record.status_error = str(exc)
        return
    record.status_table = format_status(document).splitlines()


async def _run(
    record: RunRecord,
    paths: DemoPaths,
    options: DemoOptions,
    serve_agent: AgentServer,
    screen: Screen,
) -> None:
    settings = AgentSettings(
        paths, options.interval, options.metrics_bind, paths.logs / "agent.log"
    )
    run = trio.CancelScope()

    def interrupt(signum: int) -> None:
        record.interrupted = True
        name = signal_name(signum)
        record.event(time.monotonic(), f"demo: {name}, stopping everything")

    async def session(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        task_status.started(run)  # from now on a signal cancels the run, even before it began
        async with trio.open_nursery() as guard:
            # The agent runs in this outer nursery, outside ``run``: a Ctrl-C cancels the
            # run, and the agent still gets its graceful drain afterwards.
            stopped = trio.Event()
            try:
                agent: RunningAgent = await guard.start(
                    _agent, serve_agent, settings, record, run, stopped
                )
                record.metrics_url = agent.metrics_url
                debug = agent.debug_address
                record.debug_address = None if debug is None else str(debug)
                try:
                    banner = [
                        "agent ready, in this process; the same agent as:",
                        f"  {agent.command}",
                        f"agent metrics: {agent.metrics_url}",
                    ]
                    if debug is not None:
                        banner.append(
                            f"why each container shows what it shows: {status_command(debug)}"
                        )
                    screen.print(banner)
                    with run:
                        async with _workloads(record, paths, options) as procs:
                            await _timeline(record, paths, procs, screen, agent.metrics_url)
                            if debug is not None:
                                # While the workloads still hold their slots: the closing table.
                                await _status_table(record, debug)
                finally:
                    agent.request_stop()
                    with trio.move_on_after(AGENT_STOP_TIMEOUT):
                        await stopped.wait()
                    if not stopped.is_set():
                        record.agent_error = f"did not stop within {AGENT_STOP_TIMEOUT:g}s"
            finally:
                guard.cancel_scope.cancel()
                screen.update(record, record.latest(), time.monotonic())  # the last events
                screen.close()

    # The first signal cancels the run; later ones are received and ignored.
    await serve_under_signals(
        session, trio.CancelScope.cancel, first=interrupt, second_cancels=False
    )
    _check_leftovers(record, paths)


async def run_demo(
    options: DemoOptions, *, serve_agent: AgentServer, out: TextIO | None = None
) -> dict[str, Any]:
    """Run the whole demo and return its summary (also written to ``--summary-json``).

    Args:
        options: the command's flags.
        serve_agent: runs the agent (:func:`hami_trio.demo.agent.serve_demo_agent`).
        out: where the view and the summary go (default stdout).

    Returns:
        The summary document (:func:`~hami_trio.demo.report.summarize`).

    Raises:
        ConfigError: ``--summary-json`` cannot be written (checked before the run).
        HamiTrioError: the agent or a workload could not start (one clear message); nothing
            is left running.
    """
    out = sys.stdout if out is None else out
    specs = default_workloads(options.workloads)
    check_output(options.summary_json)
    root, temporary = _prepare_root(options.root)
    try:
        paths = DemoPaths(root)
        paths.logs.mkdir()
        paths.containers.mkdir(parents=True)
        as_root = os.geteuid() == 0
        record = RunRecord(
            workloads=[],
            duration=options.duration,
            interval=options.interval,
            root=root,
            sandbox=_sandbox_words(as_root),
        )
        for spec in specs:
            pod_uid = new_pod_uid()
            directory = paths.container_dir(pod_uid, spec.name)
            directory.mkdir(mode=0o755)
            if as_root:  # the workload runs as NOBODY and writes its .cache file here
                os.chown(directory, NOBODY, NOBODY)
            record.workloads.append(WorkloadRecord(spec, pod_uid, directory))
        screen = Screen(out, plain_period=max(2.0, options.duration / 6))
        screen.print(
            [
                f"hami-trio demo: the agent and {len(specs)} simulated HAMi-core workloads for "
                f"{options.duration:g}s (monitor interval {options.interval:g}s); Ctrl-C stops",
                f"root {root}{' (temporary)' if temporary else ''}",
                record.sandbox,
                "memory and SM figures are simulated: each workload writes them into its "
                "shared region as HAMi-core would (no GPU is used)",
            ]
            + [f"  {s.name:<12} priority {s.priority} on {s.gpu[:8]}: {s.role}" for s in specs]
        )
        try:
            await _run(record, paths, options, serve_agent, screen)
        except BaseExceptionGroup as group:
            only = sole_error(group)
            if isinstance(only, HamiTrioError):
                raise only from None
            raise
        summary = summarize(record)
        screen.print(render_summary(summary))
        if options.summary_json is not None:
            options.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
