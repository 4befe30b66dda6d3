"""A region file in memory, read by either decoder the way a handle reads a real one."""

from __future__ import annotations

import struct
from typing import Protocol, TypeVar

__all__ = ["Decoder", "File"]

_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
S_co = TypeVar("S_co", covariant=True)


class Decoder(Protocol[S_co]):
    """What :class:`File` drives: ``RegionDecoder`` or ``TickDecoder``."""

    def start(self, size: int) -> tuple[int, int]: ...

    def feed(self, data: bytes) -> tuple[int, int] | S_co: ...


class File:
    """The region's bytes; ``asked`` is the ranges the last :meth:`read` asked for."""

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = bytearray(data)
        self.asked: list[tuple[int, int]] = []

    def read(self, decoder: Decoder[S_co]) -> S_co:
        """Answer every range ``decoder`` asks for until it returns its snapshot."""
        self.asked = []
        step: tuple[int, int] | S_co = decoder.start(len(self.data))
        while isinstance(step, tuple):
            self.asked.append(step)
            offset, length = step
            step = decoder.feed(bytes(self.data[offset : offset + length]))
        return step

    def put(self, offset: int, raw: bytes) -> None:
        self.data[offset : offset + len(raw)] = raw

    def put_i32(self, offset: int, value: int) -> None:
        self.put(offset, _I32.pack(value))

    def put_u64(self, offset: int, value: int) -> None:
        self.put(offset, _U64.pack(value))
