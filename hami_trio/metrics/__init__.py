"""The agent's Prometheus side: the vGPU collector, its fast renderer, host GPU metrics over
NVML and the HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``).

See docs/architecture.md for where this package sits and docs/metrics.md for the metrics.
"""
