"""The package version: the single source hatchling reads at build time.

A literal instead of ``importlib.metadata`` because the CLI is exec'd per allocation by
device plugins, and the metadata scan is a large part of every start-up
(docs/benchmarks.md, Start-up and process helpers).
"""

__version__ = "0.1.0"
