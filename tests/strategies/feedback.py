"""Hypothesis strategies for the Observe feedback step.

:func:`observed_maps` draws a whole node: a few containers sharing a small pool of GPU
UUIDs (so priorities actually meet), with activity words around the interesting values
(-1, 0, 1, 2), priorities from -7 to 2**31-1, and sometimes a duplicated UUID slot.  Keys are
plain strings; the order of the mapping is part of the draw.  :func:`granted_nodes` adds
what each container's pod gives it (:class:`~hami_trio.monitor.feedback.Grant`): honest ones
(every file UUID allocated, the file's own priority or none) or any.
"""

from __future__ import annotations

from hypothesis import strategies as st

from hami_trio.monitor.feedback import Grant, Observed

__all__ = ["GPU_POOL", "granted_nodes", "observed", "observed_maps", "priorities"]

#: Raw 96-byte UUID values the containers draw from (a node with four GPUs).
GPU_POOL = tuple(f"GPU-{i}".encode().ljust(96, b"\0") for i in range(4))

_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def priorities() -> st.SearchStrategy[int]:
    """Mostly small priorities (so they collide), plus the extremes a tenant can write."""
    return st.one_of(st.integers(-7, 4), st.sampled_from([2**31 - 1, -(2**31)]), _INT32)


def observed() -> st.SearchStrategy[Observed]:
    """One container as Observe sees it."""
    return st.builds(
        Observed,
        priority=priorities(),
        recent_kernel=st.one_of(st.integers(-2, 3), _INT32),
        utilization_switch=st.one_of(st.sampled_from([0, 1]), _INT32),
        device_keys=st.lists(st.sampled_from(GPU_POOL), max_size=5).map(tuple),
    )


def observed_maps(max_size: int = 8) -> st.SearchStrategy[dict[str, Observed]]:
    """A node: container name -> :class:`Observed` (insertion order is drawn too)."""
    return st.dictionaries(
        st.text(alphabet="abcdefgh", min_size=1, max_size=3), observed(), max_size=max_size
    )


@st.composite
def granted_nodes(
    draw: st.DrawFn, *, honest: bool, max_size: int = 8
) -> tuple[dict[str, Observed], dict[str, Grant]]:
    """A node and the grants of some of its containers.

    Honest: a grant lists every UUID the file claims (and maybe more of the pool) and sets
    no priority or the file's.  Otherwise: any UUIDs of the pool, any priority or none.
    """
    containers = draw(observed_maps(max_size))
    grants: dict[str, Grant] = {}
    for key, c in containers.items():
        if not draw(st.booleans()):
            continue
        extra = draw(st.lists(st.sampled_from(GPU_POOL), max_size=3))
        if honest:
            devices = (
                None if draw(st.booleans()) else tuple(dict.fromkeys([*c.device_keys, *extra]))
            )
            priority = draw(st.sampled_from([None, c.priority]))
        else:
            devices = draw(st.one_of(st.none(), st.just(tuple(extra))))
            priority = draw(st.one_of(st.none(), priorities()))
        grants[key] = Grant(devices=devices, priority=priority)
    return containers, grants
