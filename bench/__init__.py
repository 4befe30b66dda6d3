"""Benchmarks of hami-trio (scripts; see bench/README.md).  A package so tests can import
the shared results framework, :mod:`bench._results`."""
