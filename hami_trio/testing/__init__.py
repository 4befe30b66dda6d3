"""Helpers for tests, benchmarks and the demo (like ``trio.testing``): simulated HAMi-core
shared regions in :mod:`hami_trio.testing.regions`.
"""
