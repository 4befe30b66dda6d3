"""The agent's HTTP/1.1 server (trio and h11), shared by the metrics port and the debug view."""
