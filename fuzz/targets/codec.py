"""Target ``codec``: the broker's wire codec (``hami_trio.broker.protocol``).

The codec's contract (docs/protocol.md): ``parse_request`` turns *any* bytes into the one
valid request or a :class:`ProtocolError` whose ``status`` is what to answer with -
``Status.INVALID_REQUEST`` (1) for 8 or more bytes that are not the valid request, ``None``
("close without an answer") for fewer than 8 bytes; bytes after the first 8 never
matter.  ``parse_response`` accepts exactly the 12-byte responses of v1 and raises
``ProtocolError(status=None)`` for everything else.  Never any other exception.

Each check below states the expected outcome independently of the code under test (from the
byte layout), so a codec that is wrong in the same way as its own tests would still fail.

The fast layer (``fuzz/mutation.py``) runs the same oracles over byte mutations: what a peer
sends (seeded from ``request_streams``) through ``parse_request`` and the incremental reader
(:func:`check_request_bytes`), and what a client receives (the ``parse_response`` seeds)
through ``parse_response``.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from fuzz.mutation import Mutator
from hami_trio.broker.protocol import (
    MAGIC,
    MAX_PID,
    REQUEST_SIZE,
    RESPONSE_SIZE,
    VALID_REQUEST,
    ProtocolError,
    Request,
    RequestReader,
    Response,
    Status,
    encode_response,
    parse_request,
    parse_response,
)
from tests.strategies import client as st_client
from tests.strategies import protocol as st_protocol

__all__ = ["TARGET"]

_RESPONSE = struct.Struct("!4sHHI")


def expected_request_outcome(data: bytes) -> Request | Status | None:
    """The oracle: the request, the status to answer with, or None (no answer)."""
    if len(data) < REQUEST_SIZE:
        return None
    return Request() if data[:REQUEST_SIZE] == VALID_REQUEST else Status.INVALID_REQUEST


def _parsed_request(data: bytes) -> Request | ProtocolError:
    try:
        return parse_request(data)
    except ProtocolError as exc:
        return exc


def check_parse_request(data: bytes) -> None:
    """Any bytes: the valid request, or ProtocolError carrying the oracle's status."""
    expected = expected_request_outcome(data)
    outcome = _parsed_request(data)
    if isinstance(outcome, ProtocolError):
        assert outcome.status is expected, (data, outcome.status, expected)
        assert str(outcome), "a ProtocolError must say what is wrong"
    else:
        assert outcome == expected, (data, outcome)
        assert outcome.encode() == VALID_REQUEST


def check_request_reader(data: bytes, pieces: list[bytes]) -> None:
    """Fed in any split, the reader agrees with parse_request on the whole input."""
    assert b"".join(pieces) == data
    expected = expected_request_outcome(data)
    reader = RequestReader()
    fed = 0
    for piece in pieces:
        fed += len(piece)
        outcome: Request | ProtocolError | None
        try:
            outcome = reader.feed(piece)
        except ProtocolError as exc:
            outcome = exc
        if fed < REQUEST_SIZE:
            assert outcome is None
            assert reader.missing == REQUEST_SIZE - fed
            continue
        # The piece that completed 8 bytes decides, and nothing after it matters.
        if isinstance(outcome, ProtocolError):
            assert outcome.status is Status.INVALID_REQUEST
            assert expected is Status.INVALID_REQUEST, (data, pieces)
        else:
            assert outcome == expected == Request(), (data, pieces, outcome)
        assert reader.missing == 0
        return
    assert expected is None, (data, pieces)


def _request_and_pieces() -> st.SearchStrategy[tuple[bytes, list[bytes]]]:
    return st_protocol.request_streams().flatmap(
        lambda data: st.tuples(st.just(data), st_protocol.chunkings(data))
    )


def expected_response(data: bytes) -> Response | None:
    """The oracle for parse_response: the response, or None (refused)."""
    if len(data) != RESPONSE_SIZE:
        return None
    magic, version, status, pid = _RESPONSE.unpack(data)
    if magic != MAGIC or version != 1:
        return None
    if status == Status.OK and pid > 0:
        return Response(Status.OK, pid)
    if status == Status.INVALID_REQUEST and pid == 0:
        return Response(Status.INVALID_REQUEST)
    return None


def check_parse_response(data: bytes) -> None:
    """Any bytes: exactly the valid v1 responses parse (and re-encode to the same bytes)."""
    expected = expected_response(data)
    try:
        outcome: Response | ProtocolError = parse_response(data)
    except ProtocolError as exc:
        outcome = exc
    if isinstance(outcome, ProtocolError):
        assert outcome.status is None, "a client never answers a response"
        assert expected is None, (data, outcome)
    else:
        assert outcome == expected, (data, outcome)
        assert outcome.encode() == data


def check_round_trips(status: Status, pid: int, version: int, command: int) -> None:
    """Encode then parse gives the value back; invalid requests encode and are refused."""
    response = Response(status, pid if status is Status.OK else 0)
    assert parse_response(response.encode()) == response
    if status is Status.OK:
        assert encode_response(pid) == response.encode()
    request = Request(version, command)
    wire = request.encode()
    assert len(wire) == REQUEST_SIZE
    parsed = _parsed_request(wire)
    if (version, command) == (1, 1):
        assert parsed == request
        assert request.encode() == VALID_REQUEST
    else:
        assert isinstance(parsed, ProtocolError)
        assert parsed.status is Status.INVALID_REQUEST


def check_request_bytes(data: bytes) -> None:
    """Any bytes a peer sends: whole, and fed to the reader in two pieces split where the
    bytes choose, the outcome is the byte-layout oracle's."""
    check_parse_request(data)
    cut = data[-1] % (len(data) + 1) if data else 0
    check_request_reader(data, [data[:cut], data[cut:]])


_RESPONSE_BYTES = st.one_of(
    st_client.any_received_bytes(),
    st_protocol.response_fields().map(lambda f: _RESPONSE.pack(*f)),
    st_client.valid_responses().map(lambda pair: pair[0]),
)
# What the mutators splice in: the valid messages and their parts.
_TOKENS = (
    MAGIC,
    VALID_REQUEST,
    Response(Status.OK, 1).encode(),
    Response(Status.INVALID_REQUEST).encode(),
    b"\x00\x01",
    b"\x00\x00",
)
# magic, version/status, command, pid; sizes around 8 and 12
_WIRE_MUTATION = {
    "tokens": _TOKENS,
    "offsets": (0, 4, 6, 8),
    "ints": (1, MAX_PID, 2**31 - 1, 4194304, int.from_bytes(MAGIC, "big")),
    "sizes": (0, 1, 7, 8, 9, 11, 12, 13, 16, 40),
    "max_size": 64,
    "seed_count": 300,
}

_U16 = st.integers(0, 0xFFFF)

TARGET = Target(
    name="codec",
    description="wire codec: any bytes -> request or ProtocolError(status), round trips",
    ci_seconds=30,
    weight=1.0,
    properties=(
        Property(
            "parse_request",
            (st_protocol.request_streams(),),
            check_parse_request,
            examples=((b"",), (VALID_REQUEST,), (VALID_REQUEST + b"\xff" * 64,)),
            bytes_corpus=True,
        ),
        Property("request_reader", (_request_and_pieces(),), lambda t: check_request_reader(*t)),
        Property(
            "parse_response",
            (_RESPONSE_BYTES,),
            check_parse_response,
            bytes_corpus=True,
        ),
        Property(
            "round_trips",
            (
                st.sampled_from(list(Status)),
                st_protocol.pids(),
                st.one_of(st.just(1), _U16),
                st.one_of(st.just(1), _U16),
            ),
            check_round_trips,
            weight=0.5,
            examples=((Status.OK, MAX_PID, 1, 1), (Status.INVALID_REQUEST, 1, 0, 0)),
        ),
    ),
    mutators=(
        Mutator(
            "request_bytes",
            st_protocol.request_streams(),
            check_request_bytes,
            examples=(b"", VALID_REQUEST, VALID_REQUEST + b"\xff" * 8),
            weight=4.0,
            **_WIRE_MUTATION,  # type: ignore[arg-type]
        ),
        Mutator(
            "response_bytes",
            _RESPONSE_BYTES,
            check_parse_response,
            examples=(Response(Status.OK, MAX_PID).encode(),),
            weight=3.0,
            **_WIRE_MUTATION,  # type: ignore[arg-type]
        ),
    ),
)
