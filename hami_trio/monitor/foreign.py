"""Another monitor writing feedback into the same regions: told from the control words alone.

How this works: between two ticks only this monitor (whose writes are known) and HAMi-core
may change a region's control words, and HAMi-core stores exactly two values:
``recent_kernel = 2`` on every kernel launch and, when it initialises a region,
``utilization_switch = 1`` together with it.  After each tick the monitor records the value
it left in each word; at the next tick a word holding anything else was changed by a third
party - on a node being cut over, HAMi's own vGPUmonitor.

One odd value proves little (a region re-created between two ticks, a write racing a
launch), so the verdict needs unexplained changes on :data:`FIRE_TICKS` of the last
:data:`WINDOW` ticks, and clears after :data:`CLEAR_TICKS` quiet ticks in a row.  The
detector never changes what the monitor writes: two monitors that fight only make the
tenants' feedback worse.  A quiet node gives a second monitor nothing to change, so nothing
is seen there.  No I/O here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from hami_trio.monitor.feedback import Write
from hami_trio.monitor.layout import ControlField

__all__ = [
    "CLEAR_TICKS",
    "FIRE_TICKS",
    "WINDOW",
    "ControlWords",
    "ForeignWriterDetector",
    "Unexplained",
]

K = TypeVar("K", bound=Hashable)

#: Ticks looked back over, and how many of them must show an unexplained change to fire.
WINDOW = 6
FIRE_TICKS = 2
#: Ticks in a row without an unexplained change before the verdict clears (a minute at 5 s).
CLEAR_TICKS = 12

#: The only values HAMi-core itself stores into the control words.
_LAUNCH = 2
_INIT_SWITCH = 1


class ControlWords(Protocol):
    """What the detector reads of a container at a tick (a ``UsageSnapshot`` qualifies)."""

    @property
    def recent_kernel(self) -> int: ...

    @property
    def utilization_switch(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Unexplained(Generic[K]):
    """A control word that held neither what this monitor left nor a value of HAMi-core's."""

    key: K
    field: ControlField
    left: int
    found: int


def _explained(left: tuple[int, int], recent: int, switch: int) -> bool:
    left_recent, left_switch = left
    if recent == _LAUNCH and switch == _INIT_SWITCH:
        return True  # a region HAMi-core (re)initialised, or a launch with the switch as left
    return (recent in (left_recent, _LAUNCH)) and switch == left_switch


class ForeignWriterDetector(Generic[K]):
    """Per-container expectations of the control words and the verdict over recent ticks.

    Call :meth:`check` with a tick's read values before its writes, then :meth:`record` with
    the writes that were applied; :attr:`active` is the verdict.
    """

    __slots__ = ("_active", "_history", "_left", "_quiet", "last_seen")

    def __init__(self) -> None:
        self._left: dict[K, tuple[int, int]] = {}
        self._history: deque[bool] = deque(maxlen=WINDOW)
        self._quiet = 0
        self._active = False
        #: The unexplained changes of the latest tick that had any (for the log line).
        self.last_seen: tuple[Unexplained[K], ...] = ()

    @property
    def active(self) -> bool:
        """True while another writer is judged to be changing the control words."""
        return self._active

    def check(self, containers: Mapping[K, ControlWords]) -> tuple[Unexplained[K], ...]:
        """Compare a tick's values with what the previous tick left; update the verdict.

        Containers new to this tick, or whose words the previous tick did not record, are
        not judged.

        Returns:
            This tick's unexplained changes (empty when none).
        """
        found: list[Unexplained[K]] = []
        left = self._left
        for key, c in containers.items():
            before = left.get(key)
            if before is None:
                continue
            recent, switch = c.recent_kernel, c.utilization_switch
            if _explained(before, recent, switch):
                continue
            if recent != before[0] and recent != _LAUNCH:
                found.append(Unexplained(key, ControlField.RECENT_KERNEL, before[0], recent))
            if switch != before[1]:
                found.append(Unexplained(key, ControlField.UTILIZATION_SWITCH, before[1], switch))
        seen = tuple(found)
        self._history.append(bool(seen))
        if seen:
            self.last_seen = seen
            self._quiet = 0
            if sum(self._history) >= FIRE_TICKS:
                self._active = True
        else:
            self._quiet += 1
            if self._quiet >= CLEAR_TICKS:
                self._active = False
        return seen

    def record(self, containers: Mapping[K, ControlWords], applied: Iterable[Write[K]]) -> None:
        """Remember what this tick left in each container's words: the value it wrote, else
        the value it read.  Containers not in ``containers`` are forgotten."""
        left = {key: (c.recent_kernel, c.utilization_switch) for key, c in containers.items()}
        for write in applied:
            words = left.get(write.key)
            if words is None:
                continue
            if write.field is ControlField.RECENT_KERNEL:
                left[write.key] = (write.value, words[1])
            else:
                left[write.key] = (words[0], write.value)
        self._left = left

    def forget(self) -> None:
        """Drop every expectation (the tick's writes are unknown, e.g. it was cut short)."""
        self._left = {}
