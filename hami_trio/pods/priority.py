"""A container's ``CUDA_TASK_PRIORITY`` as its pod spec sets it (pure).

How this works: HAMi's webhook turns the priority resource in a container's limits
(``nvidia.com/priority``, its ``resourcePriorityName`` default) into a ``CUDA_TASK_PRIORITY``
entry appended to that container's ``env``; HAMi-core copies the variable into the shared
region with C's ``atoi`` when it creates the region (1 when the variable is unset).  The
process in the container can set its own environment before that, and can write the region
afterwards, so the region's priority is only what the process says; the pod spec is what
whoever created the pod said, and nothing in the container can change it (a container's
``env`` and ``resources`` of extended resources are immutable).  :func:`spec_priority` reads
the spec's value; how the monitor uses it: docs/monitor.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

__all__ = [
    "PRIORITY_RESOURCE",
    "TASK_PRIORITY_ENV",
    "c_atoi",
    "parse_quantity",
    "spec_priorities",
    "spec_priority",
]

#: The variable HAMi-core reads (HAMi's ``util.TaskPriority``).
TASK_PRIORITY_ENV: Final = "CUDA_TASK_PRIORITY"
#: HAMi's default priority resource (``nvidia.resourcePriorityName``).
PRIORITY_RESOURCE: Final = "nvidia.com/priority"

_LONG_MAX: Final = (1 << 63) - 1
_LONG_MIN: Final = -(1 << 63)
# strtol: leading C-locale white space, an optional sign, then ASCII digits.
_STRTOL: Final = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]*)", re.ASCII)
# resource.ParseQuantity's grammar: a signed decimal number, then a suffix or an exponent.
_QUANTITY: Final = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?\Z",
    re.ASCII,
)
_SUFFIXES: Final[Mapping[str, Fraction]] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(1 << 10),
    "Mi": Fraction(1 << 20),
    "Gi": Fraction(1 << 30),
    "Ti": Fraction(1 << 40),
    "Pi": Fraction(1 << 50),
    "Ei": Fraction(1 << 60),
}
#: The longest quantity read (Kubernetes' canonical forms are a few characters).
_MAX_QUANTITY_CHARS: Final = 64
#: The largest exponent read (a larger one is far outside int64 either way).
_MAX_EXPONENT: Final = 40


def c_atoi(text: str) -> int:
    """glibc's ``atoi``: ``(int) strtol(text, NULL, 10)`` on a 64-bit ``long``.

    Leading white space is skipped, then an optional sign and the ASCII digits that follow;
    no digits is 0; beyond ``long`` it saturates, and the cast to ``int`` keeps the low 32
    bits (two's complement), as GCC does.
    """
    match = _STRTOL.match(text)
    assert match is not None  # every part of the pattern may be empty
    sign, digits = match.groups()
    digits = digits.lstrip("0")
    if len(digits) > 19:  # beyond any long: strtol saturates
        value = _LONG_MIN if sign == "-" else _LONG_MAX
    else:
        value = int(digits or "0")
        value = -value if sign == "-" else value
        value = min(max(value, _LONG_MIN), _LONG_MAX)
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def parse_quantity(text: str) -> int | None:
    """A Kubernetes quantity's ``Value()``: rounded up to an integer, saturated to int64.

    Returns None for text that is not a quantity (or longer than 64 characters).
    """
    if len(text) > _MAX_QUANTITY_CHARS:
        return None
    match = _QUANTITY.match(text)
    if match is None:
        return None
    sign, whole, fraction, suffix = match.groups()
    if not whole and not fraction:
        return None
    value = Fraction(int(whole or "0"))
    if fraction:
        value += Fraction(int(fraction), 10 ** len(fraction))
    if suffix:
        if suffix not in _SUFFIXES:  # an exponent
            exponent = int(suffix[1:])
            if abs(exponent) > _MAX_EXPONENT:
                exponent = int(math.copysign(_MAX_EXPONENT, exponent))
            value *= Fraction(10) ** exponent
        else:
            value *= _SUFFIXES[suffix]
    if sign == "-":
        value = -value
    return min(max(math.ceil(value), _LONG_MIN), _LONG_MAX)


def spec_priority(container: object, resource: str = PRIORITY_RESOURCE) -> int | None:
    """The priority one container of a pod spec sets, or None.

    In order: the last ``env`` entry named ``CUDA_TASK_PRIORITY`` (Kubernetes lets a later
    entry override an earlier one, and the webhook appends): a literal ``value`` gives
    ``atoi(value)`` - exactly what HAMi-core stores for that environment, so an honest region
    agrees - and one with ``valueFrom`` (a ConfigMap, the downward API) says nothing; failing
    any such entry, the priority resource in ``resources.limits``: the webhook's
    ``fmt.Sprint(quantity.Value())`` through ``atoi`` (a quantity this module cannot read says
    nothing); else nothing (None): the region's priority counts, as upstream.
    """
    if not isinstance(container, dict):
        return None
    env = container.get("env")
    if isinstance(env, list):
        for entry in reversed(env):
            if isinstance(entry, dict) and entry.get("name") == TASK_PRIORITY_ENV:
                value = entry.get("value")
                if entry.get("valueFrom") is not None:
                    return None
                # An entry without a value sets the variable to "" (atoi: 0).
                return c_atoi(value) if isinstance(value, str) else c_atoi("")
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, dict) else None
    quantity = limits.get(resource) if isinstance(limits, dict) else None
    if isinstance(quantity, str):
        value = parse_quantity(quantity)
        return None if value is None else c_atoi(str(value))
    if isinstance(quantity, int) and not isinstance(quantity, bool):  # a bare JSON number
        return c_atoi(str(quantity))
    return None


def spec_priorities(spec: Mapping[str, Any], resource: str = PRIORITY_RESOURCE) -> dict[str, int]:
    """Container name -> :func:`spec_priority`, for the containers and init containers of
    ``spec`` that set one (an unnamed entry is left out; a repeated name: the last wins)."""
    found: dict[str, int] = {}
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        for container in containers:
            if not isinstance(container, dict) or not isinstance(container.get("name"), str):
                continue
            priority = spec_priority(container, resource)
            if priority is not None:
                found[container["name"]] = priority
    return found
