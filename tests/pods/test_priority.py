"""A container's CUDA_TASK_PRIORITY from its pod spec: atoi, quantities, the env rules."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from hami_trio.pods.decode import pod_info_from_object
from hami_trio.pods.priority import (
    PRIORITY_RESOURCE,
    TASK_PRIORITY_ENV,
    c_atoi,
    parse_quantity,
    spec_priorities,
    spec_priority,
)

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_LIBC.atoi.argtypes = [ctypes.c_char_p]
_LIBC.atoi.restype = ctypes.c_int


@given(
    st.one_of(
        st.text(),
        st.from_regex(r"\A[ \t\n\v\f\r]*[+-]?[0-9]{0,25}[^0-9]?.{0,3}\Z"),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
    )
)
@example("")
@example("   -0012abc")
@example("2147483648")
@example("-2147483649")
@example("99999999999999999999999")
@example("+-1")
@example("\u0661")  # ARABIC-INDIC DIGIT ONE: not a digit to strtol
def test_c_atoi_is_what_hami_core_stores(text: str) -> None:
    """HAMi-core stores ``atoi(getenv(...))``: the real libc decides."""
    raw = text.encode("utf-8", "surrogatepass")
    if b"\0" in raw:
        raw = raw.split(b"\0", 1)[0]  # an environment value ends at its first NUL
        text = raw.decode("utf-8", "surrogatepass")
    assert c_atoi(text) == _LIBC.atoi(raw)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("0", 0),
        ("-3", -3),
        ("1500m", 2),  # Value() rounds up
        ("0.1", 1),
        ("1k", 1000),
        ("2Ki", 2048),
        ("1e3", 1000),
        ("12E-1", 2),
        ("100Ei", (1 << 63) - 1),  # saturates
        ("", None),
        ("one", None),
        ("1 ", None),
        ("1" * 65, None),
    ],
)
def test_parse_quantity(text: str, value: int | None) -> None:
    assert parse_quantity(text) == value


def env(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"name": "main", "env": list(entries)}


@pytest.mark.parametrize(
    ("container", "priority"),
    [
        pytest.param(env({"name": TASK_PRIORITY_ENV, "value": "0"}), 0, id="literal"),
        pytest.param(
            env(
                {"name": TASK_PRIORITY_ENV, "value": "0"}, {"name": TASK_PRIORITY_ENV, "value": "1"}
            ),
            1,
            id="the last entry wins (the webhook appends)",
        ),
        pytest.param(
            env({"name": TASK_PRIORITY_ENV, "valueFrom": {"configMapKeyRef": {}}}),
            None,
            id="valueFrom says nothing",
        ),
        pytest.param(env({"name": TASK_PRIORITY_ENV}), 0, id="no value: empty, atoi 0"),
        pytest.param(env({"name": TASK_PRIORITY_ENV, "value": " 7x"}), 7, id="atoi"),
        pytest.param(env({"name": "OTHER", "value": "0"}), None, id="another variable"),
        pytest.param(
            {"name": "main", "resources": {"limits": {PRIORITY_RESOURCE: "1"}}},
            1,
            id="the resource when no env entry",
        ),
        pytest.param(
            {
                "name": "main",
                "env": [{"name": TASK_PRIORITY_ENV, "value": "0"}],
                "resources": {"limits": {PRIORITY_RESOURCE: "1"}},
            },
            0,
            id="env before the resource",
        ),
        pytest.param(
            {"name": "main", "resources": {"limits": {PRIORITY_RESOURCE: "lots"}}},
            None,
            id="an unreadable quantity says nothing",
        ),
        pytest.param(
            {"name": "main", "resources": {"limits": {PRIORITY_RESOURCE: "4294967297"}}},
            1,
            id="the webhook's decimal through atoi",
        ),
        pytest.param({"name": "main"}, None, id="nothing"),
        pytest.param({"name": "main", "env": "junk", "resources": []}, None, id="wrong types"),
        pytest.param("junk", None, id="not an object"),
    ],
)
def test_spec_priority(container: Any, priority: int | None) -> None:
    assert spec_priority(container) == priority


def test_pod_info_carries_the_priority_of_each_container_that_sets_one() -> None:
    pod = pod_info_from_object(
        {
            "metadata": {"uid": "u", "namespace": "n", "name": "p"},
            "spec": {
                "initContainers": [env({"name": TASK_PRIORITY_ENV, "value": "3"}) | {"name": "i"}],
                "containers": [
                    env({"name": TASK_PRIORITY_ENV, "value": "0"}),
                    {"name": "sidecar"},
                    {"env": [{"name": TASK_PRIORITY_ENV, "value": "0"}]},  # no name
                ],
            },
        }
    )
    assert dict(pod.priorities) == {"i": 3, "main": 0}
    assert spec_priorities({"containers": "junk"}) == {}
