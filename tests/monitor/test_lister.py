"""ContainerLister: discovery, HAMi's loadCache/Update cases, cleanup, identity checks."""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
from pathlib import Path

import pytest
import trio

from hami_trio.monitor.feedback import Write
from hami_trio.monitor.layout import LAYOUTS, ControlField, Format, RejectReason
from hami_trio.monitor.lister import (
    CHECKPOINT_EVERY,
    INITIALISING_TICKS,
    MAX_DIR_ENTRIES,
    ContainerLister,
)
from hami_trio.monitor.remover import Budget
from hami_trio.monitor.state import ContainerKey, ContainerStatus, parse_container_dirname
from hami_trio.pods.source import PodInfo, PodSource, StaticPodSource
from hami_trio.testing.regions import RegionSpec, SimulatedWorkload, region_pieces, write_region

V1 = LAYOUTS[Format.V1]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "containers"
    path.mkdir()
    return path


def container(root: Path, name: str, *files: str, priority: int = 1) -> Path:
    directory = root / name
    directory.mkdir()
    for file in files:
        write_region(directory / file, RegionSpec(priority=priority, uuids=["GPU-0"]))
    return directory


class Calls:
    """Records what a callback was called with."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, reason: str) -> None:
        self.seen.append(reason)


def make(root: Path, source: PodSource | None = None, **kw: object) -> ContainerLister:
    return ContainerLister(root, source or StaticPodSource(), **kw)  # type: ignore[arg-type]


class SwitchablePods:
    """A PodSource whose pods a test replaces between ticks (the pods change under it)."""

    def __init__(self, now: StaticPodSource) -> None:
        self.now = now

    @property
    def ready(self) -> bool:
        return self.now.ready

    @property
    def authoritative(self) -> bool:
        return self.now.authoritative

    def lookup(self, uid: str) -> PodInfo | None:
        return self.now.lookup(uid)


def key(name: str) -> ContainerKey:
    parsed = parse_container_dirname(name)
    assert parsed is not None
    return parsed


def test_dirname_split_on_the_first_underscore() -> None:
    assert parse_container_dirname("uid_ctr") == ContainerKey("uid", "ctr")
    assert parse_container_dirname("uid_ctr_with_more") == ContainerKey("uid", "ctr_with_more")
    assert parse_container_dirname("uid_ctr_with_more").dirname == "uid_ctr_with_more"  # type: ignore[union-attr]
    for bad in ("nodashes", "uid_", "_ctr", "_"):
        assert parse_container_dirname(bad) is None


# -- HAMi's loadCache cases, at the directory level -----------------------------------------


async def test_too_many_files_is_an_error_for_that_directory(root: Path) -> None:
    directory = container(root, "u_c")
    for name in ("a.cache", "b.cache", "c.cache"):
        (directory / name).write_bytes(b"x")
    rejections = Calls()
    state = (await make(root, on_reject=rejections).update())[key("u_c")]
    assert state.status is ContainerStatus.REJECTED
    assert state.rejection is not None
    assert state.rejection.reason is RejectReason.TOO_MANY_FILES
    assert rejections.seen == ["too_many_files"]


async def test_libvgpu_and_cache_count_together(root: Path) -> None:
    directory = container(root, "u_c", "x.cache")
    (directory / "libvgpu.so").write_bytes(b"x")
    (directory / "libvgpu.so.1").write_bytes(b"x")
    state = (await make(root).update())[key("u_c")]
    assert state.rejection is not None
    assert state.rejection.reason is RejectReason.TOO_MANY_FILES


async def test_a_directory_with_too_many_entries_is_not_scanned_to_the_end(root: Path) -> None:
    directory = container(root, "u_c")
    for i in range(MAX_DIR_ENTRIES + 1):
        (directory / f"f{i:05d}").touch()
    state = (await make(root).update())[key("u_c")]
    assert state.rejection is not None
    assert state.rejection.reason is RejectReason.TOO_MANY_FILES
    assert f"more than {MAX_DIR_ENTRIES} entries" in state.rejection.message


async def test_unrelated_files_and_cache_suffix_in_the_middle_are_ignored(root: Path) -> None:
    directory = container(root, "u_c", "x.cache")
    for name in ("notes.txt", "debug.log", "debug.cache.bak", "trace.cache.tmp"):
        (directory / name).write_bytes(b"x")
    state = (await make(root).update())[key("u_c")]
    assert state.status is ContainerStatus.LOADED
    assert state.cache_file == "x.cache"


async def test_empty_directory_and_no_matching_file_mean_no_cuinit_yet(root: Path) -> None:
    container(root, "u1_c")
    other = container(root, "u2_c")
    (other / "libvgpu.so").write_bytes(b"x")
    (other / "notes.txt").write_bytes(b"x")
    view = await make(root).update()
    assert view[key("u1_c")].status is ContainerStatus.NO_CACHE_FILE
    assert view[key("u2_c")].status is ContainerStatus.NO_CACHE_FILE
    assert view[key("u2_c")].snapshot is None


async def test_first_cache_file_by_name_is_chosen(root: Path) -> None:
    directory = container(root, "u_c")
    write_region(directory / "b.cache", RegionSpec(priority=2))
    write_region(directory / "a.cache", RegionSpec(priority=1))
    state = (await make(root).update())[key("u_c")]
    assert state.cache_file == "a.cache"
    assert state.snapshot is not None
    assert state.snapshot.priority == 1


@pytest.mark.parametrize(
    ("content", "size", "reason"),
    [
        (b"tiny", 4, RejectReason.TOO_SMALL),
        (b"\x01" * 12, 64, RejectReason.MAGIC),
        (struct.pack("<iii", 19920718, 1, 1), 2008985, RejectReason.UNKNOWN_VERSION),
    ],
)
async def test_bad_files_are_rejected_per_container(
    root: Path, content: bytes, size: int, reason: RejectReason
) -> None:
    directory = container(root, "bad_c")
    (directory / "x.cache").write_bytes(content)
    os.truncate(directory / "x.cache", size)
    container(root, "good_c", "x.cache")
    view = await make(root).update()
    rejection = view[key("bad_c")].rejection
    assert rejection is not None
    assert rejection.reason is reason
    assert view[key("good_c")].status is ContainerStatus.LOADED


@pytest.mark.parametrize("fmt", list(Format))
async def test_v0_and_v1_files_load(root: Path, fmt: Format) -> None:
    directory = container(root, "u_c")
    write_region(directory / "x.cache", RegionSpec(format=fmt, num=2, limits=[1, 2]))
    lister = make(root)
    state = (await lister.update())[key("u_c")]
    assert state.snapshot is not None
    assert state.snapshot.format is fmt
    assert state.snapshot.device_count == 2
    usage = lister.handles()[key("u_c")].read_usage()
    assert usage.format is fmt
    assert [d.memory_limit for d in usage.devices] == [1, 2]


# -- HAMi's Update cases ---------------------------------------------------------------------


async def test_missing_containers_dir_is_an_empty_view(tmp_path: Path) -> None:
    lister = make(tmp_path / "missing")
    assert await lister.update() == {}
    assert lister.containers() == {}


async def test_non_directory_entries_are_skipped(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (root / "stray-file").write_bytes(b"x")
    target = container(root, "real_c", "x.cache")
    (root / "link_c").symlink_to(target)
    lister = make(root)
    with caplog.at_level(logging.WARNING, logger="hami_trio.monitor.lister"):
        for _ in range(3):
            view = await lister.update()
    assert list(view) == [key("real_c")]
    assert sum("symlink 'link_c'" in r.getMessage() for r in caplog.records) == 1


async def test_malformed_names_are_skipped_with_one_warning_each(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("nodashes", "uid_"):
        container(root, name, "x.cache")
    lister = make(root)
    with caplog.at_level(logging.WARNING, logger="hami_trio.monitor.lister"):
        for _ in range(3):
            assert await lister.update() == {}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'nodashes'" in m for m in messages) == 1
    assert sum("'uid_'" in m for m in messages) == 1


async def test_new_container_has_pod_uid_and_container_name(root: Path) -> None:
    container(root, "uid4_mycontainer", "x.cache")
    pod = PodInfo(uid="uid4", namespace="ns", name="p", containers=("mycontainer",))
    state = (await make(root, StaticPodSource([pod])).update())[key("uid4_mycontainer")]
    assert (state.pod_uid, state.container_name) == ("uid4", "mycontainer")
    assert state.directory == str(root / "uid4_mycontainer")


async def test_tracked_entry_keeps_its_handle_and_state_object(root: Path) -> None:
    container(root, "u_c", "x.cache")
    lister = make(root)
    first = (await lister.update())[key("u_c")]
    handle = lister.handle_of("u_c")
    second = (await lister.update())[key("u_c")]
    assert lister.handle_of("u_c") is handle
    assert second is first  # nothing changed: the same immutable state


async def test_recently_modified_dir_of_unknown_pod_is_kept(root: Path) -> None:
    container(root, "gone_c", "x.cache")
    lister = make(root, StaticPodSource([]), resync_interval=300)
    view = await lister.update()
    assert (root / "gone_c").is_dir()
    assert view[key("gone_c")].status is ContainerStatus.LOADED


async def test_old_dir_of_unknown_pod_is_removed_and_its_handle_closed(root: Path) -> None:
    directory = container(root, "gone_c", "x.cache")
    container(root, "live_c", "x.cache")
    source = SwitchablePods(StaticPodSource([PodInfo(uid="gone", namespace="n", name="p")]))
    lister = make(root, source, resync_interval=300)
    await lister.update()
    handle = lister.handle_of("gone_c")
    assert handle is not None
    source.now = StaticPodSource([PodInfo(uid="live", namespace="n", name="q")])
    old = time.time() - 301
    os.utime(directory, (old, old))
    view = await lister.update()
    assert list(view) == [key("live_c")]
    assert handle.closed
    assert directory.exists()  # the tick only schedules the removal
    assert lister.removals.pending == 1
    assert await lister.removals.step() is False
    assert not directory.exists()
    assert lister.removals.pending == 0


async def test_removal_runs_a_budget_per_step_and_the_tick_never_looks_at_it(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = container(root, "gone_c", "x.cache")
    for index in range(100):
        (directory / f"junk{index}").touch()
    container(root, "live_c", "x.cache")
    old = time.time() - 1000
    os.utime(directory, (old, old))
    outcomes: list[str] = []
    lister = make(
        root,
        StaticPodSource([PodInfo(uid="live", namespace="n", name="q")]),
        resync_interval=60,
        on_removal=outcomes.append,
        removal_budget=Budget(ops=10),
    )
    caplog.set_level(logging.INFO, logger="hami_trio.monitor.lister")  # scheduled
    caplog.set_level(logging.INFO, logger="hami_trio.monitor.remover")  # removed
    steps = 0
    while directory.exists():
        # The directory's mtime is fresh again after the first step: a tick that looked at
        # it now would keep it (and read its file); it does neither.
        view = await lister.update()
        assert list(view) == [key("live_c")]
        assert "gone_c" not in lister.tracked_names()
        # Nothing is written for it while it is being removed.
        lister.apply([Write(key("gone_c"), ControlField.RECENT_KERNEL, -1)])
        await lister.removals.step()
        steps += 1
        assert steps < 100
        # Between two steps the unfinished removal keeps its descriptors open.
        assert lister.removals.in_progress == directory.exists()
    assert steps >= 10
    assert outcomes == ["removed"]
    assert lister.removals.pending == 0
    assert not lister.removals.in_progress
    assert "removing " in caplog.text
    assert f"removed {directory}" in caplog.text


async def test_a_removal_that_fails_is_counted_logged_and_decided_again(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = container(root, "gone_c", "x.cache")
    old = time.time() - 1000
    os.utime(directory, (old, old))
    outcomes: list[str] = []
    lister = make(root, StaticPodSource([]), resync_interval=60, on_removal=outcomes.append)
    await lister.update()
    # The containers directory goes away under the remover: the step fails, not the agent.
    moved = root.parent / "elsewhere"
    os.rename(root, moved)
    assert await lister.removals.step() is False
    assert outcomes == ["failed"]
    assert "cannot open the containers directory" in caplog.text
    os.rename(moved, root)
    await lister.update()  # still gone and old: scheduled again, under the same rules
    assert lister.removals.pending == 1
    await lister.removals.step()
    assert outcomes == ["failed", "removed"]
    assert not directory.exists()


async def test_without_kubernetes_nothing_is_ever_deleted(root: Path) -> None:
    directory = container(root, "any_c", "x.cache")
    old = time.time() - 10 * 86400
    os.utime(directory, (old, old))
    view = await make(root, StaticPodSource(), resync_interval=0).update()
    assert directory.is_dir()
    assert view[key("any_c")].status is ContainerStatus.LOADED


async def test_removal_never_follows_a_symlink_inside(root: Path, tmp_path: Path) -> None:
    precious = tmp_path / "host"
    precious.mkdir()
    (precious / "data").write_text("keep")
    directory = container(root, "gone_c", "x.cache")
    (directory / "escape").symlink_to(precious)
    old = time.time() - 1000
    os.utime(directory, (old, old))
    lister = make(root, StaticPodSource([]), resync_interval=60)
    await lister.update()
    await lister.removals.step()
    assert not directory.exists()
    assert (precious / "data").read_text() == "keep"


async def test_vanished_directory_closes_its_handle(root: Path) -> None:
    directory = container(root, "u_c", "x.cache")
    lister = make(root)
    await lister.update()
    handle = lister.handle_of("u_c")
    assert handle is not None
    (directory / "x.cache").unlink()
    directory.rmdir()
    assert await lister.update() == {}
    assert handle.closed
    assert "u_c" not in lister.tracked_names()


# -- identity and rejection bookkeeping -----------------------------------------------------


async def test_replaced_file_is_detected_counted_and_reloaded(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = container(root, "u_c", "x.cache", priority=1)
    rejections = Calls()
    lister = make(root, on_reject=rejections)
    await lister.update()
    old = lister.handle_of("u_c")
    write_region(directory / "new", RegionSpec(priority=9))
    os.replace(directory / "new", directory / "x.cache")
    with caplog.at_level(logging.WARNING, logger="hami_trio.monitor.lister"):
        state = (await lister.update())[key("u_c")]
    assert state.snapshot is not None
    assert state.snapshot.priority == 9
    assert old is not None
    assert old.closed
    assert rejections.seen == ["replaced"]
    assert any("u_c" in r.getMessage() and "replaced" in r.getMessage() for r in caplog.records)


async def test_rejection_counted_once_and_recovery_logged(root: Path) -> None:
    directory = container(root, "u_c")
    (directory / "x.cache").write_bytes(b"\0" * 64)
    rejections = Calls()
    lister = make(root, on_reject=rejections)
    # Magic 0: HAMi-core may still be initialising it - no rejection for a tick or two.
    for _ in range(INITIALISING_TICKS):
        state = (await lister.update())[key("u_c")]
        assert state.status is ContainerStatus.NO_CACHE_FILE
    assert rejections.seen == []
    for _ in range(3):
        state = (await lister.update())[key("u_c")]
        assert state.status is ContainerStatus.REJECTED
    assert rejections.seen == ["magic"]
    # HAMi-core finishes initialising (it writes the magic last): same file, now valid.
    fd = os.open(directory / "x.cache", os.O_WRONLY)
    try:
        spec = RegionSpec(priority=4)
        for offset, piece in region_pieces(spec):
            os.pwrite(fd, piece, offset)
        os.ftruncate(fd, spec.file_size)
    finally:
        os.close(fd)
    state = (await lister.update())[key("u_c")]
    assert state.snapshot is not None
    assert state.snapshot.priority == 4
    assert rejections.seen == ["magic"]


async def test_a_file_initialised_within_a_tick_or_two_is_never_rejected(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = container(root, "u_c")
    spec = RegionSpec(priority=3)
    path = directory / "x.cache"
    # HAMi-core creates the file and sizes it; the magic comes last.
    path.write_bytes(b"")
    os.truncate(path, spec.file_size)
    rejections = Calls()
    lister = make(root, on_reject=rejections)
    with caplog.at_level(logging.INFO, logger="hami_trio.monitor"):
        state = (await lister.update())[key("u_c")]
        assert state.status is ContainerStatus.NO_CACHE_FILE
        assert state.rejection is None
        write_region(path, spec)
        state = (await lister.update())[key("u_c")]
    assert state.snapshot is not None
    assert state.snapshot.priority == 3
    assert rejections.seen == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_view_is_immutable_and_replaced_whole(root: Path) -> None:
    container(root, "u_c", "x.cache")
    lister = make(root)
    view = await lister.update()
    with pytest.raises(TypeError):
        view[key("x_y")] = view[key("u_c")]  # type: ignore[index]
    container(root, "v_c", "x.cache")
    new_view = await lister.update()
    assert list(view) == [key("u_c")]
    assert list(new_view) == [key("u_c"), key("v_c")]
    assert lister.containers() is new_view


async def test_cancelled_update_publishes_nothing(root: Path) -> None:
    for i in range(CHECKPOINT_EVERY + 5):
        container(root, f"u{i:03d}_c", "x.cache")
    lister = make(root)
    with trio.CancelScope() as scope:
        scope.cancel()
        await lister.update()
    assert scope.cancelled_caught
    assert lister.containers() == {}
    assert len(await lister.update()) == CHECKPOINT_EVERY + 5


async def test_apply_writes_through_the_handle_and_skips_unknown(root: Path) -> None:
    directory = container(root, "u_c", "x.cache")
    lister = make(root)
    await lister.update()
    written = lister.apply(
        [
            Write(key("u_c"), ControlField.RECENT_KERNEL, -1),
            Write(key("u_c"), ControlField.UTILIZATION_SWITCH, 1),
            Write(key("other_c"), ControlField.RECENT_KERNEL, -1),
        ]
    )
    assert written == 2
    assert SimulatedWorkload(directory / "x.cache").read_control() == (-1, 1)
    os.truncate(directory / "x.cache", 10)
    assert lister.apply([Write(key("u_c"), ControlField.RECENT_KERNEL, 0)]) == 0
    assert (directory / "x.cache").stat().st_size == 10
    lister.close()
    assert lister.tracked_names() == frozenset()


async def test_out_of_descriptors_keeps_the_last_view(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    container(root, "a_c", "x.cache", priority=1)
    b = container(root, "b_c", "x.cache", priority=1)
    exhausted = Calls()
    lister = make(root, on_no_descriptors=lambda: exhausted("emfile"))
    view = await lister.update()
    assert len(view) == 2
    handle = lister.handle_of("a_c")
    real_open, real_scandir = os.open, os.scandir
    mode = ["all"]

    def fake_open(path: object, *args: object, **kwargs: object) -> int:
        if mode[0] == "all" or (mode[0] == "not-root" and os.fspath(path) != str(root)):  # type: ignore[call-overload]
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    def fake_scandir(path: object) -> object:
        if mode[0] == "scandir":
            raise OSError(errno.ENFILE, os.strerror(errno.ENFILE))
        return real_scandir(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "scandir", fake_scandir)
    # The containers directory cannot be opened: the view and every handle stay.
    assert await lister.update() is view
    assert lister.handle_of("a_c") is handle
    assert handle is not None
    assert not handle.closed
    # Or not listed.
    mode[0] = "scandir"
    assert await lister.update() is view
    # A container that must be opened again keeps its last state; a new one has none, and
    # is refused for what happened.
    mode[0] = ""
    write_region(b / "new", RegionSpec(priority=9))
    os.replace(b / "new", b / "x.cache")
    container(root, "c_c")
    (root / "c_c" / "x.cache").write_bytes(b"\0" * 64)
    mode[0] = "not-root"
    now = await lister.update()
    assert now[key("a_c")] is view[key("a_c")]
    assert now[key("b_c")] is view[key("b_c")]  # not refused: nothing is wrong with it
    rejection = now[key("c_c")].rejection
    assert rejection is not None
    assert rejection.reason is RejectReason.IO_ERROR
    assert "Too many open files" in rejection.message
    assert len(exhausted.seen) == 3
    # Descriptors again: the replaced file is read.
    mode[0] = ""
    state = (await lister.update())[key("b_c")]
    assert state.snapshot is not None
    assert state.snapshot.priority == 9
    lister.close()
