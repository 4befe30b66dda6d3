"""A Python rendition of ``promtool check metrics`` (client_golang's promlint default rules).

The metrics tests lint the exposition text with these rules wherever they run (a developer's
machine often has no promtool), written from promlint's documented behaviour: help text
present; base units; ``_total`` only and always on counters; ``_bucket``/``_count``/``_sum``
and ``le``/``quantile`` reserved for histograms and summaries; no type name in a metric name;
no ``:``; no camelCase metric or label names; no abbreviated units.  When a ``promtool``
binary is on PATH (CI installs one, see .ci/run) the tests run it on the same text as well,
which keeps this rendition honest.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

__all__ = ["Problem", "lint"]

_CAMEL = re.compile(r"[a-z][A-Z]")
_UNITS = {
    "amperes": "amperes",
    "bytes": "bytes",
    "celsius": "celsius",
    "grams": "grams",
    "joules": "joules",
    "kelvin": "kelvin",
    "meters": "meters",
    "metres": "metres",
    "seconds": "seconds",
    "volts": "volts",
    "minutes": "seconds",
    "hours": "seconds",
    "days": "seconds",
    "weeks": "seconds",
    "kelvins": "kelvin",
    "fahrenheit": "celsius",
    "rankine": "celsius",
    "inches": "meters",
    "yards": "meters",
    "miles": "meters",
    "bits": "bytes",
    "calories": "joules",
    "pounds": "grams",
    "ounces": "grams",
}
_PREFIXES = (
    "pico",
    "nano",
    "micro",
    "milli",
    "centi",
    "deci",
    "deca",
    "hecto",
    "kilo",
    "kibi",
    "mega",
    "mibi",
    "giga",
    "gibi",
    "tera",
    "tebi",
    "peta",
    "pebi",
)
_ABBREVIATIONS = ["s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


@dataclass(frozen=True, order=True)
class Problem:
    """One lint finding, as promtool prints it (``name: text``)."""

    metric: str
    text: str


def _units(name: str) -> tuple[str, str] | None:
    for part in name.split("_"):
        if part in _UNITS:
            return part, _UNITS[part]
        for prefix in _PREFIXES:
            if part.startswith(prefix) and part[len(prefix) :] in _UNITS:
                return part, _UNITS[part[len(prefix) :]]
    return None


def _family_of(sample: str, families: dict[str, str]) -> str | None:
    if sample in families:
        return sample
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_gsum", "_gcount", "_info"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in families:
            return sample[: -len(suffix)]
    return None


def lint(text: str) -> list[Problem]:
    """Lint Prometheus text-format exposition; returns the problems, sorted."""
    families: dict[str, str] = {}
    helps: set[str] = set()
    labels: dict[str, set[str]] = defaultdict(set)
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = kind.strip()
        elif line.startswith("# HELP "):
            helps.add(line.split(" ", 3)[2])
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            if match is None:
                continue
            family = _family_of(match.group(1), families)
            if family is None:
                families[match.group(1)] = "untyped"
                family = match.group(1)
            labels[family].update(_LABEL.findall(match.group(3) or ""))
    problems: set[Problem] = set()
    for name, kind in families.items():

        def report(text: str, name: str = name) -> None:
            problems.add(Problem(name, text))

        lower = name.lower()
        if name not in helps:
            report("no help text")
        units = _units(name)
        if units is not None and units[0] != units[1]:
            report(f'use base unit "{units[1]}" instead of "{units[0]}"')
        if kind == "counter" and not name.endswith("_total"):
            report('counter metrics should have "_total" suffix')
        if kind not in ("counter", "untyped") and name.endswith("_total"):
            report('non-counter metrics should not have "_total" suffix')
        if kind != "untyped":
            if kind != "histogram" and name.endswith("_bucket"):
                report('non-histogram metrics should not have "_bucket" suffix')
            if kind not in ("histogram", "summary") and name.endswith(("_count", "_sum")):
                report("non-histogram and non-summary metrics should not have that suffix")
            if kind != "histogram" and "le" in labels[name]:
                report('non-histogram metrics should not have "le" label')
            if kind != "summary" and "quantile" in labels[name]:
                report('non-summary metrics should not have "quantile" label')
        for type_name in ("counter", "gauge", "summary", "histogram", "gaugehistogram"):
            if f"_{type_name}_" in lower or lower.endswith(f"_{type_name}"):
                report(f"metric name should not include type '{type_name}'")
        if ":" in name:
            report("metric names should not contain ':'")
        if _CAMEL.search(name):
            report("metric names should be written in 'snake_case' not 'camelCase'")
        if any(_CAMEL.search(label) for label in labels[name]):
            report("label names should be written in 'snake_case' not 'camelCase'")
        if any(f"_{a}_" in lower or lower.endswith(f"_{a}") for a in _ABBREVIATIONS):
            report("metric names should not contain abbreviated units")
    return sorted(problems)
