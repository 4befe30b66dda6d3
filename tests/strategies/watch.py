"""Hypothesis strategies for the lister's inotify watch and the size probe of a region read.

- :func:`probe_sizes`: file sizes around the loader's edges and around the probe's own edge
  (the last known end :data:`~hami_trio.monitor.region.PROBE_SLACK` bytes past the tail);
- :func:`event_streams`: raw inotify event records as the kernel packs them (``wd, mask,
  cookie, len`` and a NUL-padded name), with overflow records and the watch numbers they
  name, for the pure event parser;
- :func:`tenant_moves`: what a tenant (or a host process) can do to a container directory
  between two ticks, for the test that compares a watched lister with an ``lstat`` one.
"""

from __future__ import annotations

import struct

import inotify_simple
from hypothesis import strategies as st

from hami_trio.monitor.layout import LAYOUTS
from hami_trio.monitor.region import PROBE_SLACK
from tests.strategies.layout import boundary_sizes

__all__ = ["TENANT_MOVES", "event_streams", "pack_event", "probe_sizes", "tenant_moves"]

_EVENT = struct.Struct("iIII")


def probe_sizes() -> st.SearchStrategy[int]:
    """Sizes a probed read must tell apart: the loader's edges and the probe's own edge."""
    edges = []
    for layout in LAYOUTS.values():
        end = layout.tail_offset + layout.tail_size
        edges += [end - 1, end, end + PROBE_SLACK - 1, end + PROBE_SLACK, end + PROBE_SLACK + 1]
        edges += [layout.sizeof + 1, layout.sizeof + 2]
    return st.one_of(boundary_sizes(), st.sampled_from(edges))


def pack_event(wd: int, mask: int, name: bytes = b"", cookie: int = 0) -> bytes:
    """One event record as ``read(2)`` on an inotify descriptor returns it."""
    # NUL-terminated and padded to a multiple of 16 bytes, as the kernel does
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""
    return _EVENT.pack(wd, mask, cookie, len(padded)) + padded


_MASKS = st.sampled_from(
    [
        inotify_simple.flags.CREATE,
        inotify_simple.flags.DELETE,
        inotify_simple.flags.MOVED_FROM,
        inotify_simple.flags.MOVED_TO,
        inotify_simple.flags.DELETE_SELF,
        inotify_simple.flags.MOVE_SELF,
        inotify_simple.flags.ATTRIB,
        inotify_simple.flags.UNMOUNT,
        inotify_simple.flags.IGNORED,
        inotify_simple.flags.CREATE | inotify_simple.flags.ISDIR,
    ]
)


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int]]]:
    """``(data, events)``: packed records and their ``(wd, mask)`` in order; an overflow
    record has wd -1 and mask ``Q_OVERFLOW``, as the kernel writes it."""
    events: list[tuple[int, int]] = []
    data = b""
    for _ in range(draw(st.integers(min_value=0, max_value=40))):
        if draw(st.integers(min_value=0, max_value=30)) == 0:
            wd, mask, name = -1, int(inotify_simple.flags.Q_OVERFLOW), b""
        else:
            wd = draw(st.integers(min_value=1, max_value=12))
            mask = int(draw(_MASKS))
            name = draw(st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\0", b"x")))
        events.append((wd, mask))
        data += pack_event(wd, mask, name)
    return data, events


#: What happens to a container directory between two ticks (see :func:`tenant_moves`).
TENANT_MOVES = (
    "nothing",
    "rewrite",  # new content in place (pwrite): no name changes
    "rename_over",  # a new file renamed over the cache file
    "unlink_create",  # unlinked, then created again under the same name
    "symlink",  # a symlink to another container's file swapped in
    "fifo",  # a FIFO swapped in
    "directory",  # a directory swapped in
    "hard_link_in",  # a hard link to another container's file moved in by name
    "hard_link_beside",  # a second name for the cache file, next to it
    "truncate",  # the file cut below its layout
    "grow",  # the file one byte longer
    "shrink_to_sizeof",  # the file cut to sizeof (still loads)
    "extend_far",  # the file grown by more than the probe's slack
    "unlink",  # the cache file gone
    "other_files",  # unrelated files created and deleted beside it
    "dir_renamed",  # the directory renamed away and a new one made under its name
    "dir_removed",  # the directory removed
)


def tenant_moves() -> st.SearchStrategy[list[tuple[int, str]]]:
    """A few ``(container index, move)`` pairs for one pause between ticks."""
    return st.lists(
        st.tuples(st.integers(min_value=0, max_value=2), st.sampled_from(TENANT_MOVES)),
        min_size=0,
        max_size=4,
    )
