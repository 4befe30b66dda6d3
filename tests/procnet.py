"""What the kernel says about a process's TCP connections (``/proc``), for the metrics-port
tests and ``bench/http_stall.py``."""

from __future__ import annotations

import os
from pathlib import Path

_OPEN_STATES = ("01", "08")  # ESTABLISHED, CLOSE_WAIT


def tcp_connections(port: int, pid: int | str = "self") -> int:
    """Established (or half-closed) TCP sockets of process ``pid`` whose local port is ``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] in _OPEN_STATES and fields[9] in inodes:
                count += 1
    return count
