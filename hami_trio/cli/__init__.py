"""The ``hami-trio`` command line: :mod:`hami_trio.cli.main` assembles one module per command.

See docs/architecture.md.
"""
