"""Fixtures shared by the monitor tests."""

from __future__ import annotations

import pytest

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def _no_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Talk to the tests' own servers on 127.0.0.1 directly.

    aiohttp (``trust_env``) and urllib honour ``HTTP_PROXY`` and friends; on a CI machine
    behind a proxy they would send the fake API server's and the metrics endpoint's requests
    to the proxy instead.
    """
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
