"""Hypothesis strategies for the host PID broker's wire protocol (``hami_trio.broker.protocol``).

Random 8-byte strings almost never start with ``HPID``, so :func:`request_bytes` mixes them
with "near misses": the valid request with one field (magic, version or command) replaced,
or with a few bytes flipped, so the parser's later checks are exercised as often as the first.
"""

from __future__ import annotations

from hypothesis import strategies as st

from hami_trio.broker.protocol import MAGIC, MAX_PID, REQUEST_SIZE, VALID_REQUEST, VERSION, Status

__all__ = [
    "chunkings",
    "near_miss_requests",
    "pids",
    "request_bytes",
    "request_streams",
    "response_fields",
    "trailing_bytes",
]

_U16 = st.integers(0, 0xFFFF)


def pids() -> st.SearchStrategy[int]:
    """PIDs a successful response can carry (1 .. 2**32-1), biased to the edges."""
    return st.one_of(st.sampled_from([1, 2, 4194304, 2**31 - 1, MAX_PID]), st.integers(1, MAX_PID))


@st.composite
def near_miss_requests(draw: st.DrawFn) -> bytes:
    """The valid request with its magic, version or command replaced, or some bytes flipped."""
    kind = draw(st.sampled_from(["magic", "version", "command", "flip"]))
    if kind == "magic":
        magic = draw(st.binary(min_size=4, max_size=4))
        return magic + VALID_REQUEST[4:]
    if kind == "version":
        version = draw(_U16)
        return MAGIC + version.to_bytes(2, "big") + VALID_REQUEST[6:]
    if kind == "command":
        command = draw(_U16)
        return VALID_REQUEST[:6] + command.to_bytes(2, "big")
    data = bytearray(VALID_REQUEST)
    for index in draw(st.sets(st.integers(0, 7), min_size=1, max_size=3)):
        data[index] ^= draw(st.integers(1, 255))
    return bytes(data)


def request_bytes() -> st.SearchStrategy[bytes]:
    """Any 8 bytes: uniform random, near misses of the valid request, and the valid one."""
    return st.one_of(
        st.binary(min_size=8, max_size=8),
        near_miss_requests(),
        st.just(VALID_REQUEST),
    )


def trailing_bytes() -> st.SearchStrategy[bytes]:
    """What a client might send after its 8 bytes (ignored by the server)."""
    return st.binary(max_size=32)


def request_streams() -> st.SearchStrategy[bytes]:
    """Everything a peer may send on one connection before it stops: any length.

    Empty and short inputs (a prefix of the valid request or of a near miss), exactly 8
    bytes, 8 bytes followed by trailing bytes, and uniformly random bytes of any length.
    """
    return st.one_of(
        st.binary(max_size=40),
        st.builds(lambda head, tail: head + tail, request_bytes(), trailing_bytes()),
        st.integers(0, REQUEST_SIZE - 1).map(lambda size: VALID_REQUEST[:size]),
        st.builds(lambda data, size: data[:size], near_miss_requests(), st.integers(0, 7)),
    )


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` split into consecutive non-empty pieces at random points."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    pieces, start = [], 0
    for cut in cuts:
        if start < cut < len(data):
            pieces.append(data[start:cut])
            start = cut
    pieces.append(data[start:])
    return [piece for piece in pieces if piece]


def response_fields() -> st.SearchStrategy[tuple[bytes, int, int, int]]:
    """Raw ``(magic, version, status, pid)`` tuples, valid or not, for response parsing."""
    return st.tuples(
        st.one_of(st.just(MAGIC), st.binary(min_size=4, max_size=4)),
        st.one_of(st.just(VERSION), _U16),
        st.one_of(st.sampled_from(list(Status)), _U16),
        st.one_of(st.just(0), pids()),
    )
