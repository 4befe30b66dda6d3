"""Tenant text made safe to show: :func:`escape_control` and :func:`quote` (pure).

How this works: tenants choose file names, directory names and pod fields, and the agent
shows them in log lines, reasons and the ``hami-trio status`` table.  :func:`escape_control`
escapes, wherever it stands, every character that could end a line, drive a terminal or
change how the rest of the line reads: controls (C0, DEL, C1), Unicode format characters
(category ``Cf``: bidirectional overrides and isolates such as U+202E and U+2066, zero-width
characters such as U+200B, U+FEFF), the line and paragraph separators and lone surrogates.
:func:`quote` is for a name inside a sentence: quoted, every non-ASCII character escaped
(``ascii``), and cut to a bounded length, so where the name starts and ends is always
visible and a name cannot pad a line until it wraps into the look of another line.  The
logs' formatters (:mod:`hami_trio.logs`), the monitor's rejection reasons and the export
reasons use these two, and nothing else.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MAX_QUOTED", "escape_char", "escape_control", "quote", "unsafe_char"]

#: Longest piece of tenant text (a name) :func:`quote` writes out, escapes counted.
MAX_QUOTED: Final = 80
#: Categories escaped by :func:`escape_control`: controls, format characters, surrogates,
#: the line and paragraph separators.
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def unsafe_char(char: str) -> bool:
    """Whether :func:`escape_control` escapes the single character ``char``."""
    return not char.isprintable() and unicodedata.category(char) in _UNSAFE_CATEGORIES


def escape_char(char: str) -> str:
    """The escape of one character: ``\\n``, ``\\r``, ``\\t``, else ``\\xNN``, ``\\uNNNN``
    or ``\\UNNNNNNNN`` by the size of its code point."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_control(text: str) -> str:
    """``text`` with every character that could break a line, drive a terminal or reorder
    or hide text escaped (see the module docstring; :func:`escape_char` for the form).

    Everything else is unchanged; a string without such characters is returned as it is
    (``str.isprintable`` decides that in one pass).  Idempotent: an escape is ASCII.
    """
    if text.isprintable():
        return text
    return "".join(escape_char(char) if unsafe_char(char) else char for char in text)


def quote(text: str, limit: int = MAX_QUOTED) -> str:
    """Tenant text inside a sentence: ``ascii(text)``, short, printable whatever it holds.

    Cut to ``limit`` characters as written out: an escape (``\\U00010000``) is up to ten
    characters for one, so the text is cut again after escaping, never inside an escape,
    and ``...`` is added before the closing quote."""
    shown = ascii(text[:limit])
    if len(shown) <= limit + 2 and len(text) <= limit:
        return shown
    cut, size = [], 0
    for char in text[:limit]:
        escaped = "\\'" if char == "'" else ascii(char)[1:-1]
        if size + len(escaped) > limit:
            break
        cut.append(escaped)
        size += len(escaped)
    return "'" + "".join(cut) + "...'"
