"""Container discovery: ``$HOOK_PATH/containers/*`` -> one snapshot per container per tick.

How this works: each :meth:`ContainerLister.update` lists the containers directory once
(sorted; only real directories named ``{PodUID}_{ContainerName}``), asks the
:class:`~hami_trio.pods.source.PodSource` about each pod, and for each container checks that
its open :mod:`~hami_trio.monitor.region` handle still names the same ``.cache`` file, reads
it, or (re-)lists the directory to open one.  The name check is an ``lstat``, skipped for a
directory the inotify watch (:mod:`~hami_trio.monitor.watch`) saw no name change in.

Directories of pods gone longer than the resync interval leave the view and go to the
:class:`~hami_trio.monitor.remover.RemovalQueue`.  The tick checkpoints by work done (about
one unit per byte read or listed, see the constants below); large directories are listed in
a worker thread.  The result is one immutable mapping per tick
(:meth:`ContainerLister.containers`).  Rules and reasons: docs/monitor.md (Discovery, How one
region is read, Tenant threat model).
"""

from __future__ import annotations

import errno
import logging
import operator
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import trio

from hami_trio._text import quote
from hami_trio.errors import CacheFileRejected
from hami_trio.logs import RateLimiter
from hami_trio.monitor.feedback import Write
from hami_trio.monitor.layout import (
    LAYOUTS,
    MAX_SLOTS,
    ControlField,
    RejectReason,
    is_initialising,
)
from hami_trio.monitor.region import RegionHandle
from hami_trio.monitor.remover import Budget, RemovalQueue
from hami_trio.monitor.snapshot import TickSnapshot
from hami_trio.monitor.state import (
    ContainerKey,
    ContainerStatus,
    Rejection,
    TickState,
    new_container_state,
    parse_container_dirname,
)
from hami_trio.monitor.watch import DirectoryWatch
from hami_trio.pods.source import PodSource

__all__ = [
    "CHECKPOINT_EVERY",
    "CONTAINER_WORK",
    "INITIALISING_TICKS",
    "INLINE_DIR_BYTES",
    "MAX_CONTAINER_WORK",
    "MAX_DIR_ENTRIES",
    "MAX_STEP_WORK",
    "WORK_PER_CHECKPOINT",
    "ContainerLister",
]

logger = logging.getLogger(__name__)

#: Work units (about one per byte read or listed) after which the tick checkpoints.
WORK_PER_CHECKPOINT = 1 << 20
#: Units every container costs besides its bytes (its system calls and bookkeeping).
CONTAINER_WORK = 8 << 10
#: Most containers handled between two checkpoints (each costs at least CONTAINER_WORK).
CHECKPOINT_EVERY = WORK_PER_CHECKPOINT // CONTAINER_WORK
#: Entries read from one container directory before giving up on it (HAMi-core keeps 1-3).
MAX_DIR_ENTRIES = 1024
#: A directory whose ``st_size`` exceeds this is listed in a worker thread, not on the loop.
INLINE_DIR_BYTES = 64 << 10
#: Ticks a file may read with magic 0 (HAMi-core creating it) before that is a rejection.
INITIALISING_TICKS = 2
#: The most one container adds to the count: its units, one listing, one region read.
MAX_CONTAINER_WORK = (
    CONTAINER_WORK
    + INLINE_DIR_BYTES
    + max(lay.body_size(MAX_SLOTS) + lay.tail_size for lay in LAYOUTS.values())
)
#: Work done on the event loop between two checkpoints of a tick stays below this.
MAX_STEP_WORK = WORK_PER_CHECKPOINT + MAX_CONTAINER_WORK
_LIBVGPU = "libvgpu.so"
_CACHE_SUFFIX = ".cache"
#: Out of descriptors: says nothing about the directory or the file, only about this process.
_NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


_BY_NAME = operator.attrgetter("name")


def _sorted_entries(fd: int) -> list[os.DirEntry[str]]:
    """Every entry of the directory open at ``fd``, sorted by name."""
    with os.scandir(fd) as it:
        return sorted(it, key=_BY_NAME)


def _bounded_names(fd: int) -> list[str] | None:
    """The names in the directory open at ``fd``, sorted; None if there are more than
    :data:`MAX_DIR_ENTRIES` (the scan stops there: a tenant can create millions)."""
    names: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            if len(names) == MAX_DIR_ENTRIES:
                return None
            names.append(entry.name)
    return sorted(names)


class _Pending:
    """A container directory too large to list on the event loop: its open descriptor."""

    __slots__ = ("fd", "tracked")

    def __init__(self, tracked: _Tracked, fd: int) -> None:
        self.tracked = tracked
        self.fd = fd


class _Tracked:
    """What the lister keeps between ticks for one directory (mutable, private)."""

    __slots__ = (
        "cache_name",
        "cache_path",
        "directory",
        "handle",
        "initialising",
        "key",
        "last_reason",
        "last_state",
    )

    def __init__(self, key: ContainerKey, directory: str) -> None:
        self.key = key
        self.directory = directory
        self.handle: RegionHandle | None = None
        self.cache_name: str | None = None
        #: ``{dirname}/{cache_name}`` of the open handle, relative to the containers
        #: directory (what the identity check stats every tick).
        self.cache_path = ""
        self.last_reason: RejectReason | None = None
        self.last_state: TickState | None = None
        #: Consecutive ticks its file read with magic 0 (HAMi-core still initialising it).
        self.initialising = 0

    def drop_handle(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.handle = None


class ContainerLister:
    """Discovers containers under ``containers_dir`` and reads their regions each tick.

    Args:
        containers_dir: ``$HOOK_PATH/containers``.
        pod_source: which pods exist (deletion happens only while it is authoritative).
        resync_interval: seconds a directory of an unknown pod must be untouched (mtime)
            before it is removed.
        on_reject: called with the reason token each time a container enters a rejection
            (the self-metrics counter).
        wall_clock: Unix time source, compared with directory mtimes (injectable for tests).
        log_interval: seconds between two log lines about the same container.
        on_removal: called with ``"removed"`` or ``"failed"`` each time the removal of a gone
            pod's directory ends (the self-metrics counter).
        removal_budget: the work of one removal step (one step per tick, over as many
            queued directories as it covers).
        on_watch_fallback: called with ``overflow``, ``flood``, ``error`` or ``root`` for each
            tick on which no directory could rely on its inotify watch (the self-metrics
            counter).
        max_watches: the most directories watched with inotify (None: a share of the node's
            ``fs.inotify.max_user_watches``, see :func:`~hami_trio.monitor.watch.watch_cap`).
        on_no_descriptors: called each time the process is out of descriptors (EMFILE,
            ENFILE) where the tick needed one; the last view (of the directory, or of that
            container) is kept instead of being emptied or refused.
    """

    def __init__(
        self,
        containers_dir: str | os.PathLike[str],
        pod_source: PodSource,
        *,
        resync_interval: float = 300.0,
        on_reject: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
        log_interval: float = 60.0,
        on_removal: Callable[[str], None] | None = None,
        removal_budget: Budget | None = None,
        on_watch_fallback: Callable[[str], None] | None = None,
        max_watches: int | None = None,
        on_no_descriptors: Callable[[], None] | None = None,
    ) -> None:
        self._root = os.fspath(containers_dir)
        self._on_no_descriptors = on_no_descriptors
        self._pods = pod_source
        self._resync = resync_interval
        self._on_reject = on_reject
        self._wall_clock = wall_clock
        self._tracked: dict[str, _Tracked] = {}
        self._removals = RemovalQueue(
            self._root, budget=removal_budget, on_removal=on_removal, log_interval=log_interval
        )
        self._warned: set[str] = set()
        self._root_missing_logged = False
        self._limiter = RateLimiter(log_interval, max_keys=4096)
        self._view: Mapping[ContainerKey, TickState] = MappingProxyType({})
        self._handles: Mapping[ContainerKey, RegionHandle] = MappingProxyType({})
        self._work = 0  # units since the last checkpoint (see the module docstring)
        self._watch = DirectoryWatch(max_watches, log_interval=log_interval)
        self._on_watch_fallback = on_watch_fallback
        self._root_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the last tick's
        self._unwatched = 0  # containers of the latest tick with a handle but no watch

    # -- the read-only view ----------------------------------------------------------------

    def containers(self) -> Mapping[ContainerKey, TickState]:
        """The latest tick's containers (immutable; see the module docstring)."""
        return self._view

    def tracked_names(self) -> frozenset[str]:
        """The container directories the lister follows (open handle or not) right now."""
        return frozenset(self._tracked)

    def handles(self) -> Mapping[ContainerKey, RegionHandle]:
        """The handle each loaded container of the latest tick was read through (immutable,
        published with :meth:`containers`; a usage read pins a handle before reading, as
        the tick may close it at any time: see :class:`~hami_trio.monitor.region.RegionHandle`)."""
        return self._handles

    def handle_of(self, dirname: str) -> RegionHandle | None:
        """The open region handle of container directory ``dirname``, if it has one."""
        tracked = self._tracked.get(dirname)
        return None if tracked is None else tracked.handle

    @property
    def watched_directories(self) -> int:
        """Container directories watched with inotify now (see :mod:`~hami_trio.monitor.watch`)."""
        return self._watch.watched

    @property
    def unwatched_directories(self) -> int:
        """Containers of the latest tick with an open file but no watch: checked by ``lstat``
        every tick (the watch cap, the node's limit, or no inotify)."""
        return self._unwatched

    @property
    def removals(self) -> RemovalQueue:
        """The gone pods' directories this lister scheduled for removal (run its
        :meth:`~hami_trio.monitor.remover.RemovalQueue.serve` beside the ticks)."""
        return self._removals

    @property
    def containers_dir(self) -> str:
        """The directory this lister scans."""
        return self._root

    # -- one tick --------------------------------------------------------------------------

    async def update(self) -> Mapping[ContainerKey, TickState]:
        """Scan, clean up, read every container, publish and return the new view.

        Checkpoints every :data:`WORK_PER_CHECKPOINT` units of work (see the module
        docstring) and once more before publishing.  If cancelled there, nothing is
        published and the previous view stays; the next call starts over.
        """
        fallback = self._watch.drain()
        if fallback is not None:
            self._watch_fell_back(fallback)
        root_fd = self._open_root()
        if root_fd is None:
            return self._view
        self._root_missing_logged = False
        self._work = 0
        self._unwatched = 0
        try:
            listed = await self._entries(root_fd)
            if listed is None:
                return self._view  # not "no directories": the last view stays
            entries = listed
            states: dict[ContainerKey, TickState] = {}
            handles: dict[ContainerKey, RegionHandle] = {}
            seen: set[str] = set()
            now = self._wall_clock()
            tracked_of = self._tracked
            quiet, removing = self._watch.quiet, self._removals.scheduled
            lookup, authoritative = self._pods.lookup, self._pods.authoritative
            for entry in entries:
                # The usual container, in one pass: followed, its file open, its directory
                # watched and quiet, its pod known (else _visit decides about removal).
                name = entry.name
                tracked = tracked_of.get(name)
                state: TickState | _Pending | None
                if (
                    tracked is not None
                    and tracked.handle is not None
                    and quiet(name)
                    and name not in removing
                    and (not authoritative or lookup(tracked.key.pod_uid) is not None)
                    and self._is_dir(entry)
                ):
                    state = self._read(tracked, tracked.handle, None)
                else:
                    state = self._visit(root_fd, entry, now)
                if state is not None:
                    if isinstance(state, _Pending):
                        state = await self._list_pending(root_fd, state)
                    seen.add(entry.name)
                    states[state.key] = state
                    if state.snapshot is not None:
                        handle = tracked_of[entry.name].handle
                        if handle is not None:
                            handles[state.key] = handle
                self._work += CONTAINER_WORK
                if self._work >= WORK_PER_CHECKPOINT:
                    await trio.lowlevel.checkpoint()
                    self._work = 0
            if self._work:
                await trio.lowlevel.checkpoint()  # the caller's work starts with a fresh budget
                self._work = 0
        finally:
            os.close(root_fd)
        self._forget(seen)
        self._watch.tick_done()
        if self._warned:
            self._warned.intersection_update(entry.name for entry in entries)
        self._view = MappingProxyType(states)
        self._handles = MappingProxyType(handles)
        self._removals.wake()  # one removal step per tick that left some scheduled
        return self._view

    async def _entries(self, root_fd: int) -> list[os.DirEntry[str]] | None:
        """The containers directory's entries, sorted (a large one listed in a worker
        thread); None when the process is out of descriptors."""
        try:
            root_st = os.fstat(root_fd)
            self._check_root(root_st)
            size = root_st.st_size
            if size > INLINE_DIR_BYTES:
                return await trio.to_thread.run_sync(_sorted_entries, root_fd)
            self._work = size
            return _sorted_entries(root_fd)
        except OSError as exc:
            if exc.errno in _NO_DESCRIPTORS:
                self._no_descriptors(exc)
                return None
            self._limiter.log(
                logger, logging.ERROR, "root", "cannot list %s: %s", self._root, exc.strerror
            )
            return []

    def _open_root(self) -> int | None:
        """The containers directory, opened; None when it cannot be (the view is then
        emptied, or kept when only descriptors are lacking)."""
        try:
            return os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not self._root_missing_logged:
                logger.info(
                    "%s does not exist yet (the device plugin creates it with the first "
                    "vGPU container); no containers",
                    self._root,
                )
                self._root_missing_logged = True
            self._forget(set())
            self._view = MappingProxyType({})
            self._handles = MappingProxyType({})
            return None
        except OSError as exc:
            if exc.errno in _NO_DESCRIPTORS:
                self._no_descriptors(exc)
                return None  # every handle and the last view stay
            self._limiter.log(
                logger, logging.ERROR, "root", "cannot open %s: %s", self._root, exc.strerror
            )
            self._forget(set())
            self._view = MappingProxyType({})
            self._handles = MappingProxyType({})
            return None

    def _check_root(self, st: os.stat_result) -> None:
        # Another containers directory under the same path (renamed, mounted over): the
        # watches are on the old one's directories, so none of them says anything now.
        root_id = (st.st_dev, st.st_ino)
        if root_id != self._root_id:
            if self._root_id is not None:
                self._watch.mark_all_dirty()
                self._watch_fell_back("root")
            self._root_id = root_id

    def _no_descriptors(self, exc: OSError) -> None:
        if self._on_no_descriptors is not None:
            self._on_no_descriptors()
        self._limiter.log(
            logger,
            logging.WARNING,
            "descriptors",
            "out of file descriptors reading %s (%s): keeping the last view until there are "
            "descriptors again",
            self._root,
            exc.strerror or exc,
        )

    def _kept(self, tracked: _Tracked, exc: BaseException | None) -> TickState | None:
        """The container's last state, when ``exc`` (or its cause) is only "out of
        descriptors": nothing is known against the file, so it is not refused for it."""
        if isinstance(exc, CacheFileRejected):
            exc = exc.__cause__
        if not isinstance(exc, OSError) or exc.errno not in _NO_DESCRIPTORS:
            return None
        last = tracked.last_state
        if last is not None:
            self._no_descriptors(exc)
        return last

    def _watch_fell_back(self, reason: str) -> None:
        if self._on_watch_fallback is not None:
            self._on_watch_fallback(reason)

    def _warn_once(self, name: str, msg: str, *args: object) -> None:
        if name not in self._warned:
            self._warned.add(name)
            logger.warning(msg, *args)

    @staticmethod
    def _is_dir(entry: os.DirEntry[str]) -> bool:
        try:
            return entry.is_dir(follow_symlinks=False)
        except OSError:
            return False

    def _visit(
        self, root_fd: int, entry: os.DirEntry[str], now: float
    ) -> TickState | _Pending | None:
        name = entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_link = not is_dir and entry.is_symlink()
        except OSError:
            return None
        if not is_dir:
            if is_link:
                self._warn_once(name, "skipping symlink %r in %s", name, self._root)
            return None
        tracked = self._tracked.get(name)
        if tracked is not None:
            key = tracked.key  # parsed when it was first seen (a function of the name)
        else:
            parsed = parse_container_dirname(name)
            if parsed is None:
                self._warn_once(
                    name, "skipping directory with unexpected name %r (want PodUID_Container)", name
                )
                return None
            key = parsed
        if name in self._removals.scheduled:
            return None  # being removed: not read, not written, not decided again
        if (
            self._pods.lookup(key.pod_uid) is None
            and self._pods.authoritative
            and self._expired(entry, now)
        ):
            if tracked is not None:
                del self._tracked[name]
                self._drop_handle(tracked)  # and its watch, before the remover deletes
            self._schedule_removal(name, entry)
            return None
        if tracked is None:
            tracked = self._tracked[name] = _Tracked(key, os.path.join(self._root, name))
        return self._refresh(root_fd, tracked)

    def _expired(self, entry: os.DirEntry[str], now: float) -> bool:
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            return False
        return now - mtime >= self._resync

    # -- removing gone pods' directories --------------------------------------------------

    def _schedule_removal(self, name: str, entry: os.DirEntry[str]) -> None:
        logger.info(
            "removing %s/%s: its pod is gone and it is older than the resync interval (%gs)",
            self._root,
            name,
            self._resync,
        )
        self._removals.schedule(name, entry.inode())

    def _forget(self, seen: set[str]) -> None:
        for name in self._tracked.keys() - seen:  # a set difference, in C
            self._drop_handle(self._tracked.pop(name))

    def _drop_handle(self, tracked: _Tracked) -> None:
        """Close the container's handle and stop watching its directory (a watch is only
        held while there is a handle whose name it guards)."""
        self._watch.remove(tracked.key.dirname)
        tracked.drop_handle()

    def _state(
        self,
        tracked: _Tracked,
        status: ContainerStatus,
        snapshot: TickSnapshot | None = None,
        rejection: Rejection | None = None,
    ) -> TickState:
        last = tracked.last_state
        if (
            last is not None
            and last.snapshot is snapshot
            and last.status is status
            and last.rejection == rejection
            and last.cache_file == tracked.cache_name
        ):
            return last  # nothing changed: keep the same immutable object
        # positional, in field order (a busy container gets a new state every tick)
        state: TickState = new_container_state(
            tracked.key, tracked.directory, tracked.cache_name, status, snapshot, rejection
        )
        tracked.last_state = state
        return state

    def _reject(self, tracked: _Tracked, exc: CacheFileRejected) -> TickState:
        kept = self._kept(tracked, exc)
        if kept is not None:
            return kept
        if is_initialising(exc) and tracked.initialising < INITIALISING_TICKS:
            # A new file HAMi-core has not written its magic to yet: no cache file to use
            # for a tick or two, not a rejection (no warning, not counted).
            tracked.initialising += 1
            return self._state(tracked, ContainerStatus.NO_CACHE_FILE)
        reason = RejectReason(exc.reason)
        if reason != tracked.last_reason:
            tracked.last_reason = reason
            if self._on_reject is not None:
                self._on_reject(reason.value)
            self._limiter.log(
                logger,
                logging.WARNING,
                ("reject", tracked.key.dirname),
                "container %s (pod %s): ignoring its cache file: %s",
                tracked.key.dirname,
                tracked.key.pod_uid,
                exc,
            )
        return self._state(tracked, ContainerStatus.REJECTED, rejection=Rejection(reason, str(exc)))

    def _refresh(self, root_fd: int, tracked: _Tracked) -> TickState | _Pending:
        handle = tracked.handle
        if handle is not None:
            watch = self._watch
            name = tracked.key.dirname
            if watch.quiet(name):
                # No name in the directory changed since a check found the file there: it
                # is still the file at that name.  The read checks the size.
                return self._read(tracked, handle, None)
            try:
                st = self._identity(root_fd, tracked)
            except FileNotFoundError:
                self._drop_handle(tracked)
            except OSError as exc:
                self._drop_handle(tracked)
                return self._reject(
                    tracked,
                    CacheFileRejected(
                        RejectReason.IO_ERROR, f"{handle.display}: cannot stat: {exc.strerror}"
                    ),
                )
            else:
                if handle.matches(st):
                    if watch.watching(name):
                        watch.confirm(name)
                    else:
                        self._unwatched += 1
                    return self._read(tracked, handle, st.st_size)
                self._drop_handle(tracked)
                # Counted and logged even if the new file loads: somebody swapped the file.
                self._report_replaced(tracked, handle.display, st)
        return self._open(root_fd, tracked)

    def _identity(self, root_fd: int, tracked: _Tracked) -> os.stat_result:
        """``lstat`` of the cache file's name; a directory not watched yet is watched first
        (when the cap allows), and the name looked up in the very directory watched."""
        name = tracked.key.dirname
        if not self._watch.watching(name) and self._watch.can_add():
            try:
                dir_fd = os.open(
                    name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
                )
            except OSError:
                pass  # the lstat below says what is there
            else:
                try:
                    assert tracked.cache_name is not None  # set while there is a handle
                    st = self._watch_at(name, dir_fd, tracked.cache_name)
                finally:
                    os.close(dir_fd)
                if st is not None:
                    return st
        return os.stat(tracked.cache_path, dir_fd=root_fd, follow_symlinks=False)

    def _watch_at(self, name: str, dir_fd: int, cache_name: str) -> os.stat_result | None:
        """Watch the directory open at ``dir_fd``, then ``lstat`` ``cache_name`` in it: any
        change to that name from then on is an event.  The watch is trusted after one more
        ``lstat`` through the containers directory, next tick (which confirms that the
        directory still has its name).  None: not watched (nothing was looked up)."""
        if not self._watch.add(name, dir_fd):
            return None
        try:
            return os.stat(cache_name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            self._watch.remove(name)
            return None

    def _report_replaced(self, tracked: _Tracked, display: str, st: os.stat_result) -> None:
        if self._on_reject is not None:
            self._on_reject(RejectReason.REPLACED.value)
        self._limiter.log(
            logger,
            logging.WARNING,
            ("replaced", tracked.key.dirname),
            "container %s (pod %s): %s was replaced (now a %s); re-opening",
            tracked.key.dirname,
            tracked.key.pod_uid,
            display,
            "regular file" if stat.S_ISREG(st.st_mode) else "non-regular file",
        )

    def _read(self, tracked: _Tracked, handle: RegionHandle, size: int | None) -> TickState:
        """Read through ``handle`` at ``size`` (from an ``lstat``), or, with None, at the
        size the read itself checks (the name is known unchanged)."""
        try:
            snapshot = handle.read(size) if size is not None else handle.read_probed()
        except CacheFileRejected as exc:
            self._work += handle.read_bytes
            return self._reject(tracked, exc)
        self._work += handle.read_bytes
        tracked.initialising = 0
        last = tracked.last_state
        if (
            last is not None
            and last.snapshot is snapshot
            and tracked.last_reason is None
            and last.cache_file == tracked.cache_name
        ):
            return last  # loaded as before, nothing it holds changed (status follows)
        if tracked.last_reason is not None:
            logger.info("container %s: cache file loads again", tracked.key.dirname)
            tracked.last_reason = None
        return self._state(tracked, ContainerStatus.LOADED, snapshot=snapshot)

    def _cannot_list(self, tracked: _Tracked, exc: OSError) -> TickState:
        kept = self._kept(tracked, exc)
        if kept is not None:
            return kept
        tracked.cache_name = None
        return self._reject(
            tracked,
            CacheFileRejected(
                RejectReason.IO_ERROR, f"{tracked.directory}: cannot list: {exc.strerror}"
            ),
        )

    def _open(self, root_fd: int, tracked: _Tracked) -> TickState | _Pending:
        """List the directory and open its cache file; a directory larger than
        :data:`INLINE_DIR_BYTES` comes back as :class:`_Pending` for a worker thread."""
        try:
            fd = os.open(
                tracked.key.dirname,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=root_fd,
            )
        except OSError as exc:
            return self._cannot_list(tracked, exc)
        try:
            size = os.fstat(fd).st_size
            if size > INLINE_DIR_BYTES:
                pending, fd = _Pending(tracked, fd), -1
                return pending
            self._work += size
            names = _bounded_names(fd)
        except OSError as exc:
            return self._cannot_list(tracked, exc)
        finally:
            if fd >= 0:
                os.close(fd)
        return self._open_listed(root_fd, tracked, names)

    async def _list_pending(self, root_fd: int, pending: _Pending) -> TickState:
        """List a large directory through its descriptor in a worker thread, then go on."""
        try:
            names = await trio.to_thread.run_sync(_bounded_names, pending.fd)
        except OSError as exc:
            return self._cannot_list(pending.tracked, exc)
        finally:
            os.close(pending.fd)
        self._work = 0  # waiting for the thread was a checkpoint
        return self._open_listed(root_fd, pending.tracked, names)

    def _open_listed(self, root_fd: int, tracked: _Tracked, names: list[str] | None) -> TickState:
        dirname = tracked.key.dirname
        display_dir = tracked.directory
        if names is None:
            tracked.cache_name = None
            return self._reject(
                tracked,
                CacheFileRejected(
                    RejectReason.TOO_MANY_FILES,
                    f"{display_dir}: more than {MAX_DIR_ENTRIES} entries; not looking further",
                ),
            )
        matching = [n for n in names if _LIBVGPU in n or n.endswith(_CACHE_SUFFIX)]
        if len(matching) > 2:
            tracked.cache_name = None
            return self._reject(
                tracked,
                CacheFileRejected(
                    RejectReason.TOO_MANY_FILES,
                    f"{display_dir}: {len(matching)} files match libvgpu.so*/*.cache "
                    f"(at most 2): {', '.join(quote(n) for n in sorted(matching)[:5])}",
                ),
            )
        caches = [n for n in matching if n.endswith(_CACHE_SUFFIX) and _LIBVGPU not in n]
        if not caches:
            tracked.cache_name = None
            tracked.last_reason = None
            return self._state(tracked, ContainerStatus.NO_CACHE_FILE)
        tracked.cache_name = caches[0]
        display = f"{display_dir}/{quote(caches[0])}"  # the tenant's name, quoted
        try:
            dir_fd = os.open(
                dirname,
                os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=root_fd,
            )
        except OSError as exc:
            kept = self._kept(tracked, exc)
            if kept is not None:
                return kept
            return self._reject(
                tracked,
                CacheFileRejected(
                    RejectReason.IO_ERROR, f"{display_dir}: cannot open: {exc.strerror}"
                ),
            )
        try:
            handle = RegionHandle.open_at(dir_fd, caches[0], display=display)
            self._watch_opened(dirname, dir_fd, caches[0], handle)
        except FileNotFoundError:
            # Vanished between the listing and the open; look again next tick.
            tracked.cache_name = None
            return self._state(tracked, ContainerStatus.NO_CACHE_FILE)
        except CacheFileRejected as exc:
            return self._reject(tracked, exc)
        finally:
            os.close(dir_fd)
        tracked.handle = handle
        tracked.cache_path = f"{dirname}/{caches[0]}"
        try:
            size = handle.size()
        except CacheFileRejected as exc:
            return self._reject(tracked, exc)
        return self._read(tracked, handle, size)

    def _watch_opened(
        self, dirname: str, dir_fd: int, cache_name: str, handle: RegionHandle
    ) -> None:
        """Watch the directory a handle was just opened in, if the cap allows.  Kept only if,
        once the watch exists, the name still leads to the file opened (else whatever
        changed before the watch saw it is for the next tick's ``lstat``)."""
        if self._watch.can_add():
            st = self._watch_at(dirname, dir_fd, cache_name)
            if st is not None and handle.matches(st):
                return
            self._watch.remove(dirname)
        self._unwatched += 1

    # -- feedback writes -------------------------------------------------------------------

    def apply(self, writes: Iterable[Write[ContainerKey]]) -> int:
        """Store the feedback writes through the handles the snapshots were read from.

        Writes are grouped per container (one size check, then one ``pwrite`` per word).  A
        container with no open handle any more, or whose file changed size since it was
        read, is skipped (logged, rate-limited); the next tick decides again.

        Returns:
            How many words were written.
        """
        grouped: dict[ContainerKey, list[tuple[ControlField, int]]] = {}
        for write in writes:
            values = grouped.get(write.key)
            if values is None:
                grouped[write.key] = [(write.field, write.value)]
            else:
                values.append((write.field, write.value))
        done = 0
        debug = logger.isEnabledFor(logging.DEBUG)
        for key, values in grouped.items():
            dirname = key.dirname
            tracked = self._tracked.get(dirname)
            if tracked is None or tracked.handle is None or dirname in self._removals.scheduled:
                continue
            try:
                tracked.handle.write_controls(values)
            except CacheFileRejected as exc:
                self._limiter.log(
                    logger,
                    logging.WARNING,
                    ("write", key.dirname),
                    "container %s: not writing %s: %s",
                    key.dirname,
                    ", ".join(f"{field.value}={value}" for field, value in values),
                    exc,
                )
                continue
            if debug:
                logger.debug(
                    "container %s: %s",
                    dirname,
                    ", ".join(f"{field.value}<-{value}" for field, value in values),
                )
            done += len(values)
        return done

    def close(self) -> None:
        """Close every handle and the current removal's descriptors (the view stays readable;
        an unfinished removal resumes with the next :meth:`RemovalQueue.serve
        <hami_trio.monitor.remover.RemovalQueue.serve>`)."""
        self._watch.close()  # every watch at once, before the handles
        self._forget(set())
        self._removals.stop()
