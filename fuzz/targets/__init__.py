"""The registry of fuzz targets, in the order a campaign runs them.

Each module defines one :class:`~fuzz.campaign.Target` named ``TARGET``; add a new module to
:func:`all_targets` to make ``fuzz/run`` run it.
"""

from __future__ import annotations

from fuzz.campaign import Target

__all__ = ["all_targets"]


def all_targets() -> list[Target]:
    """Every target (imported on demand: a target's module may start nothing at import)."""
    from fuzz.targets import (
        allocated,
        allocation,
        broker,
        client,
        codec,
        layout,
        migalloc,
        observe,
        pods,
        remover,
    )

    return [
        codec.TARGET,
        client.TARGET,
        allocation.TARGET,
        broker.TARGET,
        layout.TARGET,
        observe.TARGET,
        migalloc.TARGET,
        allocated.TARGET,
        pods.TARGET,
        remover.TARGET,
    ]
