"""TreeRemover and the Monitor's removal of gone pods' directories, attacked for real.

Every test builds real trees (real directories, files, symlinks, FIFOs, mounts) and runs the
real remover or the real Monitor over them.  Deep trees are built with ``mkdirat`` on
descriptors (their paths exceed PATH_MAX) and cleaned up with the remover itself: pytest's
own ``tmp_path`` clean-up is ``shutil.rmtree``, which is exactly what crashed here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from hami_trio.monitor.lister import ContainerLister
from hami_trio.monitor.loop import Monitor, MonitorConfig
from hami_trio.monitor.remover import (
    MAX_DEPTH,
    MOVED_PREFIX,
    Budget,
    QueuedStep,
    RemovalQueue,
    TreeRemover,
    remove_queued,
)
from hami_trio.pods.source import PodInfo, StaticPodSource
from hami_trio.testing.regions import RegionSpec, write_region

UNLIMITED = Budget(ops=10**9, seconds=1e6)


def fill_with_files(directory: Path, count: int) -> None:
    """``count`` empty files with 40-character names, created through one descriptor."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for index in range(count):
            os.close(os.open(f"{index:040d}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def chain(parent: Path, depth: int, name: str = "d") -> None:
    """``parent/d/d/d/...`` ``depth`` levels deep (built by descriptor: no path limit)."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def make_old(path: Path) -> None:
    old = time.time() - 3600
    os.utime(path, (old, old))


def remove_all(path: Path) -> None:
    """Remove ``path`` whatever its depth (teardown helper)."""
    if not os.path.lexists(path):
        return
    remover = TreeRemover(path.parent, path.name)
    try:
        while not remover.step(UNLIMITED):
            pass
    finally:
        remover.close()


def snapshot(path: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``path`` with its mode, inode and (for files) contents."""
    seen: dict[str, tuple[int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            data = (
                Path(full).read_bytes()
                if os.path.isfile(full) and not os.path.islink(full)
                else b""
            )
            seen[os.path.relpath(full, path)] = (st.st_mode, st.st_ino, data)
    return seen


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """Where the trees go: a tmpfs (``/dev/shm``) when there is one - building 200,000 files
    on this machine's ext4 takes minutes, on tmpfs a second - else ``tmp_path``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="hami-trio-remover-", dir=shm))
    else:  # pragma: no cover - machines without /dev/shm
        path = tmp_path / "trees"
        path.mkdir()
    yield path
    remove_all(path)


@pytest.fixture
def containers(base: Path) -> Path:
    path = base / "hook" / "containers"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def outside(base: Path) -> Path:
    """A host directory next to the containers directory that nothing may touch."""
    path = base / "host"
    path.mkdir()
    (path / "keep").write_text("precious")
    (path / "sub").mkdir()
    (path / "sub" / "deeper").write_text("also precious")
    os.mkfifo(path / "fifo")
    return path


def run_to_end(remover: TreeRemover, budget: Budget, max_steps: int = 100_000) -> int:
    steps = 0
    while not remover.step(budget):
        steps += 1
        assert steps < max_steps, "the removal does not end"
    return steps


# -- the pure core ---------------------------------------------------------------------------


def test_removes_files_links_fifos_and_subdirectories(containers: Path, outside: Path) -> None:
    top = containers / "gone_c"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    (top / "file").write_text("y")
    (top / "to_outside_dir").symlink_to(outside)
    (top / "to_outside_file").symlink_to(outside / "keep")
    (top / "dangling").symlink_to(top / "nope")
    os.mkfifo(top / "fifo")
    os.link(outside / "keep", top / "hardlink")
    before = snapshot(outside)
    remover = TreeRemover(containers, "gone_c", expect_ino=top.stat().st_ino)
    try:
        run_to_end(remover, Budget(ops=3))
    finally:
        remover.close()
    assert remover.outcome == "removed"
    assert remover.failures == 0
    assert not os.path.lexists(top)
    assert snapshot(outside) == before
    assert (outside / "keep").read_text() == "precious"


def test_a_budget_bounds_each_step_and_the_next_one_resumes(containers: Path) -> None:
    top = containers / "gone_c"
    top.mkdir()
    for index in range(500):
        (top / f"f{index}").touch()
    remover = TreeRemover(containers, "gone_c")
    removed = []
    try:
        while not remover.step(Budget(ops=50)):
            removed.append(remover.removed)
    finally:
        remover.close()
    steps = [b - a for a, b in zip([0, *removed], removed, strict=False)]
    assert len(removed) >= 9
    assert max(steps) <= 50
    assert remover.outcome == "removed"
    assert not top.exists()


def test_a_5000_deep_chain_needs_bounded_descriptors_and_memory(containers: Path) -> None:
    top = containers / "gone_c"
    top.mkdir()
    chain(top, 5000)
    baseline = open_fds()
    remover = TreeRemover(containers, "gone_c")
    peak_fds = 0
    tracemalloc.start()
    try:
        while not remover.step(Budget(ops=500)):
            peak_fds = max(peak_fds, open_fds() - baseline)
            assert remover.open_directories <= MAX_DEPTH
        _, peak_memory = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        remover.close()
    assert remover.outcome == "removed"
    assert not top.exists()
    # Two descriptors per open directory and the containers directory's.
    assert peak_fds <= 2 * MAX_DEPTH + 1
    assert peak_memory < 256 * 1024, peak_memory
    assert open_fds() == baseline


def test_a_directory_of_50000_files_is_never_listed_into_memory(containers: Path) -> None:
    top = containers / "gone_c"
    top.mkdir()
    fill_with_files(top, 50_000)
    remover = TreeRemover(containers, "gone_c")
    tracemalloc.start()
    try:
        run_to_end(remover, Budget(ops=5000))
        _, peak_memory = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        remover.close()
    assert remover.outcome == "removed"
    # rmtree's listing of these names alone is about 50,000 * 175 bytes (8.7 MB).
    assert peak_memory < 256 * 1024, peak_memory


@pytest.mark.parametrize("swap", ["symlink_to_outside_dir", "fifo", "symlink_to_fifo"])
def test_a_directory_swapped_after_it_was_listed_is_never_followed(
    containers: Path, outside: Path, swap: str
) -> None:
    """The attack: the walk has listed ``victim`` as a directory (and paused on its budget);
    the tenant replaces it before it is opened.  The old ``open(O_RDONLY)`` followed the
    link or blocked on the FIFO for ever."""
    top = containers / "gone_c"
    (top / "victim").mkdir(parents=True)
    before = snapshot(outside)
    remover = TreeRemover(containers, "gone_c")
    try:
        assert not remover.step(Budget(ops=1))  # listed "victim" (a directory), not handled
        (top / "victim").rmdir()
        if swap == "symlink_to_outside_dir":
            (top / "victim").symlink_to(outside)
        elif swap == "fifo":
            os.mkfifo(top / "victim")
        else:
            (top / "victim").symlink_to(outside / "fifo")
        done = threading.Event()

        def finish() -> None:
            run_to_end(remover, Budget(ops=1))
            done.set()

        worker = threading.Thread(target=finish, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert done.is_set(), "the remover hangs on what was swapped in"
    finally:
        remover.close()
    assert remover.outcome == "removed"
    assert not os.path.lexists(top)
    assert snapshot(outside) == before


def test_a_tenant_swapping_names_while_it_runs_touches_nothing_outside(
    containers: Path, outside: Path
) -> None:
    """A process of the gone pod keeps replacing entries (directory, symlink to the host,
    FIFO) while the removal runs: no hang, nothing outside touched, and once it stops the
    removal ends."""
    top = containers / "gone_c"
    top.mkdir()
    for index in range(40):
        (top / f"dir{index}" / "inner").mkdir(parents=True)
        (top / f"dir{index}" / "inner" / "f").touch()
    before = snapshot(outside)
    stop = threading.Event()

    def tenant() -> None:
        turn = 0
        while not stop.is_set():
            victim = top / f"dir{turn % 40}"
            turn += 1
            for kind in ("symlink", "fifo", "dir"):
                try:
                    if kind == "symlink":
                        victim.symlink_to(outside)
                    elif kind == "fifo":
                        os.mkfifo(victim)
                    else:
                        victim.mkdir()
                except FileNotFoundError:
                    return  # the top is gone
                except OSError:
                    pass
                try:
                    if victim.is_symlink() or not victim.is_dir():
                        victim.unlink()
                    else:
                        victim.rmdir()
                except OSError:
                    pass

    attacker = threading.Thread(target=tenant, daemon=True)
    remover = TreeRemover(containers, "gone_c")
    attacker.start()
    try:
        for _ in range(200):
            remover.step(Budget(ops=5))
        stop.set()
        attacker.join(timeout=10)
        assert not attacker.is_alive()
        while remover.outcome != "removed":
            if remover.step(UNLIMITED) and remover.outcome == "failed":
                remover.close()  # the lister starts again the same way: a new remover
                remover = TreeRemover(containers, "gone_c")
    finally:
        stop.set()
        remover.close()
    assert not os.path.lexists(top)
    assert snapshot(outside) == before


def test_a_tree_replaced_since_it_was_listed_is_refused(containers: Path) -> None:
    top = containers / "gone_c"
    top.mkdir()
    listed = top.stat().st_ino
    top.rmdir()
    top.mkdir()
    (top / "f").touch()
    (containers / "spacer").mkdir()  # keeps the old inode from being reused at once
    remover = TreeRemover(containers, "gone_c", expect_ino=listed)
    try:
        if top.stat().st_ino == listed:  # pragma: no cover - inode reused anyway
            pytest.skip("the file system reused the inode")
        assert remover.step(UNLIMITED)
    finally:
        remover.close()
    assert remover.outcome == "failed"
    failures, _ = remover.drain_failures()
    assert "replaced" in failures[0].reason
    assert (top / "f").exists()


def test_a_missing_tree_is_done_and_a_bad_name_is_refused(containers: Path) -> None:
    remover = TreeRemover(containers, "nothing_here")
    assert remover.step(UNLIMITED)
    assert remover.outcome == "removed"
    remover.close()
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError, match="not a directory entry name"):
            TreeRemover(containers, bad)
    with pytest.raises(ValueError, match="budget"):
        Budget(ops=0)


_MOUNTS = textwrap.dedent(
    """
    import os, subprocess, sys
    from pathlib import Path
    from hami_trio.monitor.remover import Budget, TreeRemover
    containers, outside = Path(sys.argv[1]), Path(sys.argv[2])
    top = containers / "gone_c"
    (top / "tmpfs").mkdir(parents=True)
    (top / "bind").mkdir()
    (top / "plain").mkdir()
    (top / "plain" / "f").touch()
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(top / "tmpfs")], check=True)
    (top / "tmpfs" / "inside").write_text("other fs")
    subprocess.run(["mount", "--bind", str(outside), str(top / "bind")], check=True)
    remover = TreeRemover(containers, "gone_c")
    while not remover.step(Budget(ops=7)):
        pass
    remover.close()
    failures, _ = remover.drain_failures()
    print(remover.outcome)
    for failure in failures:
        print(failure.path, "|", failure.reason)
    assert (top / "tmpfs" / "inside").read_text() == "other fs"
    assert (top / "bind" / "keep").read_text() == "precious"
    assert not (top / "plain").exists()
    """
)


@pytest.mark.root
def test_mount_points_inside_are_never_crossed(containers: Path, outside: Path) -> None:
    """A tmpfs (another st_dev) and a bind mount of a host directory on the same file system
    (same st_dev, another mount id) inside the tree: neither is entered, the rest goes."""
    before = snapshot(outside)
    done = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", _MOUNTS, str(containers), str(outside)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "failed"
    reasons = {line.split(" | ")[0].rsplit("/", 1)[1]: line.split(" | ")[1] for line in lines[1:]}
    assert "another file system" in reasons["tmpfs"]
    assert "another mount" in reasons["bind"]
    assert snapshot(outside) == before


_READ_ONLY = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from hami_trio.monitor.remover import Budget, TreeRemover
    containers = Path(sys.argv[1])
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "--bind", "-o", "ro", str(containers), str(containers)], check=True)
    remover = TreeRemover(containers, "gone_c", max_failures=50)
    while not remover.step(Budget(ops=100)):
        pass
    remover.close()
    failures, dropped = remover.drain_failures()
    print(remover.outcome, remover.failures, len(failures), dropped)
    print(failures[0].reason)
    """
)


@pytest.mark.root
def test_entries_that_cannot_be_removed_end_the_removal_as_failed(containers: Path) -> None:
    """Every unlink fails (a read-only mount): each failure is reported with its reason, the
    remembered failures are capped, and the removal ends instead of looping."""
    top = containers / "gone_c"
    (top / "sub").mkdir(parents=True)
    for index in range(200):
        (top / f"f{index}").touch()
    done = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", _READ_ONLY, str(containers)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    summary, reason = done.stdout.splitlines()
    outcome, failures, kept, dropped = summary.split()
    assert outcome == "failed"
    assert 50 < int(failures) <= 60
    assert int(kept) + int(dropped) == int(failures)
    assert "Read-only file system" in reason
    assert len(os.listdir(top)) == 201  # nothing was removed


def test_subtrees_below_the_depth_limit_are_moved_up_inside_the_tree(containers: Path) -> None:
    top = containers / "gone_c"
    top.mkdir()
    chain(top, 10)
    remover = TreeRemover(containers, "gone_c", max_depth=3)
    try:
        remover.step(Budget(ops=6))
        moved = [name for name in os.listdir(top) if name.startswith(MOVED_PREFIX)]
        assert moved  # the part below depth 3 now hangs off the top
        assert remover.open_directories <= 3
        run_to_end(remover, Budget(ops=2))
    finally:
        remover.close()
    assert remover.outcome == "removed"
    assert not top.exists()


# -- many trees per step ---------------------------------------------------------------------


def gone_container(containers: Path, name: str) -> int:
    """A container directory of the usual shape (two 2 MB ``.cache`` files, sparse); its
    inode, as the lister would have listed it."""
    directory = containers / name
    directory.mkdir()
    for file in ("a.cache", "b.cache"):
        write_region(directory / file, RegionSpec(uuids=["GPU-0"]))
    return directory.stat().st_ino


def test_one_step_removes_every_queued_tree_its_budget_covers(containers: Path) -> None:
    queued: list[tuple[str, int | None]] = [
        (f"gone{index:03d}_c", gone_container(containers, f"gone{index:03d}_c"))
        for index in range(300)
    ]
    baseline = open_fds()
    step = QueuedStep(str(containers), None, queued)
    remove_queued(step, Budget(seconds=60))  # 20,000 entries: 300 trees of 4 fit
    assert step.taken == 300
    assert step.current is None
    assert [remover.outcome for remover in step.ended] == ["removed"] * 300
    assert os.listdir(containers) == []
    assert open_fds() == baseline


def test_a_step_over_many_trees_stays_within_its_budget(containers: Path) -> None:
    """Each tree costs four units here (begin, two files, the directory): a 50-unit budget
    ends a step a dozen trees in, often in the middle of one; the last one is left open for
    the next step, one stopped in while others wait goes behind them."""
    queued: list[tuple[str, int | None]] = [
        (f"gone{index:03d}_c", gone_container(containers, f"gone{index:03d}_c"))
        for index in range(100)
    ]
    baseline = open_fds()
    current: TreeRemover | None = None
    ended: list[TreeRemover] = []
    steps = parked = 0
    while queued or current is not None:
        step = QueuedStep(str(containers), current, queued)
        remove_queued(step, Budget(ops=50))
        assert step.taken <= 25  # two units at least (begin, the directory) per tree
        ended += step.ended
        queued, current = queued[step.taken :], step.current
        if step.parked is not None:
            assert current is None
            parked += 1
            queued.append((step.parked.name, step.parked.inode))
        # At most one tree open between steps.
        assert open_fds() - baseline <= (0 if current is None else 2 * MAX_DEPTH + 1)
        steps += 1
        assert steps < 100
    assert steps >= 8
    assert parked >= 1
    assert len(ended) == 100
    assert {remover.outcome for remover in ended} == {"removed"}
    assert os.listdir(containers) == []
    assert open_fds() == baseline


def test_a_huge_tree_goes_behind_the_trees_queued_after_it(containers: Path) -> None:
    """The attack: a tenant fills its directory with 20,000 files before its pod ends, so
    that the pods' directories queued after it wait until all of them are gone.  Now the
    huge one is put behind the others once a step runs out in it."""
    big = containers / "big_c"
    big.mkdir()
    fill_with_files(big, 20_000)
    queued: list[tuple[str, int | None]] = [("big_c", big.stat().st_ino)]
    queued += [
        (f"small{index:02d}_c", gone_container(containers, f"small{index:02d}_c"))
        for index in range(20)
    ]
    step = QueuedStep(str(containers), None, queued)
    remove_queued(step, Budget(ops=2000, seconds=60))
    assert step.ended == []
    assert step.current is None
    assert step.parked is not None
    assert step.parked.name == "big_c"
    assert step.parked.inode == big.stat().st_ino
    second = QueuedStep(str(containers), None, [*queued[1:], ("big_c", step.parked.inode)])
    remove_queued(second, Budget(ops=2000, seconds=60))
    assert [remover.name for remover in second.ended] == [name for name, _ in queued[1:]]
    assert os.listdir(containers) == ["big_c"]
    assert second.current is not None  # nothing else waits: left open, resumed next step
    assert second.current.name == "big_c"
    while second.current is not None:
        second = QueuedStep(str(containers), second.current, [])
        remove_queued(second, Budget(ops=2000, seconds=60))
    assert second.ended[0].outcome == "removed"
    assert os.listdir(containers) == []


async def test_the_lister_puts_a_huge_tree_behind_the_others(containers: Path) -> None:
    big = containers / "big_c"
    big.mkdir()
    fill_with_files(big, 20_000)
    for index in range(20):
        gone_container(containers, f"small{index:02d}_c")
    for name in os.listdir(containers):
        make_old(containers / name)
    outcomes: list[str] = []
    lister = ContainerLister(
        containers,
        StaticPodSource([]),
        resync_interval=60,
        on_removal=outcomes.append,
        removal_budget=Budget(ops=2000, seconds=60),
    )
    await lister.update()
    assert lister.removals.pending == 21
    assert await lister.removals.step()
    assert await lister.removals.step()
    assert os.listdir(containers) == ["big_c"]
    assert outcomes == ["removed"] * 20
    assert lister.removals.in_progress  # the huge one, resumed by the next steps
    steps = 0
    while await lister.removals.step():
        steps += 1
        assert steps < 100
    assert outcomes == ["removed"] * 21
    assert os.listdir(containers) == []
    lister.close()


def test_a_step_begins_at_most_max_trees(containers: Path) -> None:
    queued: list[tuple[str, int | None]] = [(f"missing{index}_c", None) for index in range(50)]
    step = QueuedStep(str(containers), None, queued)
    remove_queued(step, Budget(), max_trees=7)
    assert step.taken == 7
    assert len(step.ended) == 7


def test_hostile_trees_in_one_step_keep_every_rule_and_spare_the_others(
    containers: Path, outside: Path
) -> None:
    """One step over a queue that holds, between plain containers, a tree with symlinks to
    the host and a FIFO, a tree replaced since it was listed and a 5,000-deep chain: nothing
    outside is touched, the replaced one is refused, every other one goes."""
    queued: list[tuple[str, int | None]] = []
    queued.append(("plain0_c", gone_container(containers, "plain0_c")))
    links = containers / "links_c"
    links.mkdir()
    (links / "to_host").symlink_to(outside)
    (links / "to_file").symlink_to(outside / "keep")
    (links / "to_fifo").symlink_to(outside / "fifo")
    os.mkfifo(links / "fifo")
    os.link(outside / "keep", links / "hardlink")
    queued.append(("links_c", links.stat().st_ino))
    replaced = containers / "replaced_c"
    replaced.mkdir()
    listed = replaced.stat().st_ino
    (containers / "spacer").mkdir()  # keeps the old inode from being reused at once
    replaced.rmdir()
    replaced.mkdir()
    (replaced / "f").touch()
    queued.append(("replaced_c", listed))
    deep = containers / "deep_c"
    deep.mkdir()
    chain(deep, 5000)
    queued.append(("deep_c", deep.stat().st_ino))
    queued.append(("plain1_c", gone_container(containers, "plain1_c")))
    before = snapshot(outside)
    baseline = open_fds()
    if replaced.stat().st_ino == listed:  # pragma: no cover - inode reused anyway
        pytest.skip("the file system reused the inode")
    step = QueuedStep(str(containers), None, queued)
    remove_queued(step, UNLIMITED)
    outcomes = {remover.name: remover.outcome for remover in step.ended}
    assert outcomes == {
        "plain0_c": "removed",
        "links_c": "removed",
        "replaced_c": "failed",
        "deep_c": "removed",
        "plain1_c": "removed",
    }
    assert sorted(os.listdir(containers)) == ["replaced_c", "spacer"]
    assert (replaced / "f").exists()
    assert snapshot(outside) == before
    assert open_fds() == baseline


# -- the real Monitor ------------------------------------------------------------------------


def monitor_for(containers: Path, registry: CollectorRegistry) -> Monitor:
    config = MonitorConfig(
        hook_path=containers.parent,
        resync_interval=60,
        mig_lock_path=containers.parent / "mig" / "hami-mig-apply.lock",
    )
    return Monitor(config, pod_source=StaticPodSource([]), registry=registry)


async def serve_until_gone(monitor: Monitor, directory: Path, *, max_ticks: int) -> tuple[int, int]:
    """Serve until ``directory`` is gone; (ticks while it was being removed, peak fds)."""
    baseline = open_fds()
    peak = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.serve)
        first = monitor.ticks
        while os.path.lexists(directory) and monitor.ticks < max_ticks:  # noqa: ASYNC240 - one lstat
            peak = max(peak, open_fds() - baseline)
            await trio.sleep(monitor.config.interval)
        ticks = monitor.ticks - first
        monitor.request_stop()
    return ticks, peak


def test_monitor_survives_a_5000_deep_chain_and_removes_it(containers: Path) -> None:
    """Before: the first authoritative tick raised RecursionError out of Monitor.serve
    (shutil.rmtree on Python 3.11), on every restart."""
    gone = containers / "gone_c"
    gone.mkdir()
    chain(gone, 5000)
    make_old(gone)
    registry = CollectorRegistry()
    monitor = monitor_for(containers, registry)
    ticks, peak_fds = trio.run(
        lambda: serve_until_gone(monitor, gone, max_ticks=10**6),
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    assert not gone.exists()
    assert ticks >= 1
    assert peak_fds <= 2 * MAX_DEPTH + 8
    removed = registry.get_sample_value("hami_trio_monitor_removals_total", {"outcome": "removed"})
    assert removed == 1


@pytest.mark.slow
def test_monitor_keeps_ticking_while_200000_files_are_removed(containers: Path) -> None:
    """The removal runs beside the ticks, a budget per tick: the ticks go on while it runs
    (before, one tick waited 1.7 s for rmtree; see bench/monitor_removal.py)."""
    gone = containers / "gone_c"
    gone.mkdir()
    fill_with_files(gone, 200_000)
    make_old(gone)
    registry = CollectorRegistry()
    monitor = monitor_for(containers, registry)
    ticks, peak_fds = trio.run(
        lambda: serve_until_gone(monitor, gone, max_ticks=10**7),
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    assert not gone.exists()
    assert ticks >= 10  # at most one budget (20,000 entries) per tick: at least 10 ticks
    assert peak_fds <= 2 * MAX_DEPTH + 8


def test_stopping_the_monitor_mid_removal_leaves_no_thread_or_descriptor(
    containers: Path,
) -> None:
    gone = containers / "gone_c"
    gone.mkdir()
    chain(gone, 20_000)
    make_old(gone)
    monitor = monitor_for(containers, CollectorRegistry())
    baseline = open_fds()

    async def main() -> None:
        with trio.move_on_after(12):  # two ticks, then cancel serve mid-removal
            await monitor.serve()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert gone.exists()  # unfinished (a few steps only)
    # serve() waited for the step's thread and closed the removal's descriptors.
    assert not monitor.lister.removals.in_progress
    assert monitor.lister.removals.pending == 1
    assert open_fds() == baseline


class ChurningPods:
    """A pod source whose pods come and go (what the pod watch reports under churn)."""

    def __init__(self, pods: list[PodInfo]) -> None:
        self.pods = {pod.uid: pod for pod in pods}

    @property
    def ready(self) -> bool:
        return True

    @property
    def authoritative(self) -> bool:
        return True

    def lookup(self, uid: str) -> PodInfo | None:
        return self.pods.get(uid)


@pytest.mark.slow
def test_steady_churn_keeps_the_removal_queue_bounded(containers: Path) -> None:
    """Half an hour of a busy batch node at the default 5 s interval: every tick 6 pods start,
    each with a container directory of the usual shape (two 2 MB ``.cache`` files), live
    for 30 s, then deleted; their directories go once older than the 60 s resync interval -
    6 directories a tick (1.2 a second), as in a soak that saw 1.07.  After every tick the
    removal step runs (what ``RemovalQueue.serve`` does).  Before: one directory per step, so
    the queue grew by 5 a tick without bound (and its oldest entry's wait with it); now the
    queue and the wait stay flat, and the self-metrics say so."""
    interval, resync, per_tick, lifetime_ticks, ticks = 5.0, 60.0, 6, 6, 360
    base_wall = time.time()
    live = [PodInfo(uid=f"live{index:03d}", namespace="n", name=f"l{index}") for index in range(40)]
    for pod in live:
        (containers / f"{pod.uid}_main").mkdir()
        write_region(containers / f"{pod.uid}_main" / "x.cache", RegionSpec(uuids=["GPU-0"]))
    pods = ChurningPods(live)
    registry = CollectorRegistry()

    def wall() -> float:
        return base_wall + trio.current_time()

    monitor = Monitor(
        MonitorConfig(
            hook_path=containers.parent,
            interval=interval,
            resync_interval=resync,
            mig_lock_path=containers.parent / "mig" / "hami-mig-apply.lock",
        ),
        pod_source=pods,
        registry=registry,
        wall_clock=wall,
    )
    started: list[list[str]] = []
    pending: list[int] = []
    oldest: list[float] = []

    def gauge(name: str) -> float:
        value = registry.get_sample_value(name)
        assert value is not None
        return value

    async def main() -> None:
        for tick in range(ticks):
            batch = []
            for index in range(per_tick):
                uid = f"churn{tick:04d}x{index}"
                pods.pods[uid] = PodInfo(uid=uid, namespace="n", name=uid)
                directory = containers / f"{uid}_main"
                directory.mkdir()
                write_region(directory / "a.cache", RegionSpec(uuids=["GPU-0"]))
                write_region(directory / "b.cache", RegionSpec(uuids=["GPU-1"]))
                os.utime(directory, (wall(), wall()))
                batch.append(uid)
            started.append(batch)
            if tick >= lifetime_ticks:
                for uid in started[tick - lifetime_ticks]:
                    del pods.pods[uid]  # the pod is deleted
            await monitor.tick()
            pending.append(monitor.lister.removals.pending)
            oldest.append(monitor.lister.removals.oldest_age())
            assert gauge("hami_trio_monitor_removals_pending") == pending[-1]
            assert gauge("hami_trio_monitor_removal_oldest_pending_seconds") == oldest[-1]
            # Fails fast on a queue that grows (and keeps /dev/shm small if it does).
            assert pending[-1] <= 4 * per_tick, (tick, pending[-1])
            await monitor.lister.removals.step()
            clock.jump(interval)
            await trio.lowlevel.checkpoint()

    # The clock is moved by hand, not by autojump: with autojump the event loop spins while it
    # waits for the removal's worker thread and takes the GIL from it, so the step's 0.1 s of
    # real time ran out after one directory (this test then failed as the old code did).
    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)
    removed = registry.get_sample_value("hami_trio_monitor_removals_total", {"outcome": "removed"})
    # Every pod deleted more than the resync interval (and one tick) ago is gone.
    expected = (ticks - lifetime_ticks - int(resync / interval) - 1) * per_tick
    assert removed is not None
    assert removed >= expected
    assert max(pending) <= 2 * per_tick
    assert max(oldest) <= 2 * interval
    assert registry.get_sample_value("hami_trio_monitor_removals_total", {"outcome": "failed"}) == 0
    assert gauge("hami_trio_monitor_resync_interval_seconds") == resync
    remaining = len(os.listdir(containers))
    assert remaining <= len(live) + per_tick * (lifetime_ticks + int(resync / interval) + 2)


async def test_the_queue_counts_waits_and_serves_one_step_per_wake(
    containers: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The queue alone, as the lister drives it: scheduled names are pending (and skipped by
    the tick) until their removal ends; the oldest wait is on trio's clock; ``serve`` runs
    one step per ``wake`` and none while nothing is scheduled."""
    for name in ("a_c", "b_c"):
        (containers / name).mkdir()
        fill_with_files(containers / name, 3)
    outcomes: list[str] = []
    both_ended = trio.Event()

    def ended(outcome: str) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 2:
            both_ended.set()

    # A step's seconds are real time, and with autojump the event loop spins while it waits
    # for the worker thread: under load the default 0.1 s ran out after "a_c", and "b_c" then
    # waited for a second wake that never came.  Only the entries may end this step.
    queue = RemovalQueue(str(containers), on_removal=ended, budget=Budget(seconds=3600.0))
    queue.wake()  # nothing scheduled: no step
    assert (queue.pending, queue.oldest_age(), queue.in_progress) == (0, 0.0, False)
    queue.schedule("a_c", os.stat(containers / "a_c").st_ino)
    await trio.sleep(5)
    queue.schedule("b_c", None)
    await trio.sleep(2)
    assert queue.pending == 2
    assert queue.scheduled == {"a_c", "b_c"}
    assert queue.oldest_age() == 7.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.serve)
        await trio.testing.wait_all_tasks_blocked()
        assert queue.pending == 2  # not woken yet
        queue.wake()
        await both_ended.wait()  # the step runs in a worker thread
        nursery.cancel_scope.cancel()
    assert outcomes == ["removed", "removed"]
    assert (queue.pending, queue.oldest_age(), queue.scheduled) == (0, 0.0, set())
    assert os.listdir(containers) == []
    queue.stop()  # nothing open: nothing to do
