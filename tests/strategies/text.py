"""Hypothesis strategies for tenant text shown to people: names made to fool a reader.

:func:`hostile_text` mixes what reorders, hides or pads text - Unicode format characters
(category ``Cf``: U+202E, U+2066, U+200B, U+FEFF and every other), long runs of spaces, C0 and
C1 controls, line separators, lone surrogates - with ordinary letters and quotes.
:func:`cache_file_names` is the same as a ``.cache`` file name a tenant can create (no ``/``
or NUL, at most 255 bytes as the file system stores it, surrogates only as Python reads a
name that is not UTF-8).
"""

from __future__ import annotations

import os

from hypothesis import strategies as st

__all__ = ["FORMAT_CHARACTERS", "cache_file_names", "hostile_text"]

#: The format characters that the review used: right-to-left override, left-to-right
#: isolate, zero-width space, byte-order mark (zero-width no-break space).
FORMAT_CHARACTERS = ("\u202e", "\u2066", "\u200b", "\ufeff")

_PIECES = st.one_of(
    st.sampled_from(FORMAT_CHARACTERS),
    st.characters(categories=["Cf"]),
    st.integers(1, 160).map(lambda n: " " * n),
    st.characters(max_codepoint=0x9F, categories=["Cc"], exclude_characters="\x00"),
    st.sampled_from(["\u2028", "\u2029", "'", '"', "\\", "team-a/pod/main", "exported"]),
    st.characters(codec="utf-8", exclude_characters="/\x00"),
)


def hostile_text(min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    """Text of ``min_size`` to ``max_size`` pieces (a piece: one character or a run of
    spaces), surrogates excepted (see :func:`cache_file_names` for names with them)."""
    return st.lists(_PIECES, min_size=min_size, max_size=max_size).map("".join)


def _fits(name: str) -> bool:
    return len(os.fsencode(name)) <= 255


def cache_file_names() -> st.SearchStrategy[str]:
    """A ``.cache`` file name a tenant can create in its container directory."""
    stem = st.one_of(
        hostile_text(min_size=1).map(lambda t: t.replace("/", "\u2215")),  # a look-alike
        st.sampled_from(["\u202eehcac.", "x\udcff", "\u2066a\u2069", "\ufeff" + " " * 150]),
    )
    return stem.map(lambda s: s + ".cache").filter(_fits)
