"""Small filesystem helpers shared by the broker, the allocation library and the monitor.

All three refuse objects a tenant could have planted (a symlink where a directory belongs, a
FIFO named like a ``.cache`` file, ...), and their refusal messages name what was found
with the same vocabulary.
"""

from __future__ import annotations

import stat

__all__ = ["file_kind"]

_KINDS = (
    (stat.S_ISREG, "regular file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def file_kind(mode: int) -> str:
    """A human name for the file type in ``mode`` (``"symlink"``, ``"FIFO"``, ...).

    Args:
        mode: an ``st_mode`` from ``stat``/``lstat``.

    Returns:
        The name without an article; ``"file of unknown type"`` for a type Linux lacks.
    """
    for test, name in _KINDS:
        if test(mode):
            return name
    return "file of unknown type"
