"""Target ``pods``: the pod watch's decoders of pod objects, pod lists and watch lines.

Pod names, labels and annotations are written by whoever creates the pod, and the objects
arrive through the API server.  The properties are stated in tests/pods/test_decode.py and
run here for longer (``test.hypothesis.inner_test``):

- ``pod_object``: any object -> a ``PodInfo`` whose every string is encodable (lone
  surrogates became U+FFFD) and which keeps only ``hami.io/`` annotations, or
  ``WatchDecodeError``;
- ``pod_list``: a list with hostile items -> every other pod kept, each bad item reported;
- ``watch_event``: hostile pod objects in every event type -> an event or
  ``WatchDecodeError``;
- ``watch_line``: any watch line (JSON or bytes) -> an event or ``WatchDecodeError``.
"""

from __future__ import annotations

from typing import Any

from fuzz.campaign import Property, Target
from tests.pods import test_decode as test_pods
from tests.strategies import metrics as st_metrics

__all__ = ["TARGET"]


def _body(test: Any) -> Any:
    """The undecorated body of a ``@given`` test."""
    return test.hypothesis.inner_test


TARGET = Target(
    name="pods",
    description="pod watch decoders: pod objects, pod lists, watch lines",
    ci_seconds=8,
    weight=0.5,
    properties=(
        Property(
            "pod_object",
            (st_metrics.pod_objects(),),
            _body(test_pods.test_any_pod_object_decodes_to_exportable_text_or_raises_its_error),
        ),
        Property(
            "pod_list",
            (st_metrics.pod_lists(),),
            _body(test_pods.test_a_bad_pod_costs_itself_never_the_list),
        ),
        Property(
            "watch_event",
            (st_metrics.pod_objects(), st_metrics.hostile_text()),
            _body(test_pods.test_any_watch_event_with_a_hostile_pod_decodes_or_raises_its_error),
        ),
        Property(
            "watch_line",
            (st_metrics.watch_lines(),),
            _body(test_pods.test_any_watch_line_decodes_or_raises_its_error),
            bytes_corpus=True,
        ),
    ),
)
