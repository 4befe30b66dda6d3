"""The local demo (``hami-trio demo``): the whole agent on one machine with simulated workloads.

Modules, from pure to I/O: :mod:`~hami_trio.demo.scenario` (workloads, timeline, paths),
:mod:`~hami_trio.demo.report` (summary and checks), :mod:`~hami_trio.demo.scrape` (one
``/metrics`` scrape), :mod:`~hami_trio.demo.view` (the live table),
:mod:`~hami_trio.demo.sandbox` (namespaces and mounts), :mod:`~hami_trio.demo.workload`
(one simulated workload process), :mod:`~hami_trio.demo.runner` (the orchestration) and
:mod:`~hami_trio.demo.agent` (the real agent in the demo's process); the command is
:mod:`~hami_trio.cli.demo`.  Nothing is imported here on purpose: each workload runs as
``python -m hami_trio.demo.workload``, and a package that imported that module first would
make ``runpy`` warn and load it twice.  See docs/demo.md.
"""
