"""Hypothesis strategies for the broker client: responses as a client may receive them."""

from __future__ import annotations

import struct

from hypothesis import strategies as st

_RESPONSE = struct.Struct("!4sHHI")


def valid_pids() -> st.SearchStrategy[int]:
    """PIDs a client accepts: 1 .. 2**31-1 (a signed 32-bit ``pid_t``)."""
    return st.integers(min_value=1, max_value=2**31 - 1)


def valid_responses() -> st.SearchStrategy[tuple[bytes, int]]:
    """A response the client must accept, with the PID it carries."""
    return valid_pids().map(lambda pid: (_RESPONSE.pack(b"HPID", 1, 0, pid), pid))


def near_miss_responses() -> st.SearchStrategy[bytes]:
    """12-byte responses built from plausible fields: mostly valid-looking, often not."""
    return st.builds(
        _RESPONSE.pack,
        st.sampled_from([b"HPID", b"HPIX", b"hpid", b"\x00\x00\x00\x00"]),
        st.sampled_from([0, 1, 2, 0xFFFF]),
        st.sampled_from([0, 1, 2, 0xFFFF]),
        st.sampled_from([0, 1, 42, 2**31 - 1, 2**31, 2**32 - 1]),
    )


def any_received_bytes() -> st.SearchStrategy[bytes]:
    """Whatever a hostile server might send before closing: any length, any content."""
    return st.one_of(st.binary(max_size=24), near_miss_responses())
