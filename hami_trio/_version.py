"""The package version: the single source hatchling reads at build time.

A literal instead of ``importlib.metadata`` because the CLI is exec'd per allocation by
device plugins, and the metadata scan cost about 35 ms of every start-up.
"""

__version__ = "0.1.0"
