"""Helpers for tests that need real kernel isolation: other UIDs, PID and mount namespaces, C.

How this works: the test process runs as root (CI does too), so a test can fork a child and
give that child another UID or its own namespaces without touching the machine:

- :func:`run_in_child` forks, optionally drops the child to another UID and/or moves it into
  new PID and mount namespaces (the function then runs as PID 1 of its own namespace, with a
  private ``/proc``), runs a plain function there and returns its pickled result together with
  the child's PID as the host sees it.  The function must not use trio: it runs in a forked
  copy of the test process.  Call it from a worker thread (``trio.to_thread.run_sync``) when
  the function talks to a server running in the test's own trio loop.
- :func:`namespace_argv` prefixes a command with ``unshare`` so that an exec'd program (a C
  client, ``python -m hami_trio ...``) runs as PID 1 of a new PID namespace with a private
  ``/proc``; mounts made there never reach the machine's mount tree.
- :func:`world_readable_dir` and :func:`build_c` produce binaries that a process dropped to
  uid 65534 can execute: pytest's ``tmp_path`` and the venv live under directories only root
  can enter.

The namespace and privilege primitives themselves live in :mod:`hami_trio.demo.sandbox`
(the local demo builds its workloads' sandboxes with them); this module re-exports
``NOBODY`` and ``drop_privileges`` for the tests.

Every child is waited for (and killed on timeout) before these helpers return.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami_trio.demo.sandbox import NOBODY, drop_privileges, enter_namespaces, mount_proc
from tests.programs import need

__all__ = [
    "NOBODY",
    "ChildError",
    "ChildResult",
    "build_c",
    "drop_privileges",
    "namespace_argv",
    "run_in_child",
    "world_readable_dir",
]


class ChildError(AssertionError):
    """The function raised in the child, or the child died; the message has the details."""


@dataclass(frozen=True)
class ChildResult:
    """What :func:`run_in_child` returns."""

    value: Any
    #: PID of the process that ran the function, in the test's (host) PID namespace.
    host_pid: int


def _child_main(
    write_fd: int,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    uid: int | None,
    pid_namespace: bool,
    mount_namespace: bool,
) -> None:
    """Runs in the forked child; never returns."""
    status = 1
    try:
        try:
            if pid_namespace or mount_namespace:
                enter_namespaces(pid=pid_namespace, mount=mount_namespace)
            if pid_namespace:
                # unshare(CLONE_NEWPID) applies to children only: fork once more.  This
                # process is still in the host's namespace, so it reports the grandchild's
                # host PID, and only then lets the grandchild go on (keeps the order).
                go_read, go_write = os.pipe()
                inner = _fork()
                if inner:
                    os.close(go_read)
                    os.write(write_fd, b"P" + inner.to_bytes(8, "little"))
                    os.close(go_write)
                    _, wait_status = os.waitpid(inner, 0)
                    os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)
                os.close(go_write)
                os.read(go_read, 1)  # EOF once the parent has reported our PID
                os.close(go_read)
                if mount_namespace:
                    mount_proc()
            if uid is not None:
                drop_privileges(uid, uid)
            payload = pickle.dumps((True, func(*args)))
        except BaseException as exc:  # reported to the parent; the child exits below
            payload = pickle.dumps((False, "".join(traceback.format_exception(exc))))
        os.write(write_fd, b"R" + len(payload).to_bytes(8, "little"))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
        status = 0
    finally:
        os._exit(status)


def _fork() -> int:
    # Python 3.12+ warns about fork() in a process with threads (trio's thread cache); the
    # child here only runs plain code and exits with os._exit, which is what the warning
    # is about being careful with.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("child did not answer in time")
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("child exited without a result")
        data += chunk
    return data


def run_in_child(
    func: Callable[..., Any],
    *args: Any,
    uid: int | None = None,
    pid_namespace: bool = False,
    mount_namespace: bool = False,
    timeout: float = 30.0,
) -> ChildResult:
    """Run ``func(*args)`` in a forked child and return its result.

    Args:
        func: a picklable-result function using no trio and no threads.
        uid: drop the child to this UID (and the same GID) before calling ``func``.
        pid_namespace: run ``func`` as PID 1 of a new PID namespace (with ``mount_namespace``,
            a fresh ``/proc`` of that namespace is mounted).
        mount_namespace: run ``func`` in a private mount namespace.
        timeout: seconds before the child is killed.

    Returns:
        ``func``'s return value and the host PID of the process that ran it.

    Raises:
        ChildError: ``func`` raised (the child's traceback is in the message), or the child
            died or timed out.
    """
    read_fd, write_fd = os.pipe()
    pid = _fork()
    if pid == 0:
        os.close(read_fd)
        _child_main(write_fd, func, args, uid, pid_namespace, mount_namespace)
    os.close(write_fd)
    deadline = time.monotonic() + timeout
    host_pid = pid
    try:
        tag = _read_exact(read_fd, 1, deadline)
        if tag == b"P":
            host_pid = int.from_bytes(_read_exact(read_fd, 8, deadline), "little")
            tag = _read_exact(read_fd, 1, deadline)
        size = int.from_bytes(_read_exact(read_fd, 8, deadline), "little")
        ok, value = pickle.loads(_read_exact(read_fd, size, deadline))
    except (TimeoutError, EOFError) as exc:
        os.kill(pid, signal.SIGKILL)
        raise ChildError(f"child {pid}: {exc}") from None
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if not ok:
        raise ChildError(f"function failed in child {host_pid}:\n{value}")
    if os.waitstatus_to_exitcode(status) != 0:
        raise ChildError(f"child {pid} exited with status {os.waitstatus_to_exitcode(status)}")
    return ChildResult(value, host_pid)


def namespace_argv(argv: Sequence[str], *, mount_proc: bool = True) -> list[str]:
    """``argv`` run as PID 1 of a new PID namespace (and mount namespace, private ``/proc``).

    Needs root.  ``unshare --fork`` stays in the host namespace as the parent of the program,
    so the program's host PID is the only child of the ``unshare`` process.
    """
    prefix = ["unshare", "--pid", "--fork", "--kill-child"]
    if mount_proc:
        prefix += ["--mount", "--propagation", "private", "--mount-proc"]
    return [*prefix, *argv]


@contextmanager
def world_readable_dir(prefix: str = "hami-trio-") -> Iterator[Path]:
    """A fresh directory under ``/tmp`` with mode 0755, removed afterwards.

    Unlike pytest's ``tmp_path`` (under a 0700 directory), every UID can enter it, so a child
    dropped to uid 65534 can run programs from it.  A short path also keeps Unix socket
    paths under their 107-byte limit.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build_c(source: Path, out_dir: Path, *, flags: Sequence[str] = ()) -> Path:
    """Compile one C file with gcc into ``out_dir`` (mode 0755 binary).

    Args:
        source: the ``.c`` file.
        out_dir: where the binary goes (use :func:`world_readable_dir` if another UID runs it).
        flags: extra gcc flags, e.g. ``["-pthread"]``.

    Returns:
        Path of the executable, named after the source.

    Skips the test (fails it in CI) when gcc is not installed.

    Raises:
        subprocess.CalledProcessError: compilation failed (gcc's output is in ``stderr``).
    """
    need("gcc", f"builds {source.name}")
    binary = out_dir / source.stem
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(source), *flags],
        check=True,
        capture_output=True,
        text=True,
    )
    binary.chmod(0o755)
    return binary
