"""Hypothesis strategies for the debug view: container directories as the lister reports them.

:func:`container_states` gives a ``ContainerState`` for a hostile directory: a name of any
characters (controls, lone surrogates as Python reads a name that is not UTF-8, very long),
and a ``.cache`` file from :func:`tests.strategies.layout.region_files` that either loads (its
snapshot, through the monitor's own decoder) or is refused (its rejection), or no file yet.
"""

from __future__ import annotations

from hypothesis import strategies as st

from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import RejectReason
from hami_trio.monitor.snapshot import UsageSnapshot, parse_region
from hami_trio.monitor.state import ContainerKey, ContainerState, ContainerStatus, Rejection
from tests.strategies.layout import region_files

__all__ = ["container_states", "hostile_names"]


def hostile_names() -> st.SearchStrategy[str]:
    """Directory-name parts: anything but ``/`` and NUL, surrogates and controls included."""
    chars = st.characters(blacklist_characters="/\x00", blacklist_categories=())
    return st.one_of(
        st.text(chars, min_size=1, max_size=40),
        st.text(chars, min_size=600, max_size=700),  # past the document's text cap
        st.sampled_from(["main", "x\udcff", "evil\x1b[2J\n", "\u2028"]),
    )


@st.composite
def container_states(draw: st.DrawFn) -> ContainerState[UsageSnapshot]:
    """One container directory of a tick: loaded, refused or without a file."""
    key = ContainerKey(draw(hostile_names()), draw(hostile_names()))
    directory = f"/hook/containers/{key.dirname}"
    if draw(st.booleans()):
        return ContainerState(key, directory, None, ContainerStatus.NO_CACHE_FILE, None, None)
    data = draw(region_files())
    try:
        snapshot = parse_region(data)
    except CacheFileRejected as exc:
        rejection = Rejection(RejectReason(exc.reason), str(exc))
        return ContainerState(key, directory, "x.cache", ContainerStatus.REJECTED, None, rejection)
    except ValueError:
        rejection = Rejection(RejectReason.TOO_SMALL, "short")
        return ContainerState(key, directory, "x.cache", ContainerStatus.REJECTED, None, rejection)
    return ContainerState(key, directory, "x.cache", ContainerStatus.LOADED, snapshot, None)
