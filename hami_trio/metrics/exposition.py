"""The measured fast renderer of the vGPU families: label strings rendered once, rows written as
exposition text directly (prometheus-client's own generic renderer is several times slower on
thousands of series).  :class:`FastGauge` is a ``Metric``, so prometheus-client's encoders
still serve the OpenMetrics and protobuf formats; :func:`hami_trio.metrics.http.render_metrics`
uses :meth:`FastGauge.exposition` for the text format.  See docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

__all__ = ["FastCounter", "FastGauge", "escape_label_value", "render_labels"]


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


class FastGauge(Metric):
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
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self._rows: list[tuple[tuple[str, ...], str, int]] = []
        super().__init__(name, documentation, "gauge")
        self.labelnames = tuple(labelnames)

    @property
    def samples(self) -> list[Sample]:
        """The samples as prometheus-client values (built on each access)."""
        return [
            Sample(self.name, dict(zip(self.labelnames, values, strict=True)), float(value))
            for values, _, value in self._rows
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        # Metric.__init__ assigns an empty list; samples are only added through add().
        if value:
            raise TypeError("add samples to a FastGauge with add()")

    def __len__(self) -> int:
        return len(self._rows)

    def truncate(self, length: int) -> None:
        """Drop the samples added after the first ``length`` (a failed container's rows)."""
        del self._rows[length:]

    def add(self, values: tuple[str, ...], rendered: str, value: int) -> None:
        """Add a sample: label values, their rendering from :func:`_render_labels`, value."""
        self._rows.append((values, rendered, value))

    def exposition(self, openmetrics: bool = False) -> str:
        """``# HELP``, ``# TYPE`` and one line per sample (the same lines in text 0.0.4 and
        OpenMetrics, so ``openmetrics`` changes nothing)."""
        name = self.name
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        return head + "".join(f"{name}{rendered} {value}\n" for _, rendered, value in self._rows)


class FastCounter(Metric):
    """A counter family rendered like :class:`FastGauge` (int or float values, no
    ``_created``).

    ``name`` is given without ``_total``; every sample is ``name_total``.  The text format
    names the ``# HELP``/``# TYPE`` lines ``name_total`` (as prometheus-client does),
    OpenMetrics names them ``name``.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self._rows: list[tuple[tuple[str, ...], str, float]] = []
        super().__init__(name, documentation, "counter")
        self.labelnames = tuple(labelnames)

    @property
    def samples(self) -> list[Sample]:
        """The samples as prometheus-client values (built on each access)."""
        return [
            Sample(
                f"{self.name}_total", dict(zip(self.labelnames, values, strict=True)), float(value)
            )
            for values, _, value in self._rows
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:
            raise TypeError("add samples to a FastCounter with add()")

    def __len__(self) -> int:
        return len(self._rows)

    def truncate(self, length: int) -> None:
        """Drop the samples added after the first ``length``."""
        del self._rows[length:]

    def add(self, values: tuple[str, ...], rendered: str, value: float) -> None:
        """Add a sample: label values, their rendering, value (an int or a finite float,
        never negative)."""
        self._rows.append((values, rendered, value))

    def exposition(self, openmetrics: bool = False) -> str:
        """``# HELP``, ``# TYPE`` and one ``name_total`` line per sample."""
        sample = f"{self.name}_total"
        head_name = self.name if openmetrics else sample
        help_text = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        head = f"# HELP {head_name} {help_text}\n# TYPE {head_name} counter\n"
        return head + "".join(
            f"{sample}{rendered} {value!r}\n" for _, rendered, value in self._rows
        )
