"""The node agent: its configuration (:mod:`hami_trio.agent.config`) and the one nursery that
runs the broker, the pod watch, the monitor and the metrics endpoint
(:mod:`hami_trio.agent.service`).

See docs/architecture.md.
"""
