"""A deliberately simple broker stand-in that answers correctly or wrongly on purpose.

Run as a separate process (stdlib only) so a test can make it listen as another uid:
``python rogue_server.py --socket PATH --mode MODE [--listen-uid UID]``.  It binds the
socket as the starting user (root in the tests, so the socket file is root-owned), then, with
``--listen-uid``, drops to that uid *before* ``listen()``: the credentials a client reads with
``SO_PEERCRED`` are the ones the listener had when it called ``listen()``.  It prints
``ready`` once listening and serves until it is terminated.  ``--backlog N`` and
``--accept-delay SECONDS`` (listen, then wait before the first ``accept``) let a test fill the
listen backlog.

Modes (what one connection gets after the server read the 8-byte request):

- ``ok``: the correct answer - status 0 and the peer's PID from ``SO_PEERCRED`` (an invalid
  request gets status 1, PID 0);
- ``wrong_magic``, ``wrong_version``, ``status1``, ``pid0``, ``pid_huge``: one 12-byte
  response with that defect;
- ``short``: the first 11 bytes of a correct response, then close;
- ``silent``: no answer; the connection is kept open until the client goes away;
- ``close``: closed at once without reading or answering.

The responses are built by hand here, not with the project's codec, because most of them are
wrong on purpose.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time

_RESPONSE = struct.Struct("!4sHHI")
_REQUEST = struct.Struct("!4sHH")
_VALID_REQUEST = _REQUEST.pack(b"HPID", 1, 1)
MODES = (
    "ok",
    "wrong_magic",
    "wrong_version",
    "status1",
    "pid0",
    "pid_huge",
    "short",
    "silent",
    "close",
)


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while len(data) < _REQUEST.size:
        chunk = conn.recv(_REQUEST.size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def answer(mode: str, conn: socket.socket) -> bytes | None:
    """The bytes to send on ``conn`` for ``mode`` (None: send nothing)."""
    request = _read_request(conn)
    pid = _peer_pid(conn)
    if mode == "ok":
        if request != _VALID_REQUEST:
            return _RESPONSE.pack(b"HPID", 1, 1, 0)
        return _RESPONSE.pack(b"HPID", 1, 0, pid)
    if mode == "wrong_magic":
        return _RESPONSE.pack(b"HPIX", 1, 0, pid)
    if mode == "wrong_version":
        return _RESPONSE.pack(b"HPID", 2, 0, pid)
    if mode == "status1":
        return _RESPONSE.pack(b"HPID", 1, 1, 0)
    if mode == "pid0":
        return _RESPONSE.pack(b"HPID", 1, 0, 0)
    if mode == "pid_huge":
        return _RESPONSE.pack(b"HPID", 1, 0, 0x8000_0000)
    if mode == "short":
        return _RESPONSE.pack(b"HPID", 1, 0, pid)[:11]
    raise ValueError(f"no fixed answer for mode {mode!r}")


def serve(path: str, mode: str, listen_uid: int | None, backlog: int, accept_delay: float) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    if listen_uid is not None:
        os.setgroups([])
        os.setgid(listen_uid)
        os.setuid(listen_uid)
    listener.listen(backlog)
    print("ready", flush=True)
    time.sleep(accept_delay)  # connections pile up in the backlog meanwhile
    held: list[socket.socket] = []
    while True:
        conn, _ = listener.accept()
        if mode == "close":
            conn.close()
            continue
        if mode == "silent":
            held.append(conn)
            # Forget connections whose client has gone, so a long run does not leak fds.
            held = [c for c in held if not _peer_gone(c)]
            continue
        try:
            data = answer(mode, conn)
            if data is not None:
                conn.sendall(data)
        except OSError:
            pass  # a client that went away is not the rogue's problem
        finally:
            conn.close()


def _peer_gone(conn: socket.socket) -> bool:
    try:
        conn.setblocking(False)
        return conn.recv(64, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--listen-uid", type=int, default=None)
    parser.add_argument("--backlog", type=int, default=socket.SOMAXCONN)
    parser.add_argument("--accept-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    serve(args.socket, args.mode, args.listen_uid, args.backlog, args.accept_delay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
