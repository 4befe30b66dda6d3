"""Removing a gone pod's container directory: iterative, bounded, resumable, never following.

How this works: :class:`TreeRemover` opens only directories (relative to their parent,
``O_NOFOLLOW | O_DIRECTORY | O_NONBLOCK``, then checks inode, device and mount id) and
unlinks everything else by name; it holds at most ``max_depth`` directories open and moves a
deeper one up under a fresh ``.hami-trio-removing-*`` name.  :meth:`TreeRemover.step` does
one budget of work and the next call resumes; entries it cannot remove become
:class:`Failure` entries for the caller to log.  :func:`remove_queued` spends one budget over
as many queued trees as it covers, one after the other (one :class:`TreeRemover` open at a
time), and leaves the one it stopped in open for the next step, or, when others wait,
closes it and puts it behind them.  :class:`RemovalQueue` is what the lister schedules gone
pods' directories in: one such step after each tick that left some, in a worker thread,
beside the tick; it logs and counts each removal that ends.  The rules and the figures:
docs/monitor.md (Removal of a gone pod's directory).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import trio

from hami_trio.logs import RateLimiter

__all__ = [
    "MAX_DEPTH",
    "MAX_FAILURES",
    "MAX_TREES_PER_STEP",
    "MOVED_PREFIX",
    "Allowance",
    "Budget",
    "Failure",
    "QueuedStep",
    "RemovalQueue",
    "TreeRemover",
    "remove_queued",
]

logger = logging.getLogger(__name__)

#: Directories held open at once per removal (each costs two descriptors).
MAX_DEPTH = 16
#: Entries that could not be removed, remembered per removal before it gives up.
MAX_FAILURES = 1024
#: Failures kept for the caller between two :meth:`TreeRemover.drain_failures` calls.
MAX_REPORTED = 16
#: Name prefix of a subtree moved up to the top of the tree being removed.
MOVED_PREFIX = ".hami-trio-removing-"
#: Queued trees one :func:`remove_queued` step takes on at most (each also costs a unit of
#: its budget, so a queue of empty or vanished trees ends a step too).
MAX_TREES_PER_STEP = 1024
_MOVE_ATTEMPTS = 8
_CLOCK_EVERY = 64

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# rmdir of a directory that is not empty; rename onto something that is in the way.
_NOT_EMPTY = (errno.ENOTEMPTY, errno.EEXIST)
_IN_THE_WAY = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR)


@dataclass(frozen=True, slots=True)
class Budget:
    """The work one :meth:`TreeRemover.step` may do: entries handled and seconds spent."""

    ops: int = 20_000
    seconds: float = 0.1

    def __post_init__(self) -> None:
        if self.ops < 1 or not self.seconds > 0:
            raise ValueError(f"removal budget must be positive, got {self}")


class Failure(NamedTuple):
    """Something in the tree that was not removed: its path (as walked) and why."""

    path: str
    reason: str


class _Entries(Protocol):
    def __next__(self) -> os.DirEntry[str]: ...

    def close(self) -> None: ...


class _Frame:
    """One open directory of the walk."""

    __slots__ = ("entries", "failed", "fd", "ino", "name", "pending")

    def __init__(self, fd: int, name: str, ino: int) -> None:
        self.fd = fd
        self.name = name  # its name in the parent frame (or in the containers directory)
        self.ino = ino
        self.failed = False  # something in it was not removed
        self.entries: _Entries | None = None  # the reader, kept while the scan runs
        self.pending: os.DirEntry[str] | None = None  # read but not handled (budget ran out)

    def close_entries(self) -> None:
        entries, self.entries, self.pending = self.entries, None, None
        if entries is not None:
            entries.close()

    def close(self) -> None:
        self.close_entries()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class Allowance:
    """What is left of one :class:`Budget`: the removals of one step share it."""

    def __init__(self, budget: Budget, clock: Callable[[], float] = time.monotonic) -> None:
        self._left = budget.ops
        self._clock = clock
        self._deadline = clock() + budget.seconds
        self._until_clock = _CLOCK_EVERY

    def exhausted(self) -> bool:
        """True once the entries or the seconds of the budget are spent."""
        return self._left <= 0

    def check_clock(self) -> None:
        """Look at the clock now (else it is read every :data:`_CLOCK_EVERY` units)."""
        self._until_clock = _CLOCK_EVERY
        if self._clock() >= self._deadline:
            self._left = 0

    def spend(self) -> None:
        """Count one unit of work done (an entry, a directory left)."""
        self._left -= 1
        self._until_clock -= 1
        if self._until_clock <= 0:
            self._until_clock = _CLOCK_EVERY
            if self._clock() >= self._deadline:
                self._left = 0


def mount_id(fd: int) -> int | None:
    """The kernel's mount id of an open descriptor (``/proc/self/fdinfo``), None if unknown.

    ``st_dev`` alone does not see a bind mount of the same file system; the mount id does.
    """
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            data = info.read(4096)
    except OSError:
        return None
    for line in data.splitlines():
        if line.startswith(b"mnt_id:"):
            try:
                return int(line[7:])
            except ValueError:
                return None
    return None


class TreeRemover:
    """Removes ``root/name`` and everything in it, a budget at a time (see the module doc).

    Usage (one thread at a time; the lister drives it from a worker thread)::

        remover = TreeRemover("/usr/local/vgpu/containers", "podUID_ctr")
        while not remover.step(Budget(ops=20_000, seconds=0.1)):
            ...                               # the next tick
        remover.outcome                       # "removed" or "failed"
        remover.drain_failures()              # Failure(path, reason) since the last drain
        remover.close()                       # always: closes every descriptor

    Args:
        root: the directory that holds the tree (the containers directory); trusted.
        name: the tree's name in ``root`` (one component).
        expect_ino: the inode the caller listed for ``name``; another one is refused.
        max_depth: directories held open at once (>= 2).
        max_failures: failed entries remembered before the removal gives up.
        clock: monotonic seconds, for the budget.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str,
        *,
        expect_ino: int | None = None,
        max_depth: int = MAX_DEPTH,
        max_failures: int = MAX_FAILURES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a directory entry name: {name!r}")
        self._root = os.fspath(root)
        self._name = name
        self._expect_ino = expect_ino
        self._max_depth = max_depth
        self._max_failures = max_failures
        self._clock = clock
        self._root_fd = -1
        self._dev = 0
        self._mnt: int | None = None
        self._frames: list[_Frame] = []
        self._failed: set[tuple[int, int]] = set()
        self._reported: list[Failure] = []
        self._dropped = 0
        self._moved = 0
        self._started = False
        self.outcome: str | None = None
        """None while running; then ``"removed"`` (nothing left) or ``"failed"``."""
        self.failures = 0
        """Entries that could not be removed so far."""
        self.removed = 0
        """Entries removed so far (files, links, directories)."""

    @property
    def name(self) -> str:
        """The tree's name in the containers directory."""
        return self._name

    @property
    def inode(self) -> int | None:
        """The inode it removes: the one the caller listed, else the one it opened (None
        before it opened one)."""
        if self._expect_ino is not None:
            return self._expect_ino
        return self._frames[0].ino if self._frames else None

    @property
    def path(self) -> str:
        """The tree's path, for messages."""
        return os.path.join(self._root, self._name)

    @property
    def open_directories(self) -> int:
        """Directories of the walk open now (at most ``max_depth``)."""
        return len(self._frames)

    # -- results ---------------------------------------------------------------------------

    def drain_failures(self) -> tuple[list[Failure], int]:
        """The failures recorded since the last call (at most :data:`MAX_REPORTED`) and how
        many more were recorded but not kept."""
        reported, self._reported = self._reported, []
        dropped, self._dropped = self._dropped, 0
        return reported, dropped

    def _display(self, name: str | None = None) -> str:
        parts = [self._root] + [frame.name for frame in self._frames]
        if name is not None:
            parts.append(name)
        return "/".join(parts)

    def _record(self, frame: _Frame | None, name: str | None, reason: str) -> None:
        self.failures += 1
        if frame is not None:
            frame.failed = True
        if len(self._reported) < MAX_REPORTED:
            self._reported.append(Failure(self._display(name), reason))
        else:
            self._dropped += 1

    def _remember(self, key: tuple[int, int]) -> None:
        self._failed.add(key)
        if len(self._failed) > self._max_failures:
            self._finish(
                "failed", f"more than {self._max_failures} entries could not be removed; stopping"
            )

    def _finish(self, outcome: str, reason: str | None = None) -> None:
        if reason is not None:
            self._record(None, None, reason)
        self.outcome = outcome
        self._close_frames()

    # -- the walk --------------------------------------------------------------------------

    def step(self, budget: Budget | Allowance) -> bool:
        """Do at most ``budget`` of the removal (an :class:`Allowance`: what is left of it).

        Returns:
            True once the removal has ended (see :attr:`outcome`); False when the budget ran
            out first (call again to resume).
        """
        if self.outcome is not None:
            return True
        meter = budget if isinstance(budget, Allowance) else Allowance(budget, self._clock)
        if not self._started:
            self._started = True
            self._open_top()
        while not self._ended():
            if meter.exhausted():
                return False
            frame = self._frames[-1]
            if not self._scan(frame, meter):
                if not self._frames or self._frames[-1] is not frame:
                    continue  # descended (or ended)
                return False  # out of budget in the middle of the directory
            meter.spend()
            self._leave(frame)
        return True

    def _ended(self) -> bool:
        # A method, not the attribute: every call below may end the removal.
        return self.outcome is not None

    def _open_top(self) -> None:
        try:
            self._root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            root_st = os.fstat(self._root_fd)
        except OSError as exc:
            self._finish("failed", f"cannot open the containers directory: {self._reason(exc)}")
            return
        self._dev = root_st.st_dev
        self._mnt = mount_id(self._root_fd)
        try:
            fd = os.open(self._name, _DIR_FLAGS, dir_fd=self._root_fd)
        except FileNotFoundError:
            self._finish("removed")  # nothing left to remove
            return
        except OSError as exc:
            self._finish("failed", f"cannot open it: {self._reason(exc)}")
            return
        ino, problem = self._identify(fd, self._expect_ino)
        if problem is not None:
            os.close(fd)
            self._finish("failed", problem)
            return
        self._frames.append(_Frame(fd, self._name, ino))

    def _identify(self, fd: int, expect_ino: int | None) -> tuple[int, str | None]:
        """The inode of the directory open on ``fd``, and why it must not be entered."""
        try:
            st = os.fstat(fd)
        except OSError as exc:
            return -1, f"cannot stat it: {self._reason(exc)}"
        if st.st_dev != self._dev:
            return st.st_ino, "a mount point (another file system): not crossing it"
        if self._mnt is not None and mount_id(fd) != self._mnt:
            return st.st_ino, "a mount point (another mount): not crossing it"
        if expect_ino is not None and st.st_ino != expect_ino:
            return st.st_ino, "replaced by another directory since it was listed"
        return st.st_ino, None

    @staticmethod
    def _reason(exc: OSError) -> str:
        return exc.strerror or str(exc)

    def _scan(self, frame: _Frame, meter: Allowance) -> bool:
        """Handle ``frame``'s entries until it is done (True), a subdirectory was entered or
        the budget ran out (False)."""
        if frame.entries is None:
            try:
                frame.entries = os.scandir(frame.fd)
            except OSError as exc:
                self._record(frame, None, f"cannot list it: {self._reason(exc)}")
                return True
        entries = frame.entries
        while True:
            entry, frame.pending = frame.pending, None
            if entry is None:
                try:
                    entry = next(entries)
                except StopIteration:
                    return True
                except OSError as exc:
                    self._record(frame, None, f"cannot list it: {self._reason(exc)}")
                    return True
            key = (self._dev, entry.inode())
            if key in self._failed:
                continue
            if meter.exhausted():
                frame.pending = entry  # handled first by the next step
                return False
            meter.spend()
            name = entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False  # cannot even lstat it: try to unlink it, which says why
            if not is_dir:
                self._unlink(frame, name, key)
            elif len(self._frames) >= self._max_depth:
                self._move_up(frame, name, key)
            elif self._enter(frame, name, key):
                return False
            if self.outcome is not None:
                return False

    def _unlink(self, frame: _Frame, name: str, key: tuple[int, int]) -> None:
        try:
            os.unlink(name, dir_fd=frame.fd)
        except FileNotFoundError:
            return
        except IsADirectoryError:
            return  # swapped for a directory since it was listed: the rescan enters it
        except OSError as exc:
            self._record(frame, name, f"cannot unlink it: {self._reason(exc)}")
            self._remember(key)
            return
        self.removed += 1

    def _enter(self, frame: _Frame, name: str, key: tuple[int, int]) -> bool:
        """Open subdirectory ``name`` and push it; False when it was not entered."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=frame.fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                # Swapped for a symlink, FIFO, device or file since it was listed: it was
                # not opened (O_NOFOLLOW | O_DIRECTORY); remove the name instead.
                self._unlink(frame, name, key)
                return False
            self._record(frame, name, f"cannot open it: {self._reason(exc)}")
            self._remember(key)
            return False
        ino, problem = self._identify(fd, key[1])
        if problem is not None:
            # A mount point, or a swap between the listing and the open: not entered, and
            # remembered so that the walk ends (the directory is retried later as a whole).
            os.close(fd)
            self._record(frame, name, problem)
            self._remember(key)
            return False
        self._frames.append(_Frame(fd, name, ino))
        return True

    def _move_up(self, frame: _Frame, name: str, key: tuple[int, int]) -> None:
        """Move a subdirectory found at the depth limit to the top of the tree."""
        top = self._frames[0]
        last: OSError | None = None
        for _ in range(_MOVE_ATTEMPTS):
            # Unpredictable, so that a tenant cannot take every name in advance.
            target = f"{MOVED_PREFIX}{secrets.token_hex(8)}"
            if self._taken(top.fd, target):
                continue  # rename would replace an empty directory the walk has listed
            try:
                os.rename(name, target, src_dir_fd=frame.fd, dst_dir_fd=top.fd)
            except FileNotFoundError:
                return
            except OSError as exc:
                last = exc
                if exc.errno in _IN_THE_WAY:
                    continue  # a tenant's entry holds that name: try the next one
                break
            self._moved += 1
            return
        why = self._reason(last) if last is not None else "no free name"
        self._record(frame, name, f"cannot move it up: {why}")
        self._remember(key)

    @staticmethod
    def _taken(dir_fd: int, name: str) -> bool:
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def _leave(self, frame: _Frame) -> None:
        """``frame`` has been scanned to its end: remove it (or find out why not) and pop."""
        frame.close_entries()
        depth = len(self._frames)
        parent = self._frames[-2] if depth > 1 else None
        parent_fd = parent.fd if parent is not None else self._root_fd
        if frame.failed:
            self._pop_failed(frame, parent)
            return
        try:
            st = os.stat(frame.name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            self._record(frame, None, f"cannot stat it: {self._reason(exc)}")
            self._pop_failed(frame, parent)
            return
        if st is None or st.st_ino != frame.ino or st.st_dev != self._dev:
            # Moved away or replaced under that name since it was entered.  Below the top,
            # the rescan of the parent finds whatever is there now (and the moved directory
            # wherever it is in the tree); the top itself is the lister's business.
            self._frames.pop().close()
            if parent is None:
                if st is None:
                    self._finish("removed")
                else:
                    self._finish("failed", "replaced while it was being removed")
            return
        try:
            os.rmdir(frame.name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in _NOT_EMPTY:
                return  # something appeared or was missed: scan it again (frame stays)
            self._record(frame, None, f"cannot remove it: {self._reason(exc)}")
            self._pop_failed(frame, parent)
            return
        else:
            self.removed += 1
        self._frames.pop().close()
        if parent is None:
            self._finish("removed")

    def _pop_failed(self, frame: _Frame, parent: _Frame | None) -> None:
        self._frames.pop().close()
        if parent is None:
            self._finish("failed")
            return
        parent.failed = True
        self._remember((self._dev, frame.ino))

    # -- clean-up --------------------------------------------------------------------------

    def _close_frames(self) -> None:
        while self._frames:
            self._frames.pop().close()
        if self._root_fd >= 0:
            fd, self._root_fd = self._root_fd, -1
            os.close(fd)

    def close(self) -> None:
        """Close every descriptor; an unfinished removal cannot be resumed afterwards (start
        a new one: it continues with whatever is left)."""
        self._close_frames()


@dataclass(slots=True)
class QueuedStep:
    """One step over a queue of trees: its input, and what :func:`remove_queued` did.

    The caller builds it (the tree left open by the last step, the queued trees it may take
    on), runs :func:`remove_queued` on it (in a worker thread) and then reads it, also when
    that raised: every removal that ended is in ``ended`` (closed), the one the budget ran
    out in (or that raised) is ``current`` (open: the next step resumes it, or the caller
    closes it) or ``parked`` (closed; queue it behind the others), and ``queued[taken:]``
    were not begun.
    """

    root: str
    current: TreeRemover | None
    queued: list[tuple[str, int | None]]
    taken: int = 0
    ended: list[TreeRemover] = field(default_factory=list)
    parked: TreeRemover | None = None


def remove_queued(
    step: QueuedStep,
    budget: Budget,
    *,
    clock: Callable[[], float] = time.monotonic,
    max_trees: int = MAX_TREES_PER_STEP,
) -> None:
    """Spend ``budget`` on ``step.current`` and then on the queued trees in order.

    One tree is open at a time: a tree is begun only once the one before it has ended, so
    the descriptors held are those of one :class:`TreeRemover`.  Beginning a tree costs one
    unit of the budget; at most ``max_trees`` are begun.  Each tree keeps every rule of
    :class:`TreeRemover` (the inode the caller listed is checked when it is opened).

    When the budget runs out in a tree while queued trees were not begun, that tree is
    closed and becomes ``step.parked``: a huge tree then delays the others by at most about
    one budget, instead of until it is gone.  Begun again later (same inode check), it goes
    on with what is left; only the failures it remembered are tried once more.
    """
    allowance = Allowance(budget, clock)
    begun = 0
    while True:
        remover = step.current
        if remover is None:
            if step.taken >= len(step.queued) or begun >= max_trees:
                return
            allowance.check_clock()  # a tree's files can be slow to free: at each tree
            if allowance.exhausted():
                return
            name, ino = step.queued[step.taken]
            remover = step.current = TreeRemover(step.root, name, expect_ino=ino, clock=clock)
            step.taken += 1
            begun += 1
            allowance.spend()
        if not remover.step(allowance):
            # The budget ran out in this tree: it stays open for the next step, unless
            # others wait behind it.
            if step.taken < len(step.queued):
                step.current = None
                remover.close()
                step.parked = remover
            return
        step.current = None
        remover.close()
        step.ended.append(remover)


class RemovalQueue:
    """Gone pods' directories scheduled for removal, removed beside the tick.

    The lister :meth:`schedule`-s a directory (it reads and writes it no more from then on)
    and :meth:`wake`-s the queue after each tick; :meth:`serve` then runs one budgeted
    :meth:`step` (in a worker thread) over as many queued directories as the budget covers.
    Each removal that ends is logged and reported to ``on_removal``; a directory it could not
    remove completely leaves :attr:`scheduled`, so the tick decides about it again.

    Args:
        root: the containers directory the names are in.
        budget: the work of one step (default :class:`Budget`).
        on_removal: called with ``"removed"`` or ``"failed"`` each time a removal ends (the
            self-metrics counter).
        log_interval: seconds between two log lines about the same directory.
    """

    def __init__(
        self,
        root: str,
        *,
        budget: Budget | None = None,
        on_removal: Callable[[str], None] | None = None,
        log_interval: float = 60.0,
    ) -> None:
        self._root = root
        self._budget = budget if budget is not None else Budget()
        self._on_removal = on_removal
        self._limiter = RateLimiter(log_interval, max_keys=4096)
        # Directories scheduled for removal (the tick skips them) in order, with the inode
        # the tick listed, and the one being removed now.
        self._removing: set[str] = set()
        self._queue: deque[tuple[str, int | None]] = deque()
        # trio.current_time() at which each pending one was scheduled, in that order.
        self._since: dict[str, float] = {}
        self._remover: TreeRemover | None = None
        self._wanted = trio.Event()

    @property
    def scheduled(self) -> AbstractSet[str]:
        """The names scheduled and not yet finished (the tick neither reads nor writes them)."""
        return self._removing

    def schedule(self, name: str, inode: int | None) -> None:
        """Queue ``name`` for removal; ``inode``: what the tick listed (checked at opening)."""
        self._removing.add(name)
        self._queue.append((name, inode))
        self._since[name] = trio.current_time()

    def wake(self) -> None:
        """Let :meth:`serve` run one step, if anything is scheduled (after each tick)."""
        if self._removing:
            self._wanted.set()

    @property
    def pending(self) -> int:
        """Directories scheduled for removal and not yet finished (the current one included)."""
        return len(self._removing)

    def oldest_age(self) -> float:
        """Seconds (``trio.current_time()``) since the longest-waiting pending removal was
        scheduled; 0 when none is pending."""
        for since in self._since.values():  # in scheduling order: the first is oldest
            return max(0.0, trio.current_time() - since)
        return 0.0

    @property
    def in_progress(self) -> bool:
        """True while one removal's descriptors are open (between two steps of it)."""
        return self._remover is not None

    async def serve(self) -> None:
        """Run the removals, one budgeted step after each :meth:`wake`; never returns.

        A step spends its budget on as many queued directories as it covers, one after the
        other (:func:`remove_queued`).

        Run it in the nursery of whoever ticks the lister (the Monitor does); cancelling it
        waits for at most one step's budget (a worker thread cannot be interrupted).
        """
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            await self.step()

    async def step(self) -> bool:
        """One budgeted step over the queued removals, in a worker thread.

        Returns:
            True while removals remain scheduled.
        """
        if self._remover is None and not self._queue:
            return False
        queue = self._queue
        taken = [queue.popleft() for _ in range(min(len(queue), MAX_TREES_PER_STEP))]
        step = QueuedStep(self._root, self._remover, taken)
        self._remover = None
        try:
            await trio.to_thread.run_sync(remove_queued, step, self._budget)
        finally:
            # Also when it raised: the ended ones are reported, the rest go back in order.
            queue.extendleft(reversed(taken[step.taken :]))
            for ended in step.ended:
                self._ended(ended)
            if step.current is not None:
                self._report_failures(step.current)
                self._remover = step.current
            if step.parked is not None:  # a huge one: behind those queued since
                self._report_failures(step.parked)
                queue.append((step.parked.name, step.parked.inode))
        return bool(self._removing)

    def _ended(self, remover: TreeRemover) -> None:
        self._report_failures(remover)
        self._removing.discard(remover.name)
        self._since.pop(remover.name, None)
        outcome = remover.outcome or "failed"
        if outcome == "removed":
            logger.info("removed %s (%d entries)", remover.path, remover.removed)
        else:
            self._limiter.log(
                logger,
                logging.WARNING,
                ("removal", remover.name),
                "could not remove all of %s: %d entries not removed (removed %d); the "
                "tick decides again (once it is older than the resync interval)",
                remover.path,
                remover.failures,
                remover.removed,
            )
        if self._on_removal is not None:
            self._on_removal(outcome)

    def _report_failures(self, remover: TreeRemover) -> None:
        failures, dropped = remover.drain_failures()
        for failure in failures:
            self._limiter.log(
                logger,
                logging.WARNING,
                ("remove", remover.name, failure.reason),
                "removing %s: not removed: %r: %s",
                remover.path,
                failure.path,
                failure.reason,
            )
        if dropped:
            self._limiter.log(
                logger,
                logging.WARNING,
                ("remove-more", remover.name),
                "removing %s: %d more entries not removed",
                remover.path,
                dropped,
            )

    def stop(self) -> None:
        """Close the current removal's descriptors; the next :meth:`serve` step resumes it
        (from what is left)."""
        remover, self._remover = self._remover, None
        if remover is not None:
            remover.close()
            self._queue.appendleft((remover.name, None))
