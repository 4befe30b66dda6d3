"""Wire protocol v1 of the host PID broker: a sans-I/O codec.

How this works: one Unix stream connection carries one 8-byte request and one 12-byte
response (big-endian ``magic b"HPID", version 1, command 1`` / ``magic, version, status,
host PID``), then closes; the only valid request is ``48 50 49 44 00 01 00 01``.  This
module only turns bytes into values and back - no sockets, no trio, no clock - so it can be
fuzzed alone.  Parsing errors raise :class:`ProtocolError` with the status the server should
answer, or ``None`` to close without an answer (a short request, any defect in a response);
:class:`RequestReader` accumulates a request that arrives in pieces.  A request never carries
a PID: the server takes it from ``SO_PEERCRED``.  The byte tables: docs/protocol.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

__all__ = [
    "INVALID_RESPONSE",
    "MAGIC",
    "MAX_PID",
    "REQUEST_SIZE",
    "RESPONSE_SIZE",
    "VALID_REQUEST",
    "VERSION",
    "Command",
    "ProtocolError",
    "Request",
    "RequestReader",
    "Response",
    "Status",
    "encode_response",
    "parse_request",
    "parse_response",
]

#: The four bytes every request and response starts with.
MAGIC: Final = b"HPID"
#: The only protocol version this codec speaks.
VERSION: Final = 1
#: Size of a request on the wire.
REQUEST_SIZE: Final = 8
#: Size of a response on the wire.
RESPONSE_SIZE: Final = 12
#: Largest value the u32 PID field can carry.
MAX_PID: Final = 0xFFFF_FFFF

_REQUEST: Final = struct.Struct("!4sHH")
_RESPONSE: Final = struct.Struct("!4sHHI")
_U16_MAX: Final = 0xFFFF


class Command(IntEnum):
    """Request commands of protocol version 1."""

    #: Answer with the caller's PID as the broker's (host) PID namespace sees it.
    GET_HOST_PID = 1


class Status(IntEnum):
    """Response statuses of protocol version 1."""

    #: Success; the PID field holds the caller's host PID (> 0).
    OK = 0
    #: Wrong magic, version or command; the PID field is 0.
    INVALID_REQUEST = 1


class ProtocolError(Exception):
    """Bytes that are not a valid message of protocol v1.

    Raised by the parsers.  ``status`` is what the server should answer with
    (:attr:`Status.INVALID_REQUEST` for a complete but invalid request), or ``None`` when no
    answer must be sent: a request shorter than 8 bytes or a malformed response (a
    client never replies; it falls back to its other discovery path).
    """

    def __init__(self, message: str, status: Status | None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    """A request; :func:`parse_request` only ever returns the one valid v1 request."""

    version: int = VERSION
    command: int = Command.GET_HOST_PID

    def __post_init__(self) -> None:
        for name in ("version", "command"):
            value = getattr(self, name)
            if not 0 <= value <= _U16_MAX:
                raise ValueError(f"request {name} {value} does not fit in a u16")

    def encode(self) -> bytes:
        """The 8 bytes of this request.  Any u16 values encode, so tests can build invalid
        requests; only ``Request()`` is valid."""
        return _REQUEST.pack(MAGIC, self.version, self.command)


@dataclass(frozen=True, slots=True)
class Response:
    """A response: ``Response(Status.OK, pid)`` or ``Response(Status.INVALID_REQUEST)``."""

    status: Status
    pid: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.pid <= MAX_PID:
            raise ValueError(f"PID {self.pid} does not fit in a u32")
        if self.status is Status.OK and self.pid == 0:
            raise ValueError("a successful response needs a PID > 0")
        if self.status is not Status.OK and self.pid != 0:
            raise ValueError("a failed response carries PID 0")

    def encode(self) -> bytes:
        """The 12 bytes of this response."""
        return _RESPONSE.pack(MAGIC, VERSION, self.status, self.pid)


#: The 8 bytes of the only valid v1 request (``Request().encode()``).
VALID_REQUEST: Final = Request().encode()
#: The 12 bytes answering any complete but invalid request.
INVALID_RESPONSE: Final = Response(Status.INVALID_REQUEST).encode()


def parse_request(data: bytes | bytearray | memoryview) -> Request:
    """Validate a request.

    Args:
        data: the bytes received; at least 8.  Bytes after the first 8 are ignored.

    Returns:
        The request (always ``Request()`` in protocol v1).

    Raises:
        ProtocolError: ``status=None`` if fewer than 8 bytes (close without answer);
            ``status=Status.INVALID_REQUEST`` for a wrong magic, version or command.
    """
    if len(data) < REQUEST_SIZE:
        raise ProtocolError(f"short request: {len(data)} of {REQUEST_SIZE} bytes", None)
    magic, version, command = _REQUEST.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}", Status.INVALID_REQUEST)
    if version != VERSION:
        raise ProtocolError(f"unsupported version {version}", Status.INVALID_REQUEST)
    if command != Command.GET_HOST_PID:
        raise ProtocolError(f"unknown command {command}", Status.INVALID_REQUEST)
    return Request(version, Command(command))


def encode_response(pid: int) -> bytes:
    """The 12 bytes of a successful response; the server's hot path.

    Args:
        pid: the caller's host PID, 1..2**32-1.

    Raises:
        ValueError: the PID is out of range (a PID <= 0 must get no answer at all).
    """
    if not 0 < pid <= MAX_PID:
        raise ValueError(f"PID {pid} cannot be answered")
    return _RESPONSE.pack(MAGIC, VERSION, Status.OK, pid)


def parse_response(data: bytes | bytearray | memoryview) -> Response:
    """Validate a response the way a client must before trusting it.

    Args:
        data: everything read from the connection until EOF or 12 bytes.

    Returns:
        The response; check ``status`` before using ``pid``.

    Raises:
        ProtocolError: (always ``status=None``) not exactly 12 bytes, wrong magic or version,
            unknown status, a success with PID 0 or a failure with a PID.
    """
    if len(data) != RESPONSE_SIZE:
        raise ProtocolError(f"response is {len(data)} bytes, not {RESPONSE_SIZE}", None)
    magic, version, status, pid = _RESPONSE.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}", None)
    if version != VERSION:
        raise ProtocolError(f"unsupported version {version}", None)
    try:
        known = Status(status)
    except ValueError:
        raise ProtocolError(f"unknown status {status}", None) from None
    try:
        return Response(known, pid)
    except ValueError as exc:
        raise ProtocolError(str(exc), None) from None


class RequestReader:
    """Accumulate a request that arrives in pieces (a stream may split it anywhere).

    ``feed(chunk)`` returns ``None`` until 8 bytes have arrived, then the request; extra bytes
    are ignored.  A complete but invalid request raises :class:`ProtocolError` with
    ``status=Status.INVALID_REQUEST``.  Validation waits for all 8 bytes on purpose: the
    protocol answers only complete requests, and a peer that stops early gets no answer.
    """

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def missing(self) -> int:
        """How many more bytes the request needs (0 once complete)."""
        return REQUEST_SIZE - len(self._buffer)

    def feed(self, chunk: bytes | bytearray | memoryview) -> Request | None:
        """Add received bytes.

        Raises:
            ProtocolError: the completed request is invalid (or was already rejected).
        """
        if self.missing:
            self._buffer += chunk[: self.missing]
        if self.missing:
            return None
        return parse_request(self._buffer)
