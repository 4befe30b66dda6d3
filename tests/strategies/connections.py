"""Hypothesis strategies for clients of a live broker: what each connection does, and when.

A :class:`ConnectionPlan` is one client's behaviour on one connection: wait, connect, send its
bytes (any request stream from :func:`tests.strategies.protocol.request_streams`) in pieces
split at random points with random pauses between them - possibly one *stall* longer than the
broker's exchange deadline - optionally keep writing a large block after them (an oversized
write), then read the answer, half-close and read, or close at once (an early close).  A
:class:`Session` is many plans run concurrently, plus a crowd of idle connections that send
nothing.  Durations are symbolic (``stall``) or small fixed choices, so that the live broker
target can decide what the broker must answer from the plan and the deadline it runs with,
and so shrinking lands on readable cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hypothesis import strategies as st

from tests.strategies import protocol as st_protocol

__all__ = ["ConnectionPlan", "Ending", "Session", "connection_plans", "sessions"]

#: After sending: read until the broker closes, half-close then read, or close at once.
Ending = Literal["read", "half_close", "close"]

# Pauses in seconds: mostly none, sometimes a scheduler round or a few milliseconds.
_PAUSES = st.sampled_from([0.0, 0.0, 0.0, 0.0005, 0.002, 0.01])
_DELAYS = st.sampled_from([0.0, 0.0, 0.001, 0.005, 0.02])
# Oversized writes: a few socket buffers' worth of bytes after the pieces.
_OVERSIZE = st.sampled_from([0, 0, 0, 0, 4096, 65_536, 1_048_576])


@dataclass(frozen=True)
class ConnectionPlan:
    """One client's behaviour on one connection.

    Attributes:
        delay: seconds to wait before connecting.
        pieces: the bytes sent, in order (their concatenation is the request stream).
        pauses: seconds to wait before each piece (same length as ``pieces``).
        stall_before: index of the piece preceded by a stall longer than the broker's
            deadline (the target chooses its length), or ``None``.
        oversize: bytes (zeros) written after the pieces until done or refused.
        ending: what the client does after writing.
    """

    delay: float
    pieces: tuple[bytes, ...]
    pauses: tuple[float, ...]
    stall_before: int | None
    oversize: int
    ending: Ending

    @property
    def stream(self) -> bytes:
        """Everything the client writes, in order (pieces then the oversized block)."""
        return b"".join(self.pieces) + bytes(self.oversize)


@st.composite
def connection_plans(draw: st.DrawFn, *, stalls: bool = True) -> ConnectionPlan:
    """A :class:`ConnectionPlan`; ``stalls=False`` never stalls (fast sessions)."""
    data = draw(st_protocol.request_streams())
    pieces = tuple(draw(st_protocol.chunkings(data)))
    pauses = tuple(draw(st.lists(_PAUSES, min_size=len(pieces), max_size=len(pieces))))
    stall_before = None
    if stalls and pieces and draw(st.integers(0, 9)) == 0:
        stall_before = draw(st.integers(0, len(pieces) - 1))
    return ConnectionPlan(
        delay=draw(_DELAYS),
        pieces=pieces,
        pauses=pauses,
        stall_before=stall_before,
        oversize=draw(_OVERSIZE),
        ending=draw(st.sampled_from(["read", "read", "half_close", "close"])),
    )


@dataclass(frozen=True)
class Session:
    """Connections run at the same time against one broker.

    Attributes:
        plans: the clients, all started together (each after its own delay).
        idle: extra connections that send nothing at all.
        idle_hold: seconds the idle ones stay open before closing (``None``: until the
            broker drops them at its deadline).
    """

    plans: tuple[ConnectionPlan, ...]
    idle: int
    idle_hold: float | None


def sessions(*, max_clients: int = 32, max_idle: int = 200) -> st.SearchStrategy[Session]:
    """A :class:`Session` of 1..``max_clients`` plans and 0..``max_idle`` idle connections."""
    return st.builds(
        Session,
        plans=st.lists(connection_plans(), min_size=1, max_size=max_clients).map(tuple),
        idle=st.sampled_from([0, 0, 0, 1, 8]) | st.integers(0, max_idle),
        idle_hold=st.sampled_from([None, 0.0, 0.01]),
    )
