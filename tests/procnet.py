"""What the kernel says about a process's TCP connections (``/proc``), for the metrics-port
tests and ``bench/http_stall.py``."""

from __future__ import annotations

import os
import socket
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


def stalled_client(
    port: int, path: str = "/metrics", source: str = ""
) -> tuple[socket.socket, bool]:
    """A client of ``127.0.0.1:port`` that sends ``GET <path>`` and never reads (4 KiB
    receive buffer, so the answer stays in the server); whether the request went out (the
    server may close a connection before it does).  ``source``: the address to connect from
    (another ``127.0.0.x`` stands for another pod)."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
    sock.settimeout(5)
    try:
        if source:
            sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
    except OSError:
        return sock, False
    return sock, True
