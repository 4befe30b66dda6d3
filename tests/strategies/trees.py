"""Hypothesis strategies for the remover: hostile directory trees a tenant could leave.

:func:`trees` draws a :class:`TreeSpec`: a list of nodes, each hung under an earlier
directory (so shapes range from flat to chains), of every kind a tenant can create without
privileges - directories, files, chains of directories (deeper than the remover's descriptor
stack, so subtrees get moved up), symlinks to the host directory beside the tree, to a host
file, to a host FIFO, inside the tree and dangling, FIFOs, Unix sockets and hard links to a
host file.  :func:`build_tree` makes it real on disk and :func:`build_outside` the host
directory that nothing may touch.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

__all__ = ["KINDS", "Node", "TreeSpec", "build_outside", "build_tree", "trees"]

KINDS = (
    "dir",
    "file",
    "chain",
    "link_outside_dir",
    "link_outside_file",
    "link_outside_fifo",
    "link_inside",
    "dangling",
    "fifo",
    "socket",
    "hardlink_outside",
)


# A name already taken (by any kind of entry): the node is skipped.
_CLASH = (errno.EEXIST, errno.EISDIR, errno.EADDRINUSE, errno.ENOTDIR)


@dataclass(frozen=True)
class Node:
    """One entry: ``kind`` named ``name`` under directory number ``parent`` (0 is the top;
    directory ``n`` is the ``n``-th ``dir`` node); ``depth`` for chains."""

    parent: int
    kind: str
    name: str
    depth: int = 0


@dataclass(frozen=True)
class TreeSpec:
    nodes: tuple[Node, ...]


_NAMES = st.one_of(
    st.sampled_from(["a", "b", "d", ".hidden", ".hami-trio-removing-0", "x" * 200, "..a"]),
    st.text(
        alphabet=st.characters(blacklist_characters="/\0", codec="utf-8"),
        min_size=1,
        max_size=12,
    ).filter(lambda name: name not in (".", "..")),
)


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 40) -> TreeSpec:
    """A random hostile tree (see the module docstring)."""
    count = draw(st.integers(0, max_nodes))
    nodes = []
    dirs = 1
    for _ in range(count):
        kind = draw(st.sampled_from(KINDS))
        parent = draw(st.integers(0, dirs - 1))
        depth = draw(st.integers(1, 40)) if kind == "chain" else 0
        nodes.append(Node(parent, kind, draw(_NAMES), depth))
        if kind == "dir":
            dirs += 1
    return TreeSpec(tuple(nodes))


def build_outside(path: Path) -> None:
    """The host directory beside the tree: a file, a subdirectory with a file, a FIFO."""
    path.mkdir()
    (path / "keep").write_text("precious")
    (path / "sub").mkdir()
    (path / "sub" / "deeper").write_text("also precious")
    os.mkfifo(path / "fifo")


def _make(node: Node, parent: Path, target: Path, outside: Path) -> None:
    """Create one node that is not a symbolic link."""
    if node.kind == "dir":
        target.mkdir()
    elif node.kind == "file":
        # O_EXCL: never opens what is there already (a FIFO would block).
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.write(fd, b"tenant data")
        finally:
            os.close(fd)
    elif node.kind == "chain":
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            name = node.name
            for _ in range(node.depth):
                os.mkdir(name, dir_fd=fd)
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = child
                name = "c"
        finally:
            os.close(fd)
    elif node.kind == "fifo":
        os.mkfifo(target)
    elif node.kind == "socket":
        if len(os.fsencode(target)) < 100:  # sun_path is short
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(os.fspath(target))
    elif node.kind == "hardlink_outside":
        os.link(outside / "keep", target)


def build_tree(spec: TreeSpec, top: Path, outside: Path) -> None:
    """Create ``spec`` under the (existing) directory ``top``; name clashes are skipped."""
    dirs = [top]
    links = {
        "link_outside_dir": outside,
        "link_outside_file": outside / "keep",
        "link_outside_fifo": outside / "fifo",
        "link_inside": top,
        "dangling": top / "no such entry",
    }
    for node in spec.nodes:
        parent = dirs[node.parent]
        target = parent / node.name
        try:
            if node.kind in links:
                target.symlink_to(links[node.kind])
            else:
                _make(node, parent, target, outside)
        except OSError as exc:
            if exc.errno not in _CLASH:
                raise
        if node.kind == "dir":
            dirs.append(target if target.is_dir() and not target.is_symlink() else top)
