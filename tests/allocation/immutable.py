"""Clear the immutable flags a test's preparation set, so its temporary tree can be removed.

A preparation with the broker on, as root, makes ``hostpid`` immutable (``chattr +i``);
``shutil.rmtree`` then fails with EPERM and the tree stays on the machine for ever.  Every
test of this package that prepares under ``tmp_path`` gets it cleared afterwards
(``tests/allocation/conftest.py``); the helpers are importable for trees elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from hami_trio.allocation import lockdir

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def is_immutable(path: Path) -> bool:
    """Whether the directory ``path`` carries FS_IMMUTABLE_FL (False where unreadable)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    try:
        return bool(lockdir._get_flags(fd) & lockdir.FS_IMMUTABLE_FL)
    except OSError:
        return False
    finally:
        os.close(fd)


def clear_immutable(root: Path) -> list[Path]:
    """Clear FS_IMMUTABLE_FL on every directory below ``root`` (never following a link).

    Returns the directories that had it.  Directories only: a preparation flags nothing else.
    """
    cleared: list[Path] = []
    for top, dirs, _files in os.walk(root, followlinks=False):
        for name in [".", *dirs]:
            path = Path(top) if name == "." else Path(top, name)
            try:
                fd = os.open(path, _DIR_FLAGS)
            except OSError:
                continue
            try:
                flags = lockdir._get_flags(fd)
                if flags & lockdir.FS_IMMUTABLE_FL:
                    lockdir._set_flags(fd, flags & ~lockdir.FS_IMMUTABLE_FL)
                    cleared.append(path)
            except OSError:
                pass
            finally:
                os.close(fd)
    return cleared
