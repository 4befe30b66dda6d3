"""Fuzz campaigns of hami-trio: hypothesis properties over the project's own strategies.

``fuzz/run`` is the command; :mod:`fuzz.campaign` the runner; :mod:`fuzz.targets` the
registry of targets (one module each).  See docs/fuzzing.md.
"""
