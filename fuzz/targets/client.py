"""Target ``client``: the broker client's pure decisions (``hami_trio.broker.client``).

The client trusts the broker only if every check passes; each decision is a pure function of
a ``stat`` result, an ``errno`` or the bytes received, so it is fuzzed here without sockets.
The oracles restate the client's rules directly: a directory is trusted only if it is a directory
owned by the expected uid, without group/other write bits, on a read-only mount; a socket
path only if it is a socket owned by the expected uid; a response only if it is exactly 12
bytes of magic, version 1, status 0 and 0 < PID < 2**31.  Whatever the input, the functions
return a value (a PID or a :class:`NoAnswer`), never raise.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from fuzz.mutation import Mutator
from hami_trio.broker.client import (
    NoAnswer,
    Reason,
    check_directory,
    check_socket,
    classify_connect_error,
    classify_response,
)
from tests.strategies import client as st_client
from tests.strategies import protocol as st_protocol

__all__ = ["TARGET"]

_PATH = Path("/tmp/vgpulock/hostpid/broker.sock")
_RESPONSE = struct.Struct("!4sHHI")
_UIDS = st.sampled_from([0, 65534, 1000])


def check_response(data: bytes) -> None:
    """Exactly the valid success responses give a PID; everything else is ``malformed``."""
    accept = (
        len(data) == 12
        and data[:4] == b"HPID"
        and _RESPONSE.unpack(data)[1:3] == (1, 0)
        and 0 < _RESPONSE.unpack(data)[3] < 2**31
    )
    outcome = classify_response(_PATH, data)
    if accept:
        assert outcome == _RESPONSE.unpack(data)[3], (data, outcome)
    else:
        assert isinstance(outcome, NoAnswer), (data, outcome)
        assert outcome.reason is Reason.MALFORMED
        assert str(_PATH) in outcome.detail


def check_directory_decision(st_result: os.stat_result, read_only: bool, expected: int) -> None:
    """A directory is trusted only when all four conditions hold (a directory, the
    expected owner, no group/other write bit, a read-only mount)."""
    trusted = (
        stat.S_ISDIR(st_result.st_mode)
        and st_result.st_uid == expected
        and not st_result.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        and read_only
    )
    outcome = check_directory(_PATH.parent, st_result, read_only, expected_uid=expected)
    if trusted:
        assert outcome is None
    else:
        assert isinstance(outcome, NoAnswer), (st_result, read_only, outcome)
        assert outcome.reason in (Reason.UNSAFE_MODE, Reason.UNSAFE_OWNER, Reason.NOT_READ_ONLY)
        # The first failing check in the documented order is the one reported.
        if not stat.S_ISDIR(st_result.st_mode):
            assert outcome.reason is Reason.UNSAFE_MODE
        elif st_result.st_uid != expected:
            assert outcome.reason is Reason.UNSAFE_OWNER


def check_socket_decision(st_result: os.stat_result, expected: int) -> None:
    """The socket path is trusted only as a socket owned by the expected uid."""
    outcome = check_socket(_PATH, st_result, expected_uid=expected)
    if not stat.S_ISSOCK(st_result.st_mode):
        assert isinstance(outcome, NoAnswer)
        assert outcome.reason is Reason.NOT_SOCKET
    elif st_result.st_uid != expected:
        assert isinstance(outcome, NoAnswer)
        assert outcome.reason is Reason.UNSAFE_OWNER
    else:
        assert outcome is None


def check_connect_error(err: int) -> None:
    """Every connect errno is a NoAnswer; the meaningful ones map to their reason."""
    outcome = classify_connect_error(_PATH, err)
    assert isinstance(outcome, NoAnswer)
    expected = {
        errno.ENOENT: Reason.MISSING,
        errno.ECONNREFUSED: Reason.STALE,
        errno.EAGAIN: Reason.TIMEOUT,
        errno.ETIMEDOUT: Reason.TIMEOUT,
    }.get(err, Reason.REFUSED)
    assert outcome.reason is expected, (err, outcome)


_RECEIVED = st.one_of(
    st_client.any_received_bytes(),
    st_client.valid_responses().map(lambda pair: pair[0]),
    st_protocol.response_fields().map(lambda f: _RESPONSE.pack(*f)),
)

TARGET = Target(
    name="client",
    description="client decisions: stat results, connect errors and responses -> trust or a reason",
    ci_seconds=10,
    weight=0.5,
    properties=(
        Property("classify_response", (_RECEIVED,), check_response, bytes_corpus=True),
        Property(
            "check_directory",
            (st_client.stat_results(), st.booleans(), _UIDS),
            check_directory_decision,
        ),
        Property("check_socket", (st_client.stat_results(), _UIDS), check_socket_decision),
        Property("connect_error", (st_client.errnos(),), check_connect_error, weight=0.3),
    ),
    mutators=(
        Mutator(
            "response_bytes",
            _RECEIVED,
            check_response,
            tokens=(b"HPID", b"\x00\x01\x00\x00"),
            offsets=(0, 4, 6, 8),
            ints=(2**31 - 1, 2**31, 2**32 - 1),
            sizes=(0, 11, 12, 13),
            max_size=32,
        ),
    ),
)
