#!/usr/bin/env python3
"""Storms of Python processes for bench/concurrent_start.py (see bench/_forkstorm.py).

``pystorm.py broker --storm N [--deadline S] [--sandboxed] SOCKET``
    N Python processes each ask the broker for their host PID with the Python client
    (``hami_trio.broker.client.query_host_pid``: every check HAMi-core makes, one deadline,
    the ``LIBVGPU_HOSTPID_BROKER`` switch from the environment).  With ``--sandboxed`` it
    runs as the client of the sandbox in tests/clients/harness.py: it is started as root,
    imports everything, drops to uid/gid 65534, prints ``ready`` and waits for ``go`` on
    stdin before it forks (the venv under /root is unreadable to uid 65534).

``pystorm.py cuda --storm N [--lock FILE] [--libcuda NAME]``
    N processes each time real CUDA through ctypes: ``cuInit(0)``, ``cuDeviceGet(0)``, then
    ``cuDevicePrimaryCtxRetain`` + ``cuDevicePrimaryCtxRelease`` - with ``--lock``, inside a
    node-wide ``flock`` on FILE, as HAMi-core's fallback path does.  Phases are reported
    separately (init, retain, release).  Exit status 3 and one line when libcuda cannot be
    loaded or ``cuInit`` fails in the parent's probe (no GPU): nothing is forked.

The report format is the storm format of ``hostpid-client --storm`` (bench/_storm.py parses
both).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._forkstorm import WorkResult, storm

NOBODY = 65534
CUDA_REASONS = ["cuInit", "cuDeviceGet", "lock", "cuDevicePrimaryCtxRetain", "release"]


def _drop_privileges() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _broker(args: argparse.Namespace) -> int:
    from hami_trio.broker.client import Reason, query_host_pid

    reasons = [reason.value for reason in Reason]
    path, deadline = args.socket, args.deadline

    def work() -> WorkResult:
        answer = query_host_pid(path, deadline)
        if isinstance(answer, int):
            return 0, answer, ()
        return 1 + reasons.index(answer.reason.value), 0, ()

    if args.sandboxed:
        _drop_privileges()
        print("ready", flush=True)
        sys.stdin.readline()
    return storm(args.storm, work, reasons=reasons)


def load_libcuda(name: str) -> ctypes.CDLL | str:
    """The driver library, or why it cannot be used (not loadable, or cuInit fails).

    Probing ``cuInit`` happens in a forked child, so this process stays uninitialised (a
    CUDA context does not survive ``fork``).
    """
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        return f"{name} not loadable: {exc}"
    pid = os.fork()
    if pid == 0:
        os._exit(min(int(lib.cuInit(0)), 255))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        return f"{name} loaded, but cuInit(0) failed with CUresult {code} (no usable GPU)"
    return lib


def _cuda(args: argparse.Namespace) -> int:
    lib = load_libcuda(args.libcuda)
    if isinstance(lib, str):
        print(f"cuda unavailable: {lib}")
        return 3
    # The _v2 entry point is what cuda.h maps cuDevicePrimaryCtxRelease to since CUDA 11.
    release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or lib.cuDevicePrimaryCtxRelease
    lock_path = args.lock

    def work() -> WorkResult:
        started = time.monotonic_ns()
        if lib.cuInit(0) != 0:
            return 1, 0, ()
        device = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(device), 0) != 0:
            return 2, 0, ()
        init = time.monotonic_ns() - started
        fd = -1
        try:
            if lock_path is not None:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
            before = time.monotonic_ns()
            context = ctypes.c_void_p()
            if lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
                return 4, 0, (init,)
            retained = time.monotonic_ns()
            if release(device) != 0:
                return 5, 0, (init, retained - before)
            released = time.monotonic_ns()
        except OSError:
            return 3, 0, (init,)
        finally:
            if fd >= 0:
                os.close(fd)  # closing the descriptor drops the flock
        return 0, os.getpid(), (init, retained - before, released - retained)

    return storm(args.storm, work, reasons=CUDA_REASONS, phase_names=["init", "retain", "release"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    broker = sub.add_parser("broker", help="Python client storm against the broker")
    broker.add_argument("--storm", type=int, required=True)
    broker.add_argument("--deadline", type=float, default=0.5)
    broker.add_argument("--sandboxed", action="store_true")
    broker.add_argument("socket", type=Path)
    cuda = sub.add_parser("cuda", help="real cuInit + primary context retain/release")
    cuda.add_argument("--storm", type=int, required=True)
    cuda.add_argument("--lock", type=Path, help="hold this flock around retain + release")
    cuda.add_argument("--libcuda", default="libcuda.so.1")
    args = parser.parse_args(argv)
    if args.storm < 1:
        parser.error("--storm must be at least 1")
    return _broker(args) if args.mode == "broker" else _cuda(args)


if __name__ == "__main__":
    sys.exit(main())
