"""Tenant text shown safely: ``escape_control`` and ``quote`` (hami_trio/_text.py)."""

from __future__ import annotations

import ast

from hypothesis import given
from hypothesis import strategies as st

from hami_trio._text import MAX_QUOTED, escape_control, quote, unsafe_char
from tests.strategies.text import FORMAT_CHARACTERS, hostile_text


def test_format_characters_are_escaped() -> None:
    # Right-to-left override, left-to-right isolate, zero-width space, byte-order mark, a
    # soft hyphen, and a tag character past U+FFFF: each reorders or hides text.
    assert escape_control("a\u202eb\u2066c\u200bd\ufeffe") == "a\\u202eb\\u2066c\\u200bd\\ufeffe"
    assert escape_control("\xad\U000e0041") == "\\xad\\U000e0041"
    assert escape_control("plain ünïcode  日本 \\u202e") == "plain ünïcode  日本 \\u202e"
    for char in FORMAT_CHARACTERS:
        assert unsafe_char(char)
    assert not unsafe_char(" ")
    assert not unsafe_char("\xa0")  # a no-break space shows as a space: nothing to hide


@given(st.text() | hostile_text())
def test_escaped_text_holds_nothing_unsafe_and_escaping_is_idempotent(text: str) -> None:
    escaped = escape_control(text)
    assert not any(unsafe_char(char) for char in escaped)
    assert escape_control(escaped) == escaped
    if not any(unsafe_char(char) for char in text):
        assert escaped == text


@given(st.text() | hostile_text(max_size=40))
def test_a_quoted_name_is_ascii_bounded_and_reads_back(text: str) -> None:
    shown = quote(text)
    assert shown.isascii()
    assert shown.isprintable()
    assert len(shown) <= MAX_QUOTED + 5  # the quotes and "..."
    if shown.endswith("...'") and not (len(text) <= MAX_QUOTED and ascii(text) == shown):
        # cut: what is shown is the start of the name, never half an escape
        assert text.startswith(ast.literal_eval(shown[:-4] + "'"))
    else:
        assert ast.literal_eval(shown) == text
