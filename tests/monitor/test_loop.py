"""The tick loop: configuration, feedback written back, MIG pause, stop, metrics.

Time-dependent tests run on trio's MockClock (``autojump_clock``): virtual seconds, exact
tick counts, no sleeping.  The MIG lock is a real file watched by real inotify.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry
from trio.testing import MockClock

from hami_trio.agent.grants import pod_grants
from hami_trio.monitor import loop as loop_module
from hami_trio.monitor import miglock
from hami_trio.monitor.feedback import Write
from hami_trio.monitor.layout import ControlField
from hami_trio.monitor.loop import Monitor, MonitorConfig, serve_monitor
from hami_trio.monitor.state import ContainerKey
from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.pods.source import PodInfo, StaticPodSource
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, write_region
from tests.sandbox import NOBODY, run_in_child, world_readable_dir

# -- the loop ------------------------------------------------------------------------------


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    hook = tmp_path / "hook"
    (hook / "containers").mkdir(parents=True)
    return hook


def add(hook: Path, name: str, **spec: object) -> SimulatedWorkload:
    directory = hook / "containers" / name
    directory.mkdir()
    path = directory / "x.cache"
    write_region(path, RegionSpec(uuids=["GPU-0"], **spec))  # type: ignore[arg-type]
    return SimulatedWorkload(path)


def config(hook: Path, **kw: object) -> MonitorConfig:
    return MonitorConfig(hook_path=hook, mig_lock_path=hook.parent / "mig" / "lock", **kw)  # type: ignore[arg-type]


async def start(
    nursery: trio.Nursery, cfg: MonitorConfig, registry: CollectorRegistry | None = None
) -> Monitor:
    monitor: Monitor = await nursery.start(
        functools.partial(serve_monitor, cfg, pod_source=StaticPodSource(), registry=registry)
    )
    return monitor


async def test_ticks_every_interval_and_writes_feedback(
    autojump_clock: MockClock, hook: Path
) -> None:
    hi = add(hook, "hi_c", priority=0, recent_kernel=2)
    lo = add(hook, "lo_c", priority=1, recent_kernel=2)
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        monitor = await start(nursery, config(hook), registry)
        assert trio.current_time() == t0
        assert monitor.ticks == 1  # started after the first tick
        assert hi.read_control() == (1, 0)
        assert lo.read_control() == (-1, 1)
        state = monitor.containers()[ContainerKey("lo", "c")]
        assert state.snapshot is not None
        assert state.snapshot.recent_kernel == 2  # the snapshot is what was read
        await trio.sleep(12)
        assert monitor.ticks == 3  # t = 0, 5, 10
        assert hi.read_control() == (0, 0)
        assert lo.read_control() == (0, 0)  # released once hi went quiet
        monitor.request_stop()
    # The per-state container counts are the collector's (they need the pods); the monitor
    # stamps each completed tick with the wall clock.
    assert monitor.last_tick_time is not None
    assert (
        registry.get_sample_value("hami_trio_monitor_last_tick_timestamp_seconds")
        == monitor.last_tick_time
    )
    assert registry.get_sample_value("hami_trio_monitor_tick_duration_seconds_count") == 3
    assert registry.get_sample_value("hami_trio_monitor_mig_paused") == 0
    assert (
        registry.get_sample_value("hami_trio_monitor_files_rejected_total", {"reason": "magic"})
        == 0
    )


def test_writes_are_cut_into_batches_of_whole_containers() -> None:
    rk, us = ControlField.RECENT_KERNEL, ControlField.UTILIZATION_SWITCH
    writes = (
        Write("a", rk, 1),
        Write("a", us, 1),
        Write("b", rk, 0),
        Write("c", rk, 1),
        Write("c", us, 0),
    )
    batches = loop_module._batches(writes, 2)
    assert [[(w.key, w.field) for w in batch] for batch in batches] == [
        [("a", rk), ("a", us), ("b", rk)],
        [("c", rk), ("c", us)],
    ]
    assert loop_module._batches(writes, 3) == [writes]
    assert [len(b) for b in loop_module._batches(writes, 1)] == [2, 1, 2]
    assert loop_module._batches((), 2) == []


async def test_a_lock_that_appears_between_two_batches_stops_the_writes(
    autojump_clock: MockClock, hook: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    works = [add(hook, f"p{i}_c", priority=i, recent_kernel=2) for i in range(3)]
    cfg = config(hook)
    monkeypatch.setattr(loop_module, "WRITE_BATCH", 1)
    monitor = Monitor(cfg, pod_source=StaticPodSource())
    real_apply = monitor.lister.apply
    batches: list[int] = []

    def apply(writes: list[Write[ContainerKey]]) -> int:
        batches.append(len(writes))
        done = real_apply(writes)
        cfg.mig_lock_path.touch()  # the MIG apply starts right after the first batch
        return done

    monkeypatch.setattr(monitor.lister, "apply", apply)
    try:
        assert await monitor.tick() == 1  # p0's recent_kernel; then the lock is seen
    finally:
        monitor.close()
    assert len(batches) == 1
    assert [w.read_control()[0] for w in works] == [1, 2, 2]


async def test_rejections_are_counted_in_the_registry(
    autojump_clock: MockClock, hook: Path
) -> None:
    bad = hook / "containers" / "bad_c"
    bad.mkdir()
    (bad / "x.cache").write_bytes(b"\0" * 64)
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, config(hook), registry)
        await trio.sleep(20)
        monitor.request_stop()
    assert (
        registry.get_sample_value("hami_trio_monitor_files_rejected_total", {"reason": "magic"})
        == 1
    )
    assert monitor.containers()[ContainerKey("bad", "c")].rejection is not None


async def test_mig_lock_pauses_within_one_tick_and_resumes(
    autojump_clock: MockClock, hook: Path, caplog: pytest.LogCaptureFixture
) -> None:
    work = add(hook, "a_c", recent_kernel=2)
    cfg = config(hook)
    registry = CollectorRegistry()
    with caplog.at_level(logging.INFO, logger="hami_trio.monitor.loop"):
        async with trio.open_nursery() as nursery:
            monitor = await start(nursery, cfg, registry)
            await trio.sleep(7)
            assert monitor.ticks == 2
            cfg.mig_lock_path.touch()
            await trio.sleep(0.001)
            assert monitor.paused  # inotify: well within one tick
            assert registry.get_sample_value("hami_trio_monitor_mig_paused") == 1
            work.launch_kernel()
            await trio.sleep(60)
            assert monitor.ticks == 2
            assert work.read_control()[0] == 2  # untouched while paused
            cfg.mig_lock_path.unlink()
            await trio.sleep(0.001)
            assert not monitor.paused
            assert monitor.ticks == 3  # resumed with an immediate tick
            assert work.read_control()[0] == 1
            await trio.sleep(5)
            assert monitor.ticks == 4
            monitor.request_stop()
    assert registry.get_sample_value("hami_trio_monitor_mig_paused") == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("monitor paused" in m for m in messages) == 1
    assert sum("monitor resumed" in m for m in messages) == 1


async def test_lock_present_at_start_pauses_from_the_start(
    autojump_clock: MockClock, hook: Path
) -> None:
    work = add(hook, "a_c", recent_kernel=2)
    cfg = config(hook)
    cfg.mig_lock_path.parent.mkdir()
    cfg.mig_lock_path.touch()
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, cfg)
        assert monitor.paused  # started at once, without a tick
        assert monitor.ticks == 0
        assert monitor.containers() == {}
        await trio.sleep(30)
        assert monitor.ticks == 0
        assert work.read_control()[0] == 2
        cfg.mig_lock_path.unlink()
        await trio.sleep(0.001)
        assert not monitor.paused
        assert monitor.ticks == 1
        assert work.read_control()[0] == 1
        monitor.request_stop()


async def test_lock_created_and_removed_between_ticks(
    autojump_clock: MockClock, hook: Path
) -> None:
    work = add(hook, "a_c", recent_kernel=2)
    cfg = config(hook)
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, cfg)
        await trio.sleep(2)
        work.launch_kernel()
        cfg.mig_lock_path.touch()
        cfg.mig_lock_path.unlink()
        await trio.sleep(0.001)
        assert not monitor.paused
        await trio.sleep(4)
        assert monitor.ticks == 2  # t = 0, 5: the schedule carried on
        assert work.read_control()[0] == 1
        monitor.request_stop()


async def test_without_inotify_the_lock_is_still_seen_within_one_tick(
    autojump_clock: MockClock, hook: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(miglock.LockWatch, "ensure", lambda self: None)
    work = add(hook, "a_c", recent_kernel=2)
    cfg = config(hook)
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, cfg)
        await trio.sleep(6)
        cfg.mig_lock_path.touch()
        work.launch_kernel()
        await trio.sleep(4.5)  # t = 10.5: the tick at t = 10 saw the lock
        assert monitor.paused
        assert work.read_control()[0] == 2
        cfg.mig_lock_path.unlink()
        await trio.sleep(5)  # noticed at the next poll, at most one interval later
        assert not monitor.paused
        monitor.request_stop()


async def test_stop_finishes_the_current_tick(autojump_clock: MockClock, hook: Path) -> None:
    work = add(hook, "a_c", recent_kernel=2)

    class StopDuringTick(StaticPodSource):
        monitor: Monitor | None = None

        def lookup(self, uid: str) -> PodInfo | None:
            if self.monitor is not None and self.monitor.ticks == 1:
                self.monitor.request_stop()
            return super().lookup(uid)

    source = StopDuringTick()
    monitor = Monitor(config(hook), pod_source=source)
    source.monitor = monitor
    t0 = trio.current_time()
    await monitor.serve()
    assert monitor.ticks == 2  # the tick in which stop was requested completed
    assert trio.current_time() == t0 + 5  # ... and serve returned right after it
    assert work.read_control()[0] == 0  # and its writes were applied (2 -> 1 -> 0)


async def test_stop_while_idle_or_paused_returns_at_once(
    autojump_clock: MockClock, hook: Path
) -> None:
    cfg = config(hook)
    t0 = trio.current_time()
    monitor = Monitor(cfg, pod_source=StaticPodSource())
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.serve)
        await trio.sleep(1)
        monitor.request_stop()
    assert trio.current_time() == t0 + 1
    cfg.mig_lock_path.touch()
    monitor = Monitor(cfg, pod_source=StaticPodSource())
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.serve)
        assert monitor.paused
        monitor.request_stop()
    assert trio.current_time() == t0 + 1


async def test_overrunning_tick_is_abandoned_at_its_deadline(
    autojump_clock: MockClock,
    hook: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = Monitor(config(hook, tick_deadline=1.0), pod_source=StaticPodSource())

    async def slow_update() -> object:
        await trio.sleep(3)
        raise AssertionError("the deadline should have cancelled this")

    monkeypatch.setattr(monitor.lister, "update", slow_update)
    with caplog.at_level(logging.WARNING, logger="hami_trio.monitor.loop"):
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()
            await nursery.start(monitor.serve)
            assert trio.current_time() == t0 + 1
            await trio.sleep(10)
            monitor.request_stop()
    assert monitor.ticks == 0
    assert any("deadline" in r.getMessage() for r in caplog.records)


async def test_serving_twice_is_refused(autojump_clock: MockClock, hook: Path) -> None:
    monitor = Monitor(config(hook), pod_source=StaticPodSource())
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.serve)
        with pytest.raises(RuntimeError, match="already serving"):
            await monitor.serve()
        monitor.request_stop()


async def test_cancellation_closes_every_handle(autojump_clock: MockClock, hook: Path) -> None:
    add(hook, "a_c")
    monitor = Monitor(config(hook), pod_source=StaticPodSource())
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.serve)
        handle = monitor.lister.handle_of("a_c")
        nursery.cancel_scope.cancel()
    assert handle is not None
    assert handle.closed
    assert monitor.config.interval == 5.0


# -- an unsafe MIG lock directory (made by someone else first) ---------------------------------
#
# Before the fix (recorded for the issue): a uid-65534 process that created the directory and
# the lock before the agent paused the monitor from the start (ticks stayed 0), could resume
# and pause it again at will, and a symlinked directory was followed the same way.


def _squat(directory: str, mode: int) -> int:
    """As another host user: create the MIG lock directory and the lock, before the agent."""
    os.mkdir(directory)
    os.chmod(directory, mode)
    os.close(os.open(os.path.join(directory, "hami-mig-apply.lock"), os.O_CREAT | os.O_WRONLY))
    return os.getuid()


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A root-owned sticky 1777 directory every UID can reach: the host's /tmp."""
    with world_readable_dir("ht-mig-") as base:
        tmp = base / "tmp"
        tmp.mkdir()
        tmp.chmod(0o1777)
        yield tmp


@pytest.mark.root
async def test_a_lock_dir_made_first_by_another_user_does_not_pause_the_monitor(
    autojump_clock: MockClock, hook: Path, shared_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = shared_tmp / "hami"
    assert run_in_child(_squat, str(directory), 0o755, uid=NOBODY).value == NOBODY
    work = add(hook, "a_c", recent_kernel=2)
    cfg = MonitorConfig(hook_path=hook, mig_lock_path=directory / "hami-mig-apply.lock")
    registry = CollectorRegistry()
    with caplog.at_level(logging.INFO, logger="hami_trio.monitor.loop"):
        async with trio.open_nursery() as nursery:
            monitor = await start(nursery, cfg, registry)  # starts: a tenant cannot stop that
            assert not monitor.paused
            assert monitor.ticks == 1
            assert work.read_control()[0] == 1  # feedback written despite the squatter's lock
            problem = monitor.mig_lock_problem
            assert problem is not None
            assert problem.reason == "owner"
            assert f"MIG lock directory {directory} refused" in problem.message
            assert f"owned by UID {NOBODY}" in problem.message
            assert f"rm -rf {directory}" in problem.message
            await trio.sleep(31)
            assert monitor.ticks == 7  # t = 0, 5, ..., 30
            assert not monitor.paused
            # The operator removes it; the next check recreates it as root's, and a lock
            # made there (by root: nobody else can now) pauses the monitor again.
            shutil.rmtree(directory)
            await trio.sleep(5)  # the tick at t = 35 re-checks it
            assert monitor.mig_lock_problem is None
            st = os.lstat(directory)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
            cfg.mig_lock_path.touch()
            await trio.sleep(1.5)  # the watch re-arms on the new directory within a second
            assert monitor.paused
            monitor.request_stop()
    assert registry.get_sample_value("hami_trio_monitor_mig_lock_dir_unsafe") == 0
    refusals = "hami_trio_monitor_mig_lock_refusals_total"
    assert registry.get_sample_value(refusals, {"reason": "owner"}) == 1
    assert registry.get_sample_value(refusals, {"reason": "symlink"}) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("MIG lock directory" in m and "refused" in m for m in warnings) == 1
    assert any("is safe again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", ["symlink", "group-writable", "file"])
async def test_an_unsafe_lock_dir_is_refused_and_never_followed(
    autojump_clock: MockClock, hook: Path, shared_tmp: Path, kind: str
) -> None:
    directory = shared_tmp / "hami"
    elsewhere = shared_tmp / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (elsewhere / "hami-mig-apply.lock").touch()
    if kind == "symlink":
        directory.symlink_to(elsewhere)
    elif kind == "group-writable":
        directory.mkdir()
        directory.chmod(0o775)
        (directory / "hami-mig-apply.lock").touch()
    else:
        directory.write_text("")
    before = sorted(os.listdir(elsewhere)), os.lstat(elsewhere).st_mode
    cfg = MonitorConfig(hook_path=hook, mig_lock_path=directory / "hami-mig-apply.lock")
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, cfg, registry)
        assert not monitor.paused
        await trio.sleep(11)
        assert monitor.ticks == 3  # t = 0, 5, 10
        problem = monitor.mig_lock_problem
        assert problem is not None
        assert problem.reason == {"symlink": "symlink", "group-writable": "mode"}.get(
            kind, "not-directory"
        )
        assert registry.get_sample_value("hami_trio_monitor_mig_lock_dir_unsafe") == 1
        monitor.request_stop()
    assert (sorted(os.listdir(elsewhere)), os.lstat(elsewhere).st_mode) == before


@pytest.mark.root
async def test_readiness_says_why_without_making_the_agent_unready(
    hook: Path, shared_tmp: Path
) -> None:
    from hami_trio.agent.config import resolve_config
    from hami_trio.agent.service import AgentHandle, serve_agent
    from hami_trio.cli.main import build_parser
    from tests.agent.agent import http_get

    directory = shared_tmp / "hami"
    run_in_child(_squat, str(directory), 0o755, uid=NOBODY)
    argv = [
        "run",
        f"--hook-path={hook}",
        f"--mig-lock-path={directory / 'hami-mig-apply.lock'}",
        f"--lock-parent-path={shared_tmp / 'vgpulock'}",
        "--metrics-bind-address=127.0.0.1:0",
        "--debug-bind-address=127.0.0.1:0",
        "--interval=0.05",
        "--no-kubernetes",
    ]
    config = resolve_config(build_parser().parse_args(argv), {})
    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(serve_agent, config)
        port = handle.metrics_address.port
        status, body = await trio.to_thread.run_sync(http_get, port, "/readyz")
        assert status == 200  # informational: a tenant cannot take the node's metrics away
        assert f"[-]mig-lock-dir failed: MIG lock directory {directory} refused" in body
        assert f"owned by UID {NOBODY}" in body
        assert body.endswith("readyz check passed\n")
        _, text = await trio.to_thread.run_sync(http_get, port, "/metrics")
        assert "hami_trio_monitor_mig_lock_dir_unsafe 1.0" in text
        assert 'hami_trio_monitor_mig_lock_refusals_total{reason="owner"} 1.0' in text
        assert "hami_trio_monitor_mig_paused 0.0" in text
        handle.request_stop()


async def test_each_completed_tick_is_stamped_with_the_wall_clock(hook: Path) -> None:
    add(hook, "a_c")
    registry = CollectorRegistry()
    now = [1_800_000_000.0]
    monitor = Monitor(
        config(hook), pod_source=StaticPodSource(), registry=registry, wall_clock=lambda: now[0]
    )
    try:
        assert monitor.last_tick_time is None
        assert registry.get_sample_value("hami_trio_monitor_last_tick_timestamp_seconds") == 0
        await monitor.tick()
        now[0] += 7.5
        await monitor.tick()
    finally:
        monitor.close()
    assert monitor.last_tick_time == 1_800_000_007.5
    assert (
        registry.get_sample_value("hami_trio_monitor_last_tick_timestamp_seconds")
        == 1_800_000_007.5
    )


# -- process states and blocking counters (the insights) ------------------------------------


async def test_insights_count_processes_and_blocking_on_the_monitor_clock(
    autojump_clock: MockClock, hook: Path
) -> None:
    from hami_trio.testing.regions import ProcSlot

    me = os.getpid()
    # 300 distinct host PIDs above any pid_max: more than one by one, so /proc is listed once.
    dead = [ProcSlot(pid=i + 2, hostpid=2_000_000_000 + i) for i in range(300)]
    add(hook, "hi_c", priority=0, recent_kernel=2, procs=[ProcSlot(pid=1, hostpid=me)])
    add(hook, "lo_c", priority=1, recent_kernel=2, procs=[ProcSlot(pid=1, hostpid=0), *dead])
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, config(hook, host_pid_namespace=True), registry)
        view = monitor.usage()  # blocking, in the test's task: no thread under MockClock
        hi, lo = (view.insights[ContainerKey(n, "c")] for n in ("hi", "lo"))
        assert (hi.processes.running, hi.processes.exited, hi.processes.unknown) == (1, 0, 0)
        assert (lo.processes.running, lo.processes.exited, lo.processes.unknown) == (0, 300, 1)
        assert lo.recent_kernel == -1  # what the tick wrote, as the usage read found it
        assert monitor.usage() is view  # fresh: the same read
        assert (lo.block.blocked, lo.block.blocks, lo.block.since) == (True, 1, trio.current_time())
        await trio.sleep(12)  # ticks at 5 (lo released: hi's recent_kernel fell to 0) and 10
        lo = monitor.usage().insights[ContainerKey("lo", "c")]
        assert (lo.block.blocked, lo.block.seconds, lo.block.blocks) == (False, 5.0, 1)
        monitor.request_stop()
    assert registry.get_sample_value("hami_trio_monitor_process_liveness_checked") == 1
    # liveness is decided by the usage reads (two), not by the ticks (three)
    assert registry.get_sample_value("hami_trio_monitor_process_listings_total") == 2
    assert registry.get_sample_value("hami_trio_monitor_usage_reads_total") == 2
    assert registry.get_sample_value("hami_trio_monitor_process_liveness_checks_total") == 0


# -- another monitor on the same regions -------------------------------------------------


async def test_a_second_monitor_is_detected_logged_once_and_cleared_without_a_fight(
    autojump_clock: MockClock, hook: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.monitor.upstream_writer import upstream_tick

    hi = add(hook, "hi_c", priority=0, recent_kernel=2)
    lo = add(hook, "lo_c", priority=1, recent_kernel=2)
    registry = CollectorRegistry()
    foreign = True

    async def workloads_and_upstream() -> None:
        # Half an interval after each tick: both workloads launch, then (while it runs)
        # HAMi's own monitor ticks on the same files.
        await trio.sleep(2.5)
        while True:
            hi.launch_kernel()
            lo.launch_kernel()
            if foreign:
                upstream_tick(hook / "containers")
            await trio.sleep(5)

    def gauge() -> float | None:
        return registry.get_sample_value("hami_trio_monitor_foreign_writer")

    with caplog.at_level(logging.INFO, logger="hami_trio.monitor.loop"):
        async with trio.open_nursery() as nursery:
            monitor = await start(nursery, config(hook), registry)
            nursery.start_soon(workloads_and_upstream)
            await trio.sleep(5 * 4)
            assert monitor.foreign_writer
            assert gauge() == 1
            counted = registry.get_sample_value("hami_trio_monitor_foreign_writes_total")
            assert counted is not None
            assert counted >= 2
            await trio.sleep(5 * 6)
            assert monitor.foreign_writer  # still there: no flapping
            foreign = False
            await trio.sleep(5 * 14)
            assert not monitor.foreign_writer
            assert gauge() == 0
            # hami-trio's feedback is the only one again: hi runs, lo is blocked behind it.
            assert hi.read_control()[0] >= 0
            monitor.request_stop()
            nursery.cancel_scope.cancel()
    fired = [r for r in caplog.records if getattr(r, "event", None) == "foreign_writer"]
    gone = [r for r in caplog.records if getattr(r, "event", None) == "foreign_writer_gone"]
    assert len(fired) == 1
    assert len(gone) == 1
    assert "docs/migration.md" in fired[0].getMessage()


async def test_one_monitor_alone_never_sees_a_foreign_writer(
    autojump_clock: MockClock, hook: Path
) -> None:
    hi = add(hook, "hi_c", priority=0, recent_kernel=2)
    lo = add(hook, "lo_c", priority=1, recent_kernel=2)
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        monitor = await start(nursery, config(hook), registry)
        for step in range(40):
            await trio.sleep(2.5)
            if step % 3:  # bursts and pauses, both containers
                hi.launch_kernel()
            if step % 2:
                lo.launch_kernel()
        assert not monitor.foreign_writer
        monitor.request_stop()
    assert registry.get_sample_value("hami_trio_monitor_foreign_writes_total") == 0


# -- pod grants ----------------------------------------------------------------------------


def granted_pods() -> StaticPodSource:
    """attacker allocated GPU-A, victim GPU-B (both with priority 1 in their specs)."""
    return StaticPodSource(
        [
            PodInfo(
                name,
                f"ns-{name}",
                name,
                containers=("c",),
                annotations={ALLOCATED_ANNOTATION: f"{gpu},NVIDIA,1024,0:;"},
                priorities={"c": 1},
            )
            for name, gpu in (("attacker", "GPU-A"), ("victim", "GPU-B"))
        ]
    )


def attack(hook: Path) -> tuple[SimulatedWorkload, SimulatedWorkload]:
    """The attacker's file claims the victim's GPU-B at priority 0; both are launching."""
    attacker = add_region(hook, "attacker_c", uuids=["GPU-B"], priority=0, recent_kernel=2)
    victim = add_region(hook, "victim_c", uuids=["GPU-B"], priority=1, recent_kernel=2)
    return attacker, victim


def add_region(hook: Path, name: str, **spec: object) -> SimulatedWorkload:
    directory = hook / "containers" / name
    directory.mkdir()
    path = directory / "x.cache"
    write_region(path, RegionSpec(**spec))  # type: ignore[arg-type]
    return SimulatedWorkload(path)


async def test_with_grants_a_file_cannot_block_a_gpu_its_pod_was_not_given(
    autojump_clock: MockClock, hook: Path
) -> None:
    attacker, victim = attack(hook)
    registry = CollectorRegistry()
    monitor = Monitor(config(hook), pod_source=granted_pods(), registry=registry, grants=pod_grants)
    try:
        await monitor.tick()
    finally:
        monitor.close()
    assert victim.read_control() == (1, 0)  # not blocked
    assert attacker.read_control() == (1, 0)  # counted alone on its GPU-A
    reason = {"reason": "uuid"}
    assert registry.get_sample_value("hami_trio_monitor_stray_claim_containers", reason) == 1
    assert registry.get_sample_value("hami_trio_monitor_stray_claims_total", reason) == 1
    # The file says 0, the spec 1: a stray priority as well.
    assert (
        registry.get_sample_value("hami_trio_monitor_stray_claims_total", {"reason": "priority"})
        == 1
    )
    key = ContainerKey("attacker", "c")
    snapshot = monitor.containers()[key].snapshot
    assert snapshot is not None
    claim = monitor.claim(key, snapshot)
    assert (claim.scoped, claim.devices, claim.counted, claim.strays) == (
        True,
        ("GPU-A",),
        ("GPU-A",),
        ("GPU-B",),
    )
    assert (claim.priority, claim.file_priority, claim.stray_reasons) == (
        1,
        0,
        ("uuid", "priority"),
    )


async def test_without_grants_the_files_count_alone_as_upstream(
    autojump_clock: MockClock, hook: Path
) -> None:
    """No Kubernetes (the agent passes no grants): upstream's behaviour, the lie obeyed."""
    _, victim = attack(hook)
    registry = CollectorRegistry()
    monitor = Monitor(config(hook), pod_source=granted_pods(), registry=registry)
    try:
        await monitor.tick()
    finally:
        monitor.close()
    assert victim.read_control() == (-1, 1)
    assert (
        registry.get_sample_value("hami_trio_monitor_stray_claim_containers", {"reason": "uuid"})
        == 0
    )
    key = ContainerKey("attacker", "c")
    snapshot = monitor.containers()[key].snapshot
    assert snapshot is not None
    assert monitor.claim(key, snapshot).scoped is False


# -- out of descriptors ------------------------------------------------------------------


def _fail_opening(
    monkeypatch: pytest.MonkeyPatch, path: Path, err: int = errno.EMFILE
) -> list[bool]:
    """Make ``os.open(path)`` fail with ``err`` while the returned switch holds True (the
    process is out of descriptors for that check; every other open works)."""
    switch = [True]
    real_open = os.open

    def fake_open(file: object, *args: object, **kwargs: object) -> int:
        if switch[0] and isinstance(file, str | os.PathLike) and os.fspath(file) == str(path):
            raise OSError(err, os.strerror(err))
        return real_open(file, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(miglock.os, "open", fake_open)  # type: ignore[attr-defined]
    return switch


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE])
async def test_a_lock_check_that_cannot_run_holds_the_writes(
    autojump_clock: MockClock, hook: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    work = add(hook, "a_c", recent_kernel=2)
    cfg = config(hook)
    registry = CollectorRegistry()
    monitor = Monitor(cfg, pod_source=StaticPodSource(), registry=registry)
    _fail_opening(monkeypatch, cfg.mig_lock_path.parent.parent, err)
    try:
        assert await monitor.tick() == 0  # "Too many open files" is never "no lock"
    finally:
        monitor.close()
    assert work.read_control()[0] == 2
    assert monitor.mig_lock_problem is None  # and not a refused directory either
    assert registry.get_sample_value(
        "hami_trio_monitor_descriptors_exhausted_total", {"check": "mig_lock"}
    )


async def test_out_of_descriptors_pauses_keeps_the_view_and_resumes(
    autojump_clock: MockClock,
    hook: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = add(hook, "a_c", recent_kernel=2)
    cfg = config(hook)
    registry = CollectorRegistry()
    with caplog.at_level(logging.INFO, logger="hami_trio.monitor.loop"):
        async with trio.open_nursery() as nursery:
            monitor = await start(nursery, cfg, registry)
            assert work.read_control()[0] == 1
            view = monitor.containers()
            switch = _fail_opening(monkeypatch, cfg.mig_lock_path.parent.parent)
            work.launch_kernel()
            await trio.sleep(30)
            assert monitor.paused
            assert registry.get_sample_value("hami_trio_monitor_mig_paused") == 1
            assert work.read_control()[0] == 2  # untouched while the check cannot run
            assert monitor.containers() is view  # the last view, not an empty one
            assert monitor.mig_lock_problem is None
            switch[0] = False  # descriptors again: noticed within one interval
            await trio.sleep(cfg.interval + 1)
            assert not monitor.paused
            assert work.read_control()[0] < 2  # written again
            monitor.request_stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot be checked (Too many open files): monitor paused" in m for m in messages)
    assert any("can be checked again and does not exist: monitor resumed" in m for m in messages)
