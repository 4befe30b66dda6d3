"""The lister's inotify watch: every replacement still caught at the next tick, and the
identity ``lstat`` really skipped for quiet directories.

Each attack is performed for real between two ticks, on real files, with the watch active;
the lister's answer is compared with that of a lister that has no watch (``max_watches=0``:
today's ``lstat`` every tick) ticking the same tree.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import inotify_simple
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from hami_trio.monitor import watch as watch_module
from hami_trio.monitor.feedback import Write
from hami_trio.monitor.layout import LAYOUTS, ControlField, Format, RejectReason
from hami_trio.monitor.lister import CHECKPOINT_EVERY, ContainerLister
from hami_trio.monitor.loop import Monitor, MonitorConfig
from hami_trio.monitor.region import PROBE_SLACK
from hami_trio.monitor.state import ContainerKey, ContainerStatus
from hami_trio.monitor.watch import (
    PARSE_BYTES,
    RETRY_TICKS,
    WATCH_FALLBACKS,
    DirectoryWatch,
    Events,
    parse_events,
)
from hami_trio.pods.source import PodInfo, StaticPodSource
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, write_region
from tests.monitor.test_lister import Calls, container
from tests.strategies.watch import event_streams, tenant_moves

V1 = LAYOUTS[Format.V1]
NAMES = ("u0_c", "u1_c", "u2_c")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "containers"
    path.mkdir()
    return path


class Stats:
    """Counts ``os.stat`` calls: the lister makes one per identity check, none otherwise."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real: Callable[..., os.stat_result] = os.stat

        def counted(*args: Any, **kwargs: Any) -> os.stat_result:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(os, "stat", counted)

    def reset(self) -> int:
        calls, self.calls = self.calls, 0
        return calls


def lister(root: Path, **kw: Any) -> tuple[ContainerLister, Calls, Calls]:
    rejects, fallbacks = Calls(), Calls()
    made = ContainerLister(
        root, StaticPodSource(), on_reject=rejects, on_watch_fallback=fallbacks, **kw
    )
    return made, rejects, fallbacks


def kernel_watches(made: ContainerLister) -> int:
    """Watches the kernel holds for the lister's inotify instance (/proc/self/fdinfo)."""
    notify = made._watch._inotify  # the test looks behind the lister's back on purpose
    if notify is None:
        return 0
    text = Path(f"/proc/self/fdinfo/{notify.fileno()}").read_text()
    return len(re.findall(r"^inotify wd:", text, re.M))


class Pair:
    """A watched lister and an lstat-only one ticking the same tree."""

    def __init__(self, root: Path) -> None:
        self.watched, self.rejects, self.fallbacks = lister(root)
        self.plain, self.plain_rejects, _ = lister(root, max_watches=0)

    async def tick(self) -> dict[ContainerKey, Any]:
        view = await self.watched.update()
        expected = await self.plain.update()
        assert dict(view) == dict(expected)
        assert self.rejects.seen == self.plain_rejects.seen
        return dict(view)

    def close(self) -> None:
        self.watched.close()
        self.plain.close()


# -- what a tenant (or a host process) does between two ticks ----------------------------------


def _clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


_ON_REGULAR = frozenset(
    {"rewrite", "hard_link_beside", "truncate", "grow", "shrink_to_sizeof", "extend_far"}
)


def _on_regular(directory: Path, cache: Path, move: str, serial: int) -> None:
    """The moves of :data:`_ON_REGULAR`, done only to a regular file."""
    if move == "rewrite":
        SimulatedWorkload(cache).set_priority(serial % 50)
    elif move == "hard_link_beside":
        os.link(cache, directory / f"second{serial}")
    elif move == "truncate":
        os.truncate(cache, 100)
    elif move == "grow":
        os.truncate(cache, cache.stat().st_size + 1)
    elif move == "shrink_to_sizeof":
        os.truncate(cache, V1.sizeof)
    else:  # extend_far
        os.truncate(cache, cache.stat().st_size + PROBE_SLACK + 4096)


def perform(root: Path, index: int, move: str, outside: Path, serial: int) -> None:
    """Do ``move`` to container ``index`` (a missing directory is made afresh first)."""
    directory = root / NAMES[index]
    if not directory.is_dir():
        container(root, NAMES[index], "x.cache", priority=serial % 7)
        return
    cache = directory / "x.cache"
    if move in _ON_REGULAR:
        if cache.is_file() and not cache.is_symlink():
            _on_regular(directory, cache, move, serial)
    elif move == "rename_over":
        write_region(directory / "new", RegionSpec(priority=serial % 50, uuids=["GPU-1"]))
        _clear(cache)
        os.replace(directory / "new", cache)
    elif move == "unlink_create":
        _clear(cache)
        write_region(cache, RegionSpec(priority=serial % 50, uuids=["GPU-2"]))
    elif move == "symlink":
        _clear(cache)
        cache.symlink_to(outside)
    elif move == "fifo":
        _clear(cache)
        os.mkfifo(cache)
    elif move == "directory":
        _clear(cache)
        cache.mkdir()
    elif move == "hard_link_in":
        os.link(outside, directory / "tmp")
        _clear(cache)
        os.replace(directory / "tmp", cache)
    elif move == "unlink":
        _clear(cache)
    elif move == "other_files":
        for i in range(20):
            (directory / f"tmp{i}").touch()
            (directory / f"tmp{i}").unlink()
    elif move == "dir_renamed":
        directory.rename(root / f"moved{serial}")  # no "_": not a container name
        container(root, NAMES[index], "x.cache", priority=serial % 50)
    elif move == "dir_removed":
        shutil.rmtree(directory)


def outside_file(tmp_path: Path) -> Path:
    """A valid region outside every container directory (somebody else's file)."""
    path = tmp_path / "outside.cache"
    write_region(path, RegionSpec(priority=42, uuids=["GPU-9"]))
    return path


async def settled(root: Path, tmp_path: Path) -> tuple[Pair, Path]:
    for name in NAMES:
        container(root, name, "x.cache")
    pair = Pair(root)
    await pair.tick()  # opened, watched
    await pair.tick()  # the watches confirmed by one lstat each
    return pair, outside_file(tmp_path)


# -- quiet directories are not stat'ed -----------------------------------------------------------


async def test_a_quiet_directory_is_read_without_an_lstat(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NAMES:
        container(root, name, "x.cache")
    made, _, fallbacks = lister(root)
    stats = Stats(monkeypatch)
    await made.update()  # opens each file, watches its directory, looks the name up once
    assert stats.reset() == len(NAMES)
    await made.update()  # one lstat through the containers directory confirms each watch
    assert stats.reset() == len(NAMES)
    SimulatedWorkload(root / "u1_c" / "x.cache").set_priority(7)  # content: no name change
    for _ in range(3):
        view = await made.update()
        assert stats.reset() == 0
    assert view[ContainerKey("u1", "c")].snapshot is not None
    assert view[ContainerKey("u1", "c")].snapshot.priority == 7  # type: ignore[union-attr]
    assert made.watched_directories == len(NAMES)
    assert made.unwatched_directories == 0
    assert fallbacks.seen == []
    # The monitor's own control-word writes are no event (no IN_MODIFY).
    made.apply([Write(ContainerKey("u0", "c"), ControlField.RECENT_KERNEL, -1)])
    await made.update()
    assert stats.reset() == 0
    made.close()
    assert made.watched_directories == 0


# -- every replacement is caught at the next tick ------------------------------------------------


@pytest.mark.parametrize(
    ("move", "status", "reason", "replaced"),
    [
        ("rename_over", ContainerStatus.LOADED, None, True),
        ("unlink_create", ContainerStatus.LOADED, None, True),
        ("symlink", ContainerStatus.REJECTED, RejectReason.NOT_REGULAR_FILE, True),
        ("fifo", ContainerStatus.REJECTED, RejectReason.NOT_REGULAR_FILE, True),
        ("directory", ContainerStatus.REJECTED, RejectReason.NOT_REGULAR_FILE, True),
        ("hard_link_in", ContainerStatus.REJECTED, RejectReason.HARD_LINK, True),
        ("hard_link_beside", ContainerStatus.REJECTED, RejectReason.HARD_LINK, True),
        ("truncate", ContainerStatus.REJECTED, RejectReason.UNKNOWN_VERSION, False),
        ("grow", ContainerStatus.LOADED, None, False),
        ("extend_far", ContainerStatus.LOADED, None, False),
        ("unlink", ContainerStatus.NO_CACHE_FILE, None, False),
        ("dir_renamed", ContainerStatus.LOADED, None, True),
    ],
)
async def test_a_replacement_between_two_ticks_is_caught_at_the_next(
    root: Path,
    tmp_path: Path,
    move: str,
    status: ContainerStatus,
    reason: RejectReason | None,
    replaced: bool,
) -> None:
    pair, outside = await settled(root, tmp_path)
    try:
        old = pair.watched.handle_of("u1_c")
        size_before = (root / "u1_c" / "x.cache").stat().st_size
        perform(root, 1, move, outside, serial=9)
        view = await pair.tick()  # the same answer as the lstat lister's, and:
        state = view[ContainerKey("u1", "c")]
        assert state.status is status
        assert (state.rejection.reason if state.rejection else None) == reason
        assert ("replaced" in pair.rejects.seen) is replaced
        if replaced:
            assert old is not None
            assert old.closed
        if move in ("rename_over", "unlink_create", "dir_renamed"):
            assert state.snapshot is not None
            assert state.snapshot.priority == 9 % 50
        if move in ("grow", "extend_far"):
            assert state.snapshot is not None
            assert state.snapshot.file_size > size_before
        if move == "hard_link_in":  # somebody else's file never gets a write
            before = outside.read_bytes()
            pair.watched.apply([Write(ContainerKey("u1", "c"), ControlField.RECENT_KERNEL, -1)])
            assert outside.read_bytes() == before
        await pair.tick()  # and the tick after agrees too
    finally:
        pair.close()


async def test_a_removed_directory_is_forgotten_and_its_watch_released(
    root: Path, tmp_path: Path
) -> None:
    pair, outside = await settled(root, tmp_path)
    try:
        assert kernel_watches(pair.watched) == 3
        perform(root, 1, "dir_removed", outside, serial=1)
        view = await pair.tick()
        assert ContainerKey("u1", "c") not in view
        assert pair.watched.watched_directories == kernel_watches(pair.watched) == 2
    finally:
        pair.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pauses=st.lists(tenant_moves(), min_size=1, max_size=5))
async def test_watched_and_lstat_listers_agree_whatever_tenants_do(
    tmp_path_factory: pytest.TempPathFactory, pauses: list[list[tuple[int, str]]]
) -> None:
    """Any sequence of replacements, truncations, name games in three directories: after
    every tick the watched lister's view and rejection counts are the lstat lister's."""
    base = tmp_path_factory.mktemp("agree")
    root = base / "containers"
    root.mkdir()
    pair, outside = await settled(root, base)
    serial = 0
    try:
        for moves in pauses:
            for index, move in moves:
                serial += 1
                perform(root, index, move, outside, serial)
            await pair.tick()
        assert pair.watched.watched_directories == kernel_watches(pair.watched)
    finally:
        pair.close()


async def test_a_second_name_made_outside_the_directory_points_writes_at_its_own_file(
    root: Path, tmp_path: Path
) -> None:
    """The case the per-tick link count covered and the watch does not see: a second name
    for a container's file made in another directory.  The name that matters is the new one
    (another container's): that directory's event makes its lister refuse it.  The file's
    own container keeps reading and writing its own file, which is all the link count ever
    protected: no write goes anywhere else."""
    pair, _ = await settled(root, tmp_path)
    try:
        victim = root / "u1_c" / "x.cache"
        os.unlink(root / "u0_c" / "x.cache")
        os.link(victim, root / "u0_c" / "x.cache")  # u0's name now leads to u1's file
        view = await pair.watched.update()
        u0 = view[ContainerKey("u0", "c")]
        assert u0.rejection is not None
        assert u0.rejection.reason is RejectReason.HARD_LINK
        assert view[ContainerKey("u1", "c")].status is ContainerStatus.LOADED
        assert (
            pair.watched.apply(
                [
                    Write(ContainerKey("u0", "c"), ControlField.RECENT_KERNEL, -1),
                    Write(ContainerKey("u1", "c"), ControlField.RECENT_KERNEL, -5),
                ]
            )
            == 1
        )  # u0 has no handle; u1 writes to its own inode (two names now)
        assert SimulatedWorkload(victim).read_control()[0] == -5
    finally:
        pair.close()


# -- floods, overflows, errors and limits ----------------------------------------------------


def queued_events() -> int:
    with open("/proc/sys/fs/inotify/max_queued_events", encoding="ascii") as file:
        return int(file.read())


def flood(directory: Path, count: int) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            name = f"f{i}"
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


async def test_an_event_flood_costs_a_bounded_drain_and_one_lstat_tick(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair, outside = await settled(root, tmp_path)
    parsed: list[int] = []

    def parse(data: bytes) -> Events:
        parsed.append(len(data))
        return parse_events(data)

    monkeypatch.setattr(watch_module, "parse_events", parse)
    try:
        flood(root / "u0_c", 5000)  # ~10,000 events, ~320 KB: far past the parse bound
        perform(root, 2, "rename_over", outside, serial=3)  # a real change in the same pause
        stats = Stats(monkeypatch)
        view = await pair.tick()
        assert pair.fallbacks.seen == ["flood"]
        assert sum(parsed) <= PARSE_BYTES
        assert stats.reset() >= 2 * len(NAMES)  # every container of both listers: lstat
        state = view[ContainerKey("u2", "c")]
        assert state.snapshot is not None
        assert state.snapshot.priority == 3
        assert pair.rejects.seen == ["replaced"]
        await pair.tick()  # u2's new watch is confirmed
        stats.reset()
        await pair.watched.update()
        assert stats.reset() == 0  # back to normal
        assert pair.fallbacks.seen == ["flood"]
        assert pair.watched.watched_directories == kernel_watches(pair.watched) == 3
    finally:
        pair.close()


async def test_a_kernel_queue_overflow_makes_one_tick_check_everything(
    root: Path, tmp_path: Path
) -> None:
    pair, _ = await settled(root, tmp_path)
    try:
        flood(root / "u0_c", queued_events())  # twice the queue's events
        await pair.tick()
        assert pair.fallbacks.seen in (["overflow"], ["flood"])
        await pair.tick()
        assert len(pair.fallbacks.seen) == 1
    finally:
        pair.close()


async def test_a_watch_the_kernel_dropped_during_a_flood_is_forgotten(
    root: Path, tmp_path: Path
) -> None:
    """An IN_IGNORED past the parse bound is dropped with the flood: the drain then asks the
    kernel which watches it still has, so none is believed in that no longer exists."""
    pair, _ = await settled(root, tmp_path)
    try:
        flood(root / "u0_c", 2000)
        moved = root.parent / "elsewhere"
        moved.mkdir()
        os.rename(root / "u1_c" / "x.cache", moved / "x.cache")
        os.rmdir(root / "u1_c")  # its watch ends: DELETE_SELF, IGNORED, behind the flood
        fallback = pair.watched._watch.drain()
        assert fallback == "flood"
        assert not pair.watched._watch.watching("u1_c")
        assert pair.watched._watch.watching("u0_c")
    finally:
        pair.close()


async def test_a_small_watch_cap_leaves_the_rest_on_lstat(
    root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in NAMES:
        container(root, name, "x.cache")
    made, rejects, _ = lister(root, max_watches=1)
    try:
        await made.update()
        await made.update()
        assert made.watched_directories == 1
        assert made.unwatched_directories == 2
        stats = Stats(monkeypatch)
        await made.update()
        assert stats.reset() == 2  # the two without a watch
        write_region(root / "u2_c" / "new", RegionSpec(priority=5))
        os.replace(root / "u2_c" / "new", root / "u2_c" / "x.cache")
        view = await made.update()
        assert rejects.seen == ["replaced"]
        assert view[ContainerKey("u2", "c")].snapshot.priority == 5  # type: ignore[union-attr]
        # the watched one goes (forgotten at the end of the tick that misses it): another
        # takes its place at its next lstat
        shutil.rmtree(root / "u0_c")
        await made.update()
        await made.update()
        assert made.watched_directories == kernel_watches(made) == 1
        assert made.unwatched_directories == 1
    finally:
        made.close()


async def test_without_inotify_the_lister_works_on_lstat_and_tries_again_later(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in NAMES:
        container(root, name, "x.cache")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(inotify_simple, "INotify", refuse)
    made, rejects, fallbacks = lister(root)
    try:
        with caplog.at_level(logging.WARNING, logger="hami_trio.monitor.watch"):
            for _ in range(3):
                await made.update()
        assert len([r for r in caplog.records if "inotify instance" in r.getMessage()]) == 1
        assert made.watched_directories == 0
        assert made.unwatched_directories == len(NAMES)
        stats = Stats(monkeypatch)
        write_region(root / "u1_c" / "new", RegionSpec(priority=6))
        os.replace(root / "u1_c" / "new", root / "u1_c" / "x.cache")
        view = await made.update()
        assert stats.reset() == len(NAMES)
        assert rejects.seen == ["replaced"]
        assert view[ContainerKey("u1", "c")].snapshot.priority == 6  # type: ignore[union-attr]
        monkeypatch.undo()  # inotify is back: the lister picks it up within RETRY_TICKS
        for _ in range(RETRY_TICKS + 1):
            await made.update()
        assert made.watched_directories == len(NAMES)
        assert fallbacks.seen == []
    finally:
        made.close()


async def test_a_node_out_of_watches_leaves_each_container_on_lstat(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in NAMES:
        container(root, name, "x.cache")

    def no_space(self: Any, path: Any, mask: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(inotify_simple.INotify, "add_watch", no_space)
    made, _, _ = lister(root)
    try:
        with caplog.at_level(logging.WARNING, logger="hami_trio.monitor.watch"):
            for _ in range(3):
                view = await made.update()
        assert all(s.status is ContainerStatus.LOADED for s in view.values())
        assert made.watched_directories == 0
        assert made.unwatched_directories == len(NAMES)
        assert len([r for r in caplog.records if "max_user_watches" in r.getMessage()]) == 1
    finally:
        made.close()


async def test_watches_follow_handles_without_leaking(root: Path, tmp_path: Path) -> None:
    pair, outside = await settled(root, tmp_path)
    try:
        for serial in range(10):  # re-opened every tick: the old watch goes each time
            perform(root, 0, "rename_over", outside, serial)
            perform(root, 1, ("fifo", "unlink_create")[serial % 2], outside, serial)
            await pair.tick()
            assert pair.watched.watched_directories == kernel_watches(pair.watched)
        assert pair.watched.watched_directories == 3
    finally:
        pair.close()
    assert pair.watched.watched_directories == 0


async def test_a_gone_pods_directory_loses_its_watch_before_removal(root: Path) -> None:
    container(root, "gone_c", "x.cache")
    container(root, "live_c", "x.cache")
    pods = StaticPodSource([PodInfo(uid="live", namespace="n", name="p", containers=("c",))])
    made = ContainerLister(root, pods, resync_interval=0.0)
    try:
        await made.update()
        assert made.watched_directories == 1  # the gone pod's was never read: expired
        assert made.removals.pending == 1
        while await made.removals.step():
            pass
        assert not (root / "gone_c").exists()
        await made.update()
        assert made.watched_directories == kernel_watches(made) == 1
    finally:
        made.close()


async def test_a_replaced_containers_directory_checks_everything(
    root: Path, tmp_path: Path
) -> None:
    pair, _ = await settled(root, tmp_path)
    try:
        os.rename(root, tmp_path / "old-containers")
        os.mkdir(root)
        container(root, "u0_c", "x.cache", priority=8)
        view = await pair.tick()
        assert "root" in pair.fallbacks.seen
        assert view[ContainerKey("u0", "c")].snapshot.priority == 8
        assert list(view) == [ContainerKey("u0", "c")]
    finally:
        pair.close()


# -- the watch alone -----------------------------------------------------------------------------


@given(stream=event_streams())
def test_events_are_parsed_to_the_watches_they_name(stream: tuple[bytes, list[Any]]) -> None:
    data, events = stream
    parsed = parse_events(data)
    overflow = int(inotify_simple.flags.Q_OVERFLOW)
    ignored = int(inotify_simple.flags.IGNORED)
    assert parsed.lost == any(mask & overflow for _, mask in events)
    assert parsed.ignored == {wd for wd, mask in events if mask == ignored}
    assert parsed.wds == {wd for wd, mask in events if mask not in (ignored, overflow)}
    if data:
        assert parse_events(data[:-1]).lost  # a record cut short: events lost


def test_a_deleted_directory_ends_its_watch_and_unknown_watches_are_harmless(
    tmp_path: Path,
) -> None:
    watch = DirectoryWatch(8)
    watch.drain()  # opens the instance
    directories = [tmp_path / "a", tmp_path / "b"]
    for directory in directories:
        directory.mkdir()
        fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            assert watch.add(directory.name, fd)
        finally:
            os.close(fd)
    watch.remove("b")  # its IN_IGNORED comes with a number nobody holds now
    os.rmdir(directories[0])
    assert watch.drain() is None
    assert not watch.watching("a")
    assert not watch.watching("b")
    assert watch.watched == 0
    assert not watch.quiet("a")
    watch.close()


def test_a_watch_is_trusted_only_after_an_lstat_in_a_later_tick(tmp_path: Path) -> None:
    """What happened between the directory's lookup and its watch is no event: one lstat
    after a later drain must find the file at its name first."""
    watch = DirectoryWatch(8)
    watch.drain()
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert watch.add("d", fd)
    finally:
        os.close(fd)
    watch.confirm("d")  # the same tick it was added in: not enough
    watch.drain()
    assert not watch.quiet("d")
    watch.confirm("d")
    watch.drain()
    assert watch.quiet("d")
    (tmp_path / "new").touch()
    watch.drain()
    assert not watch.quiet("d")  # an event: the lstat path ...
    watch.drain()
    assert not watch.quiet("d")  # ... until it happened (a cancelled tick did not get to it)
    watch.confirm("d")
    watch.drain()
    assert watch.quiet("d")  # quiet again after it
    watch.close()


async def test_the_monitor_exports_its_watches_and_fallbacks(hook: Path) -> None:
    root = hook / "containers"
    root.mkdir(exist_ok=True)
    for name in NAMES:
        container(root, name, "x.cache")
    registry = CollectorRegistry()
    config = MonitorConfig(hook_path=hook, mig_lock_path=hook / "lock" / "mig.lock")
    monitor = Monitor(config, pod_source=StaticPodSource(), registry=registry)
    try:
        await monitor.tick()
        assert registry.get_sample_value("hami_trio_monitor_watched_directories") == 3
        assert registry.get_sample_value("hami_trio_monitor_unwatched_directories") == 0
        flood(root / "u0_c", 5000)
        await monitor.tick()
        counted = {
            reason: registry.get_sample_value(
                "hami_trio_monitor_watch_fallbacks_total", {"reason": reason}
            )
            for reason in WATCH_FALLBACKS
        }
        assert counted == {"overflow": 0, "flood": 1, "error": 0, "root": 0}
    finally:
        monitor.close()


async def test_an_event_read_by_a_cancelled_tick_is_answered_by_the_next(root: Path) -> None:
    """The drain at the start of a tick consumes the queue; a tick cancelled before it got to
    a directory must leave that directory's event pending, or the replacement is lost."""
    names = [f"u{i:03d}_c" for i in range(CHECKPOINT_EVERY + 2)]
    for name in names:
        container(root, name, "x.cache")
    made, rejects, _ = lister(root)
    try:
        await made.update()
        await made.update()
        last = root / names[-1]  # listed after the tick's first checkpoint
        write_region(last / "new", RegionSpec(priority=6))
        os.replace(last / "new", last / "x.cache")
        with trio.CancelScope() as scope:
            scope.cancel()  # taken at the first checkpoint: the last directories are not read
            await made.update()
        assert scope.cancelled_caught
        assert rejects.seen == []
        view = await made.update()
        assert rejects.seen == ["replaced"]
        state = view[ContainerKey(names[-1][:4], "c")]
        assert state.snapshot is not None
        assert state.snapshot.priority == 6
    finally:
        made.close()
