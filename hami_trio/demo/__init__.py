"""The local demo: the whole agent on one machine with simulated HAMi-core workloads."""
