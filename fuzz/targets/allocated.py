"""Target ``allocated``: the ``hami.io/vgpu-devices-allocated`` decoder and the pod collector.

Whoever creates a pod can write that annotation.  The properties are stated in the tests and
run here for longer (``test.hypothesis.inner_test``):

- ``hostile``: sizes around the caps, many entries or devices, long fields, huge numbers,
  lone surrogates -> devices within every bound or ``AllocatedAnnotationError`` with a short
  message, nothing else;
- ``near_misses``: what HAMi encodes, cut, spliced and edited (Go's integer rules) -> devices
  or ``AllocatedAnnotationError``;
- ``round_trip``: what HAMi's encoder writes decodes to the same devices;
- ``bytes``: any bytes as the annotation text (undecodable bytes as surrogate escapes);
- ``collector``: a hostile pod beside a good one -> the good pod's allocation rows exactly,
  the hostile pod at most its cap, counted at most once.
"""

from __future__ import annotations

import logging
from typing import Any

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from hami_trio.pods.allocated import AllocatedAnnotationError, decode_allocated
from tests.metrics import test_pods
from tests.pods import test_allocated
from tests.strategies import metrics as st_metrics

__all__ = ["TARGET"]

# The collector warns about every hostile pod; a campaign makes thousands of them.
for _name in ("hami_trio.metrics", "hami_trio.monitor.metrics"):  # the pods', the collector's
    logging.getLogger(_name).addHandler(logging.NullHandler())


def _body(test: Any) -> Any:
    """The undecorated body of a ``@given`` test."""
    return test.hypothesis.inner_test


def check_bytes(data: bytes) -> None:
    """Any bytes as the annotation text: devices or our error, with a message."""
    raw = data.decode("utf-8", "surrogateescape")
    try:
        decode_allocated(raw)
    except AllocatedAnnotationError as exc:
        refusal = str(exc)
    else:
        return
    assert refusal, "a refusal must say what is wrong"


TARGET = Target(
    name="allocated",
    description="vgpu-devices-allocated annotation decoder and the pod collector",
    ci_seconds=6,
    weight=0.5,
    properties=(
        Property(
            "hostile",
            (st_metrics.hostile_allocated_annotations(),),
            _body(test_allocated.test_hostile_annotations_decode_within_bounds_or_raise_our_error),
            weight=2.0,
        ),
        Property(
            "near_misses",
            (st_metrics.allocated_annotations(),),
            _body(test_allocated.test_any_annotation_decodes_or_raises_its_error),
        ),
        Property(
            "round_trip",
            (st_metrics.allocated_entries(),),
            _body(test_allocated.test_what_hami_encodes_decodes_to_the_same_devices),
        ),
        Property("bytes", (st.binary(max_size=200),), check_bytes, bytes_corpus=True),
        Property(
            "collector",
            (st_metrics.hostile_allocated_annotations(),),
            _body(test_pods.test_a_hostile_annotation_costs_only_its_pod),
            weight=1.5,
        ),
    ),
)
