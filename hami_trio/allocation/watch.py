"""The agent's read-only check of the shared lock parent: gauges and a rate-limited warning.

How this works: a Go device plugin cannot export the refusal counter and a refusal only
shows when the next pod fails, so the agent looks at ``/tmp/vgpulock`` itself every monitor
interval with :func:`~hami_trio.allocation.lockdir.inspect_lock_parent` (``O_PATH`` and
``fstat`` only: nothing created, chmodded or followed), exports ``hami_trio_lock_parent_ok``
and ``hami_trio_lock_parent_unsafe{reason}``, and warns with the recovery command the first
time and then at most every ``warn_interval`` seconds (at once when the reason changes).
With the broker on it also exports whether the nested mount point ``hostpid`` carries the
immutable flag (``hami_trio_lock_mount_point_immutable``) and warns once each time it is
found without it.  Readiness does not depend on it.  With ``prepare`` (``--prepare-lock-parent``)
the agent first prepares the directory like an allocation, before any tenant runs: with the
broker on that makes ``hostpid`` immutable, and :class:`MountPointCheck` is an informational
readiness line that fails while it is not.  docs/allocation.md (Watching it from the agent).
"""

from __future__ import annotations

import logging
from typing import Final

import trio
from prometheus_client import CollectorRegistry, Gauge

from hami_trio.allocation.lockdir import (
    MOUNT_POINT_NAME,
    REFUSAL_REASONS,
    LockParentRefused,
    LockParentState,
    MountPointState,
    inspect_lock_parent,
    prepare_lock_dir,
)
from hami_trio.logs import RateLimiter

__all__ = [
    "DEFAULT_WARN_INTERVAL",
    "LockParentWatch",
    "MountPointCheck",
    "serve_lock_parent_watch",
]

logger = logging.getLogger(__name__)

#: How often a lasting unsafe state is warned about again (seconds).
DEFAULT_WARN_INTERVAL: Final = 600.0


class LockParentWatch:
    """One lock parent's state, its gauges and its warnings; :meth:`check` looks again.

    Args:
        path: the lock parent as the agent sees it (``--lock-parent-path``).
        owner: the trusted UID (root; the agent's own UID in tests).
        broker: also check the nested mount point ``hostpid`` (the broker is on).
        registry: where the gauges go.
        warn_interval: seconds between repeated warnings about the same reason.
    """

    def __init__(
        self,
        path: str,
        *,
        owner: int,
        broker: bool,
        registry: CollectorRegistry,
        warn_interval: float = DEFAULT_WARN_INTERVAL,
    ) -> None:
        self.path = path
        self._owner = owner
        self._broker = broker
        self._limiter = RateLimiter(warn_interval, clock=trio.current_time)
        self._ok = Gauge(
            "hami_trio_lock_parent_ok",
            "1 while the shared lock parent (/tmp/vgpulock) is safe or not created yet, 0 "
            "while it is unsafe and allocations on this node will be refused.",
            registry=registry,
        )
        self._unsafe = Gauge(
            "hami_trio_lock_parent_unsafe",
            "1 for the reason the shared lock parent is unsafe, 0 for every other reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REFUSAL_REASONS:
            self._unsafe.labels(reason=reason).set(0)
        self._ok.set(1)
        self._immutable: Gauge | None = None
        if broker:
            self._immutable = Gauge(
                "hami_trio_lock_mount_point_immutable",
                "1 while the broker's nested mount point (/tmp/vgpulock/hostpid) carries the "
                "immutable flag, 0 while a root workload could rename or replace it.",
                registry=registry,
            )
        self.state = LockParentState("missing")
        self._was_unsafe = False
        self._mount_point: MountPointState = "off"
        #: Why the last :meth:`prepare` left ``hostpid`` without the flag, or was refused.
        self.prepare_problem = ""

    def prepare(self) -> None:
        """Prepare the lock parent once, like an allocation (the agent's start).

        A refusal is logged (with the recovery) and not raised: the agent works either way,
        and the checks that follow export it.  Where the flag cannot be set,
        :func:`~hami_trio.allocation.lockdir.prepare_lock_dir` logs it and counts it.
        """
        try:
            prepared = prepare_lock_dir(self.path, self._owner, broker=self._broker)
        except LockParentRefused as exc:
            self.prepare_problem = str(exc)
            logger.warning(
                "preparing the shared lock parent at start was refused (%s): %s",
                exc.reason,
                exc,
                extra={"event": "lock_parent_prepare_refused", "reason": exc.reason},
            )
            return
        self.prepare_problem = prepared.problem

    def check(self) -> LockParentState:
        """Look at the directory once, update the gauges and log; never raises OSError."""
        state = inspect_lock_parent(self.path, self._owner, broker=self._broker)
        previous, self.state = self.state, state
        for reason in REFUSAL_REASONS:
            self._unsafe.labels(reason=reason).set(1 if reason == state.reason else 0)
        self._ok.set(0 if state.state == "unsafe" else 1)
        self._report_mount_point(state.mount_point)
        if state.state == "unsafe":
            self._was_unsafe = True
            suppressed = self._limiter.check(state.reason)
            if suppressed is not None or previous.reason != state.reason:
                logger.warning(
                    "shared lock parent unsafe (%s), allocations on this node will be refused: %s",
                    state.reason,
                    state.message,
                    extra={"event": "lock_parent_unsafe", "reason": state.reason},
                )
        elif self._was_unsafe:
            self._was_unsafe = False
            logger.info(
                "shared lock parent %s is %s",
                self.path,
                "safe again" if state.state == "ok" else "gone (not prepared yet)",
                extra={"event": "lock_parent_recovered"},
            )
        return state

    def _report_mount_point(self, found: MountPointState) -> None:
        if self._immutable is None:
            return
        self._immutable.set(1 if found == "immutable" else 0)
        if found == "immutable":
            self.prepare_problem = ""  # an allocation since has set it
        previous, self._mount_point = self._mount_point, found
        if found in ("off", "missing", "immutable") or found == previous:
            return  # missing: the next preparation creates it, flagged
        where = f"{self.path}/{MOUNT_POINT_NAME}"
        owner = f" --owner {self._owner}" if self._owner else ""
        logger.warning(
            "nested mount point %s is not immutable (%s): a root workload holding only the "
            "parent mount can rename or replace it and break the broker mount of the next "
            "containers on this node; run `%s` as root on the node (it sets the flag where the "
            "filesystem supports it)",
            where,
            found,
            f"hami-trio prepare-lock-dir --broker{owner} {self.path}",
            extra={"event": "lock_mount_point_not_immutable", "reason": found},
        )


class MountPointCheck:
    """Readiness line ``lock-mount-point``: fails while ``hostpid`` is not immutable.

    Informational (see :func:`~hami_trio.metrics.endpoint.make_handler`): a node whose filesystem
    cannot hold the flag still serves its metrics; the line says why.
    """

    informational = True

    def __init__(self, watch: LockParentWatch) -> None:
        self._watch = watch

    def __call__(self) -> bool:
        return self._watch.state.mount_point == "immutable"

    def reason(self) -> str:
        state = self._watch.state
        if self._watch.prepare_problem:
            return self._watch.prepare_problem
        if state.state == "unsafe":
            return state.message
        return f"{self._watch.path}/{MOUNT_POINT_NAME} is {state.mount_point}, not immutable"


async def serve_lock_parent_watch(
    watch: LockParentWatch,
    interval: float,
    *,
    prepare: bool = False,
    task_status: trio.TaskStatus[LockParentWatch] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Check once, report started, then check every ``interval`` seconds until cancelled.

    With ``prepare``, :meth:`LockParentWatch.prepare` runs first (the agent's start).
    """
    if prepare:
        watch.prepare()
    watch.check()
    task_status.started(watch)
    while True:
        await trio.sleep(interval)
        watch.check()
