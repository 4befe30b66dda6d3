"""Target ``migalloc``: the ``hami.io/vgpu-mig-allocations`` decoder and the collector.

Whoever creates a pod writes that annotation.  The properties are stated in the tests and run
here for longer (``test.hypothesis.inner_test``):

- ``hostile``: deep nesting, lone-surrogate escapes, long label values and lists, huge
  numbers and sizes around the caps -> allocations within every bound (size, count, label
  length, encodable text) or ``MigAnnotationError`` with a short message, nothing else;
- ``near_misses``: well-formed lists, wrong types, partial runtime identity, duplicates ->
  allocations or ``MigAnnotationError``;
- ``bytes``: any bytes as the annotation text (undecodable bytes as surrogate escapes);
- ``collector``: pods with hostile names, container names and annotations beside one good
  pod -> the scrape renders as UTF-8, the good pod's rows are all there, and no pod has more
  MIG rows or longer label values than the caps allow.
"""

from __future__ import annotations

import logging
from typing import Any

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from hami_trio.pods.migalloc import MigAnnotationError, decode_mig_allocations
from tests.metrics import test_collector as test_metrics
from tests.pods import test_migalloc
from tests.strategies import metrics as st_metrics

__all__ = ["TARGET"]

# The collector warns about every hostile pod; a campaign makes thousands of them.  Without a
# handler of its own the warnings would go to stderr through logging's last resort.
for _name in ("hami_trio.metrics", "hami_trio.monitor.metrics"):  # the pods', the collector's
    logging.getLogger(_name).addHandler(logging.NullHandler())


def _body(test: Any) -> Any:
    """The undecorated body of a ``@given`` test."""
    return test.hypothesis.inner_test


def check_bytes(data: bytes) -> None:
    """Any bytes as the annotation text: allocations or our error."""
    raw = data.decode("utf-8", "surrogateescape")
    try:
        decode_mig_allocations(raw)
    except MigAnnotationError as exc:
        refusal = str(exc)
    else:
        return
    assert refusal, "a refusal must say what is wrong"


TARGET = Target(
    name="migalloc",
    description="MIG allocation annotation decoder and the collector over hostile pods",
    ci_seconds=8,
    weight=0.5,
    properties=(
        Property(
            "hostile",
            (st_metrics.hostile_mig_annotations(),),
            _body(test_migalloc.test_hostile_annotations_decode_within_bounds_or_raise_our_error),
            weight=2.0,
        ),
        Property(
            "near_misses",
            (st_metrics.mig_annotations(),),
            _body(test_migalloc.test_any_annotation_decodes_or_raises_its_error),
        ),
        Property("bytes", (st.binary(max_size=200),), check_bytes, bytes_corpus=True),
        Property(
            "collector",
            (test_metrics.TENANTS,),
            _body(test_metrics.test_no_tenant_data_fails_a_scrape),
            weight=1.5,
        ),
    ),
)
