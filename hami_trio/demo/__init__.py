"""The local demo (``hami-trio demo``): the whole agent on one machine with simulated workloads.

Modules, from pure to I/O:

- :mod:`~hami_trio.demo.scenario` - the workloads, their timeline, the root's layout (pure);
- :mod:`~hami_trio.demo.report` - what a run recorded, its summary and checks (pure);
- :mod:`~hami_trio.demo.scrape` - one scrape of the agent's ``/metrics`` (a pure parser);
- :mod:`~hami_trio.demo.view` - the live table (pure renderers, a small screen writer);
- :mod:`~hami_trio.demo.sandbox` - container-like namespaces and mounts for a workload;
- :mod:`~hami_trio.demo.workload` - one simulated HAMi-core workload (its own process);
- :mod:`~hami_trio.demo.runner` - the orchestration: agent, workloads, timeline, shutdown;
- :mod:`~hami_trio.demo.agent` - the real agent (``serve_agent``) in the demo's process;
- :mod:`~hami_trio.cli.demo` - the ``demo`` command.

The entry points are :func:`hami_trio.demo.runner.run_demo` with
:func:`hami_trio.demo.agent.serve_demo_agent`.  Nothing is imported here on purpose: each
workload runs as ``python -m hami_trio.demo.workload``, and a package that imported that
module first would make ``runpy`` warn and load it twice.  See docs/demo.md.
"""
