"""What each container's pod gives it, for the feedback; and the files that claim more.

How this works: with Kubernetes the agent hands the monitor ``grants_of(pod)`` - container
name -> :class:`~hami_trio.monitor.feedback.Grant`, from the pod's allocation entry and the
priority its spec sets, or None for a pod without a usable annotation.  Every tick
:meth:`FeedbackScope.grants` returns the grants of the loaded containers' pods (computed once
per ``PodInfo`` object); a container its pod's entry gives nothing is counted on no GPU.
Without Kubernetes, or for an unknown or unannotated pod, the file counts alone, as upstream.

:meth:`FeedbackScope.note` compares every file with its grant: a file that claims a UUID its
allocation does not list (``uuid``) or another priority than its pod spec (``priority``)
makes a *stray claim*: the feedback counts the container as its pod says
(:func:`~hami_trio.monitor.feedback.scoped`), :class:`StrayStats` counts it, one warning a
container and reason per ten minutes names it, and :meth:`FeedbackScope.claim` shows it in
the debug view.  docs/monitor.md (Feedback: whose GPUs, whose priority).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from hami_trio.logs import RateLimiter
from hami_trio.monitor.feedback import Grant, Observable, scoped, strays
from hami_trio.monitor.state import ContainerKey
from hami_trio.pods.source import PodInfo, PodSource

__all__ = [
    "STRAY_REASONS",
    "Claim",
    "FeedbackScope",
    "GrantsOf",
    "StrayReason",
    "StrayStats",
    "uuid_text",
]

logger = logging.getLogger(__name__)

#: What the agent passes in: a pod -> its containers' grants (None: no usable allocation).
GrantsOf = Callable[[PodInfo], Mapping[str, Grant] | None]
#: Why a file's claim is not counted as it stands (the ``reason`` label).
StrayReason = Literal["uuid", "priority"]
STRAY_REASONS: tuple[StrayReason, ...] = get_args(StrayReason)

#: The grant of a container that an annotated pod's allocation gives nothing.
_NOTHING: Final = Grant(devices=())
#: Seconds between two warnings about one container and reason.
_LOG_INTERVAL: Final = 600.0
_SHOWN_UUIDS: Final = 4


def uuid_text(raw: bytes) -> str:
    """A UUID slot value for people: the bytes before the trailing NULs, printable ASCII
    only (anything else - a NUL inside, a control or format character, a byte that is not
    UTF-8 - escaped as ``\\xNN``, ``\\uNNNN``)."""
    text = raw.rstrip(b"\0").decode("utf-8", "backslashreplace")
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)


@dataclass(frozen=True, slots=True)
class Claim:
    """How the feedback counted one container in the latest tick (the debug view's entry).

    Attributes:
        scoped: a pod grant applied; False: the file alone counted, as upstream.
        devices: the UUIDs the pod's allocation gives it (None: not known).
        counted: the UUIDs it was counted on (one per UUID slot that counts).
        priority: the priority it was counted with (the pod spec's, else the file's).
        file_priority: the priority its file says.
        strays: the UUIDs its file claims that ``devices`` does not list.
        stray_reasons: why the claim was not counted as it stands (``uuid``, ``priority``).
    """

    scoped: bool
    devices: tuple[str, ...] | None
    counted: tuple[str, ...]
    priority: int
    file_priority: int
    strays: tuple[str, ...]
    stray_reasons: tuple[StrayReason, ...]


def _reasons(container: Observable, grant: Grant) -> tuple[StrayReason, ...]:
    uuid = grant.devices is not None and not grant.allowed.issuperset(container.device_keys)
    priority = grant.priority is not None and grant.priority != container.priority
    if uuid:
        return ("uuid", "priority") if priority else ("uuid",)
    return ("priority",) if priority else ()


class StrayStats:
    """The stray claims, counted by :class:`FeedbackScope` on the trio thread and read by
    :class:`~hami_trio.monitor.stats.StrayCollector` at scrape time.

    Attributes:
        containers: per reason, the containers making such a claim as of the latest tick.
        claims: per reason, the times a container started making one.
    """

    __slots__ = ("claims", "containers")

    def __init__(self) -> None:
        self.containers: dict[str, int] = dict.fromkeys(STRAY_REASONS, 0)
        self.claims: dict[str, int] = dict.fromkeys(STRAY_REASONS, 0)


class FeedbackScope:
    """The grants of the loaded containers and their stray claims (module docstring).

    Args:
        pods: the monitor's pod source.
        grants_of: the agent's reading of a pod; None: no grants (without Kubernetes).
        stats: where the stray claims are counted (``hami_trio_monitor_stray_claim_containers``
            and ``..._claims_total``, exported by :class:`~hami_trio.monitor.stats.StrayCollector`).
        clock: for the warnings' rate limit (``trio.current_time`` in the monitor).
    """

    def __init__(
        self,
        pods: PodSource,
        grants_of: GrantsOf | None,
        stats: StrayStats,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._pods = pods
        self._grants_of = grants_of
        # pod UID -> (the PodInfo, its grants): the pods of the latest tick's containers.
        self._cache: dict[str, tuple[PodInfo, Mapping[str, Grant] | None]] = {}
        # Replaced, never changed, once published (the debug view reads it from a thread).
        self._grants: Mapping[ContainerKey, Grant] = {}
        self._flagged: dict[ContainerKey, tuple[StrayReason, ...]] = {}
        self._limiter = RateLimiter(_LOG_INTERVAL, max_keys=4096, clock=clock)
        self._stats = stats

    @property
    def enabled(self) -> bool:
        """Whether pods give grants at all (False without Kubernetes)."""
        return self._grants_of is not None

    def grants(self, keys: Iterable[ContainerKey]) -> dict[ContainerKey, Grant]:
        """The grant of each container of ``keys`` that has one (module docstring)."""
        grants_of = self._grants_of
        if grants_of is None:
            return {}
        lookup = self._pods.lookup
        cache = self._cache
        seen: dict[str, tuple[PodInfo, Mapping[str, Grant] | None] | None] = {}
        found: dict[ContainerKey, Grant] = {}
        for key in keys:
            uid = key.pod_uid
            if uid in seen:
                entry = seen[uid]
            else:
                pod = lookup(uid)
                if pod is None:
                    entry = None
                else:
                    entry = cache.get(uid)
                    if entry is None or entry[0] is not pod:
                        entry = (pod, grants_of(pod))
                seen[uid] = entry
            if entry is not None and entry[1] is not None:
                found[key] = entry[1].get(key.container_name, _NOTHING)
        self._cache = {uid: entry for uid, entry in seen.items() if entry is not None}
        return found

    def update(self, containers: Mapping[ContainerKey, Observable]) -> dict[ContainerKey, Grant]:
        """One tick: :meth:`grants` of ``containers``, then :meth:`note`.

        Returns:
            The grants of the stray claims only: what :func:`observe` needs, since a grant
            that agrees with its file changes nothing (the same writes as all grants).
        """
        return self.note(containers, self.grants(containers))

    def note(
        self, containers: Mapping[ContainerKey, Observable], grants: Mapping[ContainerKey, Grant]
    ) -> dict[ContainerKey, Grant]:
        """Publish this tick's grants and count, log and remember its stray claims.

        Returns:
            The grants of the containers whose files claim more than them.
        """
        flagged: dict[ContainerKey, tuple[StrayReason, ...]] = {}
        changed: dict[ContainerKey, Grant] = {}
        get = containers.get
        for key, grant in grants.items():
            container = get(key)
            if container is None:
                continue
            priority = grant.priority
            if (grant.devices is None or grant.allowed.issuperset(container.device_keys)) and (
                priority is None or priority == container.priority
            ):
                continue  # the file says what the pod says
            reasons = _reasons(container, grant)
            flagged[key] = reasons
            changed[key] = grant
            before = self._flagged.get(key, ())
            for reason in reasons:
                if reason not in before:
                    self._stats.claims[reason] += 1
                    self._warn(key, reason, container, grant)
        making = self._stats.containers
        for reason in STRAY_REASONS:
            making[reason] = sum(1 for reasons in flagged.values() if reason in reasons)
        self._flagged = flagged
        self._grants = grants
        return changed

    def _warn(
        self, key: ContainerKey, reason: StrayReason, container: Observable, grant: Grant
    ) -> None:
        if self._limiter.check((key, reason)) is None:
            return
        entry = self._cache.get(key.pod_uid)
        pod = entry[0] if entry is not None else None
        name = (
            f"{pod.namespace}/{pod.name}/{key.container_name}" if pod is not None else key.dirname
        )
        if reason == "uuid":
            claimed = [uuid_text(raw) for raw in strays(container, grant)]
            shown = ", ".join(claimed[:_SHOWN_UUIDS]) + (
                " ..." if len(claimed) > _SHOWN_UUIDS else ""
            )
            allocated = ", ".join(uuid_text(raw) for raw in (grant.devices or ())[:_SHOWN_UUIDS])
            logger.warning(
                "container %s: its .cache file claims GPU %s, which its pod's allocation does "
                "not list; the feedback counts it only on its allocated %s",
                name,
                shown,
                allocated or "(none)",
                extra={"event": "feedback_stray_claim", "reason": reason, "container": name},
            )
        else:
            logger.warning(
                "container %s: its .cache file says priority %d, its pod spec %d; the "
                "feedback counts %d",
                name,
                container.priority,
                grant.priority,
                grant.priority,
                extra={"event": "feedback_stray_claim", "reason": reason, "container": name},
            )

    def claim(self, key: ContainerKey, container: Observable) -> Claim:
        """How the latest tick counted ``container`` (its snapshot of that tick)."""
        grant = self._grants.get(key)
        keys = container.device_keys
        if grant is None:
            counted = tuple(uuid_text(raw) for raw in keys)
            return Claim(False, None, counted, container.priority, container.priority, (), ())
        view = scoped(container, grant)
        return Claim(
            True,
            None if grant.devices is None else tuple(uuid_text(raw) for raw in grant.devices),
            tuple(uuid_text(raw) for raw in view.device_keys),
            view.priority,
            container.priority,
            tuple(uuid_text(raw) for raw in strays(container, grant)),
            _reasons(container, grant),
        )
