"""Mutation testing of the pure cores (``tools/mutation/run``; docs/testing.md)."""
