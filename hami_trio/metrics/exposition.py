"""The measured fast renderer of the vGPU families: label strings rendered once, rows written as
exposition text directly (prometheus-client's own generic renderer is several times slower on
thousands of series).  :class:`FastGauge` is a ``Metric``, so prometheus-client's encoders
still serve the OpenMetrics and protobuf formats; :func:`hami_trio.metrics.endpoint.render_metrics`
joins every family's :meth:`FastGauge.pieces` for the text format.  See docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, TypeVar

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

__all__ = [
    "CounterRow",
    "FastCounter",
    "FastGauge",
    "GaugeRow",
    "escape_label_value",
    "render_labels",
]

_V = TypeVar("_V", int, float)
#: One sample: label values, their rendering (:func:`render_labels`), value.
GaugeRow = tuple[tuple[str, ...], str, int]
CounterRow = tuple[tuple[str, ...], str, float]
#: The rows of a family's blocks, built again on demand (see ``FastGauge.blocks``).
BlockRows = Callable[[], Iterable[tuple[tuple[str, ...], str, _V]]]


def _all_rows(
    block_rows: BlockRows[_V] | None, rows: list[tuple[tuple[str, ...], str, _V]]
) -> Iterator[tuple[tuple[str, ...], str, _V]]:
    """The rows in exposition order: the blocks' rows, then those added one by one."""
    return chain(() if block_rows is None else block_rows(), rows)


def escape_label_value(value: str) -> str:
    """A label value escaped for the text formats (both use the same three escapes)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_labels(names: Sequence[str], values: Sequence[str]) -> str:
    """The rendered label set; raises UnicodeEncodeError if a value is not valid Unicode.

    The body is encoded as UTF-8 once for all families, so a value that cannot be encoded
    (a lone surrogate) must be caught here, where it costs only its own container's rows.
    """
    text = (
        "{"
        + ",".join(f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True))
        + "}"
    )
    if not text.isascii():
        text.encode("utf-8")
    return text


class _KeptRows:
    """What :class:`FastGauge` and :class:`FastCounter` share: rows added one by one and
    lines kept from earlier scrapes (``blocks``, their rows again from ``block_rows``)."""

    _rows: list[Any]
    blocks: list[bytes]
    block_rows: Callable[[], Iterable[Any]] | None

    def __len__(self) -> int:
        blocks = 0 if self.block_rows is None else sum(1 for _ in self.block_rows())
        return len(self._rows) + blocks

    def __bool__(self) -> bool:
        return bool(self._rows) or any(self.blocks)

    def truncate(self, length: int) -> None:
        """Drop the samples :meth:`add` added after the first ``length`` of them."""
        del self._rows[length:]


class FastGauge(_KeptRows, Metric):
    """A gauge family that renders its own exposition text.

    Rendering a sample through prometheus-client costs about 10 us (a labels dict, sorting,
    escaping, float formatting); a node with a few thousand containers has tens of thousands
    of samples per scrape.  This family keeps each sample as the label values, the label
    string rendered once (cached across scrapes by the collector) and an integer value, and
    :meth:`exposition` writes the family in one pass; the HTTP endpoint uses it for both the
    Prometheus text format and OpenMetrics (a gauge's lines are the same in both).  Anything
    else that reads :attr:`samples` (``generate_latest``, ``get_sample_value``, ``name[]``
    filtering) gets ordinary :class:`~prometheus_client.samples.Sample` values, built on
    demand.

    A collector may also hand over lines it rendered earlier (:attr:`blocks`, UTF-8, with
    :attr:`block_rows` giving their rows again for :attr:`samples`): the vGPU collector keeps
    each container's lines across scrapes while the container's snapshot is the same.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self._rows: list[GaugeRow] = []
        #: Sample lines rendered earlier (:meth:`render_rows`, UTF-8; a collector keeps them
        #: across scrapes while their rows stay the same), before the rows of :meth:`add`;
        #: ``block_rows`` gives their rows again (for :attr:`samples`).
        self.blocks: list[bytes] = []
        self.block_rows: BlockRows[int] | None = None
        super().__init__(name, documentation, "gauge")
        self.labelnames = tuple(labelnames)

    @property
    def samples(self) -> list[Sample]:
        """The samples as prometheus-client values (built on each access)."""
        names = self.labelnames
        return [
            Sample(self.name, dict(zip(names, values, strict=True)), float(value))
            for values, _, value in _all_rows(self.block_rows, self._rows)
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        # Metric.__init__ assigns an empty list; samples are only added through add().
        if value:
            raise TypeError("add samples to a FastGauge with add()")

    def add(self, values: tuple[str, ...], rendered: str, value: int) -> None:
        """Add a sample: label values, their rendering from :func:`_render_labels`, value."""
        self._rows.append((values, rendered, value))

    def render_rows(self, rows: Iterable[GaugeRow]) -> str:
        """The sample lines of ``rows`` (what :meth:`encoded` writes for them)."""
        name = self.name
        return "".join([f"{name}{rendered} {value}\n" for _, rendered, value in rows])

    def encoded(self, openmetrics: bool = False) -> bytes:
        """``# HELP``, ``# TYPE`` and one line per sample, as UTF-8 (the same lines in text
        0.0.4 and OpenMetrics, so ``openmetrics`` changes nothing; the kept blocks are joined
        as they are)."""
        return b"".join(self.pieces(openmetrics))

    def pieces(self, openmetrics: bool = False) -> list[bytes]:
        """:meth:`encoded` in pieces: the head, the kept blocks themselves (not copied) and
        the lines of the added rows; the renderer joins every family's pieces at once."""
        name = self.name
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        return [head.encode(), *self.blocks, self.render_rows(self._rows).encode()]


class FastCounter(_KeptRows, Metric):
    """A counter family rendered like :class:`FastGauge` (int or float values, no
    ``_created``).

    ``name`` is given without ``_total``; every sample is ``name_total``.  The text format
    names the ``# HELP``/``# TYPE`` lines ``name_total`` (as prometheus-client does),
    OpenMetrics names them ``name``.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self._rows: list[CounterRow] = []
        #: Sample lines rendered earlier (:meth:`render_rows`, UTF-8; a collector keeps them
        #: across scrapes while their rows stay the same), before the rows of :meth:`add`;
        #: ``block_rows`` gives their rows again (for :attr:`samples`).
        self.blocks: list[bytes] = []
        self.block_rows: BlockRows[float] | None = None
        super().__init__(name, documentation, "counter")
        self.labelnames = tuple(labelnames)

    @property
    def samples(self) -> list[Sample]:
        """The samples as prometheus-client values (built on each access)."""
        sample, names = f"{self.name}_total", self.labelnames
        return [
            Sample(sample, dict(zip(names, values, strict=True)), float(value))
            for values, _, value in _all_rows(self.block_rows, self._rows)
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:
            raise TypeError("add samples to a FastCounter with add()")

    def add(self, values: tuple[str, ...], rendered: str, value: float) -> None:
        """Add a sample: label values, their rendering, value (an int or a finite float,
        never negative)."""
        self._rows.append((values, rendered, value))

    def render_rows(self, rows: Iterable[CounterRow]) -> str:
        """The sample lines of ``rows`` (what :meth:`encoded` writes for them)."""
        sample = f"{self.name}_total"
        return "".join([f"{sample}{rendered} {value!r}\n" for _, rendered, value in rows])

    def encoded(self, openmetrics: bool = False) -> bytes:
        """``# HELP``, ``# TYPE`` and one ``name_total`` line per sample, as UTF-8 (the kept
        blocks are joined as they are)."""
        return b"".join(self.pieces(openmetrics))

    def pieces(self, openmetrics: bool = False) -> list[bytes]:
        """:meth:`encoded` in pieces (see :meth:`FastGauge.pieces`)."""
        sample = f"{self.name}_total"
        head_name = self.name if openmetrics else sample
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {head_name} {help_text}\n# TYPE {head_name} counter\n"
        return [head.encode(), *self.blocks, self.render_rows(self._rows).encode()]
