"""The wire codec's documented numbers and messages, each pinned exactly.

test_protocol.py checks the codec by round trips and the fuzz invariant; these tests pin
what those cannot see: the bounds at and just past their documented values (a PID is
1..2**32-1 on the wire, a client takes only 1..2**31-1, a request field is a u16), the byte
layout of every constant, and the words of each refusal (the server logs them, a client
reports them as its ``malformed`` reason).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from hami_trio.broker import protocol
from hami_trio.broker.client import NoAnswer, Reason, classify_response
from hami_trio.broker.protocol import (
    INVALID_RESPONSE,
    MAGIC,
    MAX_PID,
    REQUEST_SIZE,
    RESPONSE_SIZE,
    VALID_REQUEST,
    VERSION,
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

P = Path("/tmp/vgpulock/hostpid/broker.sock")


def response_bytes(status: int, pid: int, *, magic: bytes = b"HPID", version: int = 1) -> bytes:
    return struct.pack("!4sHHI", magic, version, status, pid)


def test_the_documented_constants() -> None:
    assert MAGIC == b"HPID"
    assert VERSION == 1
    assert (REQUEST_SIZE, RESPONSE_SIZE) == (8, 12)
    assert MAX_PID == 2**32 - 1
    assert int(Command.GET_HOST_PID) == 1
    assert (int(Status.OK), int(Status.INVALID_REQUEST)) == (0, 1)
    assert VALID_REQUEST == b"HPID\x00\x01\x00\x01"
    assert INVALID_RESPONSE == b"HPID\x00\x01\x00\x01\x00\x00\x00\x00"
    assert Request() == Request(1, 1)
    assert Response(Status.INVALID_REQUEST).pid == 0
    assert set(protocol.__all__) >= {"MAX_PID", "parse_request", "parse_response"}


# -- the u32 PID on the wire -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pid", "wire"),
    [
        (1, b"HPID\x00\x01\x00\x00\x00\x00\x00\x01"),
        (2**31, b"HPID\x00\x01\x00\x00\x80\x00\x00\x00"),
        (2**32 - 1, b"HPID\x00\x01\x00\x00\xff\xff\xff\xff"),
    ],
)
def test_pids_up_to_2_32_minus_1_encode_and_parse(pid: int, wire: bytes) -> None:
    assert encode_response(pid) == wire
    assert Response(Status.OK, pid).encode() == wire
    assert parse_response(wire) == Response(Status.OK, pid)


@pytest.mark.parametrize(
    ("pid", "message"),
    [
        (0, "PID 0 cannot be answered"),
        (-1, "PID -1 cannot be answered"),
        (2**32, "PID 4294967296 cannot be answered"),
    ],
)
def test_encode_response_refuses_pids_outside_1_to_2_32_minus_1(pid: int, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        encode_response(pid)


@pytest.mark.parametrize(
    ("status", "pid", "message"),
    [
        (Status.OK, 2**32, "PID 4294967296 does not fit in a u32"),
        (Status.OK, -1, "PID -1 does not fit in a u32"),
        (Status.INVALID_REQUEST, -1, "PID -1 does not fit in a u32"),
        (Status.OK, 0, "a successful response needs a PID > 0"),
        (Status.INVALID_REQUEST, 1, "a failed response carries PID 0"),
    ],
)
def test_response_value_refusals_word_for_word(status: Status, pid: int, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        Response(status, pid)


def test_response_bounds_are_accepted_exactly_at_the_limit() -> None:
    assert Response(Status.OK, 1).pid == 1
    assert Response(Status.OK, 2**32 - 1).pid == 2**32 - 1
    assert Response(Status.INVALID_REQUEST, 0).encode() == INVALID_RESPONSE


# -- the u16 fields of a request -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["version", "command"])
@pytest.mark.parametrize("value", [0, 1, 0xFFFF])
def test_request_fields_take_the_whole_u16_range(name: str, value: int) -> None:
    request = Request(**{name: value})
    assert getattr(request, name) == value
    data = request.encode()
    assert len(data) == REQUEST_SIZE
    assert data[:4] == b"HPID"
    field = data[4:6] if name == "version" else data[6:8]
    assert int.from_bytes(field, "big") == value


@pytest.mark.parametrize("name", ["version", "command"])
@pytest.mark.parametrize("value", [-1, 0x10000])
def test_request_fields_outside_a_u16_are_refused(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"^request {name} {value} does not fit in a u16$"):
        Request(**{name: value})


def test_request_encode_bytes() -> None:
    assert Request(2, 7).encode() == b"HPID\x00\x02\x00\x07"
    assert Request(0xFFFF, 0).encode() == b"HPID\xff\xff\x00\x00"


# -- parse_request: what it answers and what it says ---------------------------------------------


@pytest.mark.parametrize("size", range(REQUEST_SIZE))
def test_short_request_message(size: int) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_request(VALID_REQUEST[:size])
    assert str(info.value) == f"short request: {size} of 8 bytes"
    assert info.value.status is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"HPIX\x00\x01\x00\x01", "bad magic b'HPIX'"),
        (b"\x00\x00\x00\x00\x00\x01\x00\x01", "bad magic b'\\x00\\x00\\x00\\x00'"),
        (b"HPID\x00\x00\x00\x01", "unsupported version 0"),
        (b"HPID\x00\x02\x00\x01", "unsupported version 2"),
        (b"HPID\xff\xff\x00\x01", "unsupported version 65535"),
        (b"HPID\x00\x01\x00\x00", "unknown command 0"),
        (b"HPID\x00\x01\x00\x02", "unknown command 2"),
        (b"HPID\x00\x01\xff\xff", "unknown command 65535"),
    ],
)
def test_invalid_request_messages(data: bytes, message: str) -> None:
    for received in (data, data + b"trailing"):
        with pytest.raises(ProtocolError) as info:
            parse_request(received)
        assert str(info.value) == message
        assert info.value.status is Status.INVALID_REQUEST


def test_the_parsed_request_carries_the_wire_values() -> None:
    # The version is the plain number read from the wire, the command the enum member.
    request = parse_request(VALID_REQUEST)
    assert repr(request) == "Request(version=1, command=<Command.GET_HOST_PID: 1>)"


def test_a_valid_request_accepts_any_buffer_type() -> None:
    for data in (VALID_REQUEST, bytearray(VALID_REQUEST), memoryview(VALID_REQUEST + b"x")):
        request = parse_request(data)
        assert request == Request()
        assert request.command is Command.GET_HOST_PID
        assert type(request.command) is Command


# -- parse_response: every defect, word for word --------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "response is 0 bytes, not 12"),
        (response_bytes(0, 5)[:11], "response is 11 bytes, not 12"),
        (response_bytes(0, 5) + b"\x00", "response is 13 bytes, not 12"),
        (response_bytes(0, 5, magic=b"HPIQ"), "bad magic b'HPIQ'"),
        (response_bytes(0, 5, version=0), "unsupported version 0"),
        (response_bytes(0, 5, version=2), "unsupported version 2"),
        (response_bytes(2, 0), "unknown status 2"),
        (response_bytes(0xFFFF, 0), "unknown status 65535"),
        (response_bytes(0, 0), "a successful response needs a PID > 0"),
        (response_bytes(1, 9), "a failed response carries PID 0"),
    ],
)
def test_response_defect_messages(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_response(data)
    assert str(info.value) == message
    assert info.value.status is None
    assert info.value.__cause__ is None


def test_parse_response_takes_any_buffer_type() -> None:
    wire = response_bytes(0, 77)
    for data in (wire, bytearray(wire), memoryview(wire)):
        response = parse_response(data)
        assert response == Response(Status.OK, 77)
        assert response.status is Status.OK


# -- the client's pid_t rule: 0 < PID < 2**31 -----------------------------------------------------


def test_the_client_takes_pids_up_to_2_31_minus_1() -> None:
    assert classify_response(P, response_bytes(0, 1)) == 1
    assert classify_response(P, response_bytes(0, 2**31 - 1)) == 2**31 - 1


@pytest.mark.parametrize("pid", [2**31, 2**32 - 1])
def test_the_client_refuses_pids_from_2_31(pid: int) -> None:
    result = classify_response(P, response_bytes(0, pid))
    assert isinstance(result, NoAnswer)
    assert result.reason is Reason.MALFORMED
    assert result.detail == f"{P}: invalid PID {pid} in a success"


def test_the_client_reports_the_codecs_words() -> None:
    result = classify_response(P, response_bytes(0, 5, version=3))
    assert isinstance(result, NoAnswer)
    assert result.detail == f"{P}: unsupported version 3"
    refused = classify_response(P, INVALID_RESPONSE)
    assert isinstance(refused, NoAnswer)
    assert refused.detail == f"{P}: broker answered status 1"


# -- RequestReader ---------------------------------------------------------------------------------


def test_reader_counts_missing_bytes_and_keeps_only_8() -> None:
    reader = RequestReader()
    assert reader.missing == 8
    assert reader.feed(b"") is None
    assert reader.missing == 8
    assert reader.feed(VALID_REQUEST[:3]) is None
    assert reader.missing == 5
    assert reader.feed(VALID_REQUEST[3:] + b"\xff" * 20) == Request()
    assert reader.missing == 0
    # Complete: later bytes change nothing, the same request is returned again.
    assert reader.feed(b"garbage") == Request()
    assert reader.missing == 0


def test_reader_reports_the_completed_requests_defect() -> None:
    reader = RequestReader()
    assert reader.feed(b"HPID\x00\x01") is None
    with pytest.raises(ProtocolError) as info:
        reader.feed(b"\x00\x05extra")
    assert str(info.value) == "unknown command 5"
    assert info.value.status is Status.INVALID_REQUEST
    assert reader.missing == 0
    with pytest.raises(ProtocolError, match=r"^unknown command 5$"):
        reader.feed(b"")


def test_reader_takes_memoryview_chunks() -> None:
    reader = RequestReader()
    assert reader.feed(memoryview(VALID_REQUEST)[:7]) is None
    assert reader.feed(bytearray(VALID_REQUEST[7:])) == Request()
