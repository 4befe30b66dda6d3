"""Every hypothesis strategy of the project lives in this package.

Tests and the fuzz campaign (``fuzz/``) import strategies from here and never define their
own, so a campaign explores exactly the input space the tests describe.  One module per
subject (``protocol``, ``layout``, ``allocation``, ``feedback``, ...); import them as
``from tests.strategies import protocol as st_protocol``.
"""
