"""The wire codec: round trips, the fuzz invariant, piecewise input and the documented vectors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_trio.broker.protocol import (
    INVALID_RESPONSE,
    MAGIC,
    MAX_PID,
    REQUEST_SIZE,
    RESPONSE_SIZE,
    VALID_REQUEST,
    Command,
    ProtocolError,
    Request,
    RequestReader,
    Response,
    Status,
    encode_response,
    parse_request,
    parse_response,
)
from tests.broker.vectors import DOC_VECTORS, expected_answer
from tests.strategies import protocol as st_protocol


def test_the_valid_request_and_invalid_answer_bytes() -> None:
    assert bytes.fromhex("4850494400010001") == VALID_REQUEST
    assert bytes.fromhex("485049440001000100000000") == INVALID_RESPONSE
    assert (REQUEST_SIZE, RESPONSE_SIZE) == (8, 12)


def test_parse_valid_request() -> None:
    request = parse_request(VALID_REQUEST)
    assert request == Request()
    assert request.command is Command.GET_HOST_PID


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"HPIX\x00\x01\x00\x01", "magic"),
        (b"HPID\x00\x02\x00\x01", "version"),
        (b"HPID\x00\x01\x00\x02", "command"),
    ],
)
def test_invalid_request_carries_status_1(data: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason) as info:
        parse_request(data)
    assert info.value.status is Status.INVALID_REQUEST


def test_short_request_gets_no_answer() -> None:
    for size in range(REQUEST_SIZE):
        with pytest.raises(ProtocolError, match="short request") as info:
            parse_request(VALID_REQUEST[:size])
        assert info.value.status is None


def request_outcome(data: bytes) -> Request | Status | None:
    """The parsed request, or the status its ProtocolError carries (None: no answer)."""
    try:
        return parse_request(data)
    except ProtocolError as exc:
        return exc.status


@given(st_protocol.request_bytes())
def test_every_8_byte_input_is_valid_or_status_1(data: bytes) -> None:
    # The fuzz invariant: nothing but a Request or a ProtocolError(status=1), ever.
    outcome = request_outcome(data)
    if data == VALID_REQUEST:
        assert outcome == Request()
    else:
        assert outcome is Status.INVALID_REQUEST


@given(st_protocol.request_bytes(), st_protocol.trailing_bytes())
def test_bytes_after_the_first_8_are_ignored(data: bytes, extra: bytes) -> None:
    assert request_outcome(data + extra) == request_outcome(data)


@given(st.data(), st_protocol.request_bytes(), st_protocol.trailing_bytes())
def test_reader_fed_in_pieces_matches_whole_parse(
    data: st.DataObject, request: bytes, extra: bytes
) -> None:
    pieces = data.draw(st_protocol.chunkings(request + extra))
    reader = RequestReader()
    result: object = None
    fed = 0
    for piece in pieces:
        try:
            result = reader.feed(piece)
        except ProtocolError as exc:
            result = exc.status
        fed += len(piece)
        if fed < REQUEST_SIZE:
            assert result is None
            assert reader.missing == REQUEST_SIZE - fed
        if result is not None:
            break
    expected = Request() if request == VALID_REQUEST else Status.INVALID_REQUEST
    assert result == expected
    assert reader.missing == 0


def test_reader_byte_at_a_time() -> None:
    reader = RequestReader()
    for byte in VALID_REQUEST[:-1]:
        assert reader.feed(bytes([byte])) is None
    assert reader.feed(VALID_REQUEST[-1:] + b"junk") == Request()
    bad = RequestReader()
    for byte in b"HPID\x00\x01\x00":
        assert bad.feed(bytes([byte])) is None
    with pytest.raises(ProtocolError) as info:
        bad.feed(b"\x09")
    assert info.value.status is Status.INVALID_REQUEST


@given(st_protocol.pids())
def test_response_round_trip(pid: int) -> None:
    data = encode_response(pid)
    assert len(data) == RESPONSE_SIZE
    assert data == Response(Status.OK, pid).encode()
    assert parse_response(data) == Response(Status.OK, pid)


def test_invalid_response_round_trip() -> None:
    assert parse_response(INVALID_RESPONSE) == Response(Status.INVALID_REQUEST, 0)


@pytest.mark.parametrize("pid", [0, -1, MAX_PID + 1])
def test_unanswerable_pids_are_refused(pid: int) -> None:
    with pytest.raises(ValueError, match="PID"):
        encode_response(pid)


def test_response_value_rules() -> None:
    with pytest.raises(ValueError, match="PID > 0"):
        Response(Status.OK, 0)
    with pytest.raises(ValueError, match="PID 0"):
        Response(Status.INVALID_REQUEST, 5)
    with pytest.raises(ValueError, match="u16"):
        Request(version=0x10000)


@given(st_protocol.response_fields())
def test_parse_response_accepts_exactly_the_well_formed(
    fields: tuple[bytes, int, int, int],
) -> None:
    magic, version, status, pid = fields
    data = struct.pack("!4sHHI", magic, version, status, pid)
    well_formed = (
        magic == MAGIC
        and version == 1
        and (status, pid != 0) in ((Status.OK, True), (Status.INVALID_REQUEST, False))
    )
    if well_formed:
        response = parse_response(data)
        assert (response.status, response.pid) == (status, pid)
    else:
        with pytest.raises(ProtocolError) as info:
            parse_response(data)
        assert info.value.status is None  # a client never answers


@given(st.binary(max_size=24).filter(lambda b: len(b) != RESPONSE_SIZE))
def test_parse_response_wants_exactly_12_bytes(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="not 12"):
        parse_response(data)


# -- the examples in docs/protocol.md ---------------------------------------------------------


def test_doc_has_the_examples() -> None:
    cases = {case for case, *_ in DOC_VECTORS}
    assert len(DOC_VECTORS) >= 10
    assert {"valid request", "wrong magic", "version 2", "command 2"} <= cases
    assert any(response is None for *_, response in DOC_VECTORS)
    assert any(request == b"" for _, request, *_ in DOC_VECTORS)


@pytest.mark.parametrize(("case", "request_", "pid", "response"), DOC_VECTORS)
def test_doc_vector_matches_codec(
    case: str, request_: bytes, pid: int, response: bytes | None
) -> None:
    assert expected_answer(request_, pid) == response, case


@given(st_protocol.request_bytes(), st_protocol.trailing_bytes())
def test_the_servers_prefix_compare_is_exactly_parse_requests_acceptance(
    request: bytes, trailing: bytes
) -> None:
    # The broker's inline fast path accepts a request with one startswith(VALID_REQUEST);
    # that is only right while protocol v1 has exactly one valid request.
    data = request + trailing
    try:
        parse_request(data)
        accepted = True
    except ProtocolError:
        accepted = False
    assert data.startswith(VALID_REQUEST) is accepted
