"""Helpers for the agent tests: run ``hami-trio run`` as a child, and break a live broker.

:class:`AgentProcess` starts ``python -m hami_trio run --log-format=json ...`` with a clean
environment, reads its stderr in a thread (every line must be one JSON object until the
process ends; the CLI's final error line is the only plain one), and finds the metrics port
in the ``ready`` event - the structured log line is the interface a supervisor reads.

:func:`break_listener` makes a running broker's ``accept`` fail for real, from outside its
process and without touching its code: it finds the listening socket's descriptor in
``/proc/<pid>/fd`` (matching the inode ``/proc/net/unix`` lists for the path), takes a
duplicate of that descriptor with ``pidfd_getfd(2)`` (Linux 5.6+, needs ptrace rights over
the target: root here), switches the shared open file description to blocking mode and shuts
its receive side down.  Linux's ``unix_accept`` then returns ``EINVAL`` ("receive shutdown")
to the broker's next ``accept`` - an error the broker must treat as fatal.  (Shutting down a
*non-blocking* listener instead only makes ``accept`` return ``EAGAIN`` forever.)
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_SYS_PIDFD_OPEN = 434
_SYS_PIDFD_GETFD = 438
_SO_ACCEPTCON = 0x10000  # "listening" in /proc/net/unix's Flags column
_DROPPED_ENV = ("NODE_NAME", "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "LIBVGPU_HOSTPID_BROKER")


def agent_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without anything that configures the agent, plus ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _DROPPED_ENV
        and not key.startswith("HAMI_")
        and key.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        and key != "HOOK_PATH"
    }
    # Tests run side by side: the debug view on a free port, not the fixed default.
    env["HAMI_TRIO_DEBUG_BIND_ADDRESS"] = "127.0.0.1:0"
    env.update(extra or {})
    return env


def listening_fd(pid: int, socket_path: Path) -> int:
    """The descriptor number under which process ``pid`` holds the socket listening on
    ``socket_path``.

    Raises:
        AssertionError: no listening socket of that path, or ``pid`` does not hold it.
    """
    inodes = set()
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            listening = len(fields) >= 8 and int(fields[3], 16) & _SO_ACCEPTCON
            if listening and fields[7] == str(socket_path):
                inodes.add(fields[6])
    assert inodes, f"no listening Unix socket at {socket_path}"
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return int(entry)
    raise AssertionError(f"process {pid} does not hold the listener of {socket_path}")


def _syscall(number: int, *args: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.syscall(number, *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def break_listener(pid: int, socket_path: Path) -> None:
    """Make the next ``accept`` on ``pid``'s listener for ``socket_path`` fail with EINVAL."""
    target = listening_fd(pid, socket_path)
    pidfd = _syscall(_SYS_PIDFD_OPEN, pid, 0)
    try:
        fd = _syscall(_SYS_PIDFD_GETFD, pidfd, target, 0)
    finally:
        os.close(pidfd)
    try:
        # O_NONBLOCK lives in the open file description, which the duplicate shares.
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RD)
    finally:
        os.close(fd)


def http_get(port: int, path: str = "/metrics", timeout: float = 20) -> tuple[int, str]:
    """GET ``http://127.0.0.1:<port><path>``: (status, body), also for error statuses."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def wait_until(predicate: Callable[[], bool], timeout: float = 20, what: str = "") -> None:
    """Poll ``predicate`` every 20 ms (real time: it watches another process)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


class AgentProcess:
    """``python -m hami_trio run --log-format=json <args>`` in the background.

    Use as a context manager: on exit the process is killed if it still runs, and waited for.
    """

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        prefix: Sequence[str] = (),
        python_args: Sequence[str] = ("-m", "hami_trio"),
    ) -> None:
        # prefix: a command the agent runs under (e.g. ``unshare ... sh -c 'mount ...; exec'``).
        environment = dict(env or agent_env())
        if not any(arg.startswith("--debug-bind-address") for arg in args) and not environment.get(
            "HAMI_TRIO_DEBUG_BIND_ADDRESS"
        ):
            # Tests run side by side: a free port, not the fixed default.
            args = [*args, "--debug-bind-address=127.0.0.1:0"]
        # python_args: how Python starts the command line (``-c CODE`` wraps it in a probe).
        argv = [*prefix, sys.executable, *python_args, "run", "--log-format=json", *args]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=environment)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def records(self) -> list[dict[str, Any]]:
        """Every stderr line so far that is a JSON log record."""
        found = []
        for line in list(self.lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                found.append(record)
        return found

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        """The first log record matching ``predicate``, waiting for it if needed.

        Raises:
            AssertionError: the process exited, or ``timeout`` passed, without one.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for record in self.records():
                    if predicate(record):
                        return record
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"agent exited ({self.proc.returncode}):\n{self.output()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"agent log has no such record:\n{self.output()}")
                self._changed.wait(min(left, 0.1))

    def debug_port(self, timeout: float = 30) -> int:
        """Wait for the ``ready`` event; return the debug port it reports."""
        record = self.wait_for(lambda r: r.get("event") == "ready", timeout)
        return int(str(record["debug_address"]).rsplit(":", 1)[1])

    def wait_ready(self, timeout: float = 30) -> int:
        """Wait for the ``ready`` event; return the metrics port it reports."""
        record = self.wait_for(lambda r: r.get("event") == "ready", timeout)
        return int(str(record["metrics_address"]).rsplit(":", 1)[1])

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send ``signum`` and wait for the exit status."""
        self.proc.send_signal(signum)
        return self.finish(timeout)

    def finish(self, timeout: float = 20) -> int:
        """Wait for the process to exit (and its stderr to be read); return the status."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code
