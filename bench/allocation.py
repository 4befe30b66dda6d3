"""What the allocation integration costs per Allocate, in-process and as an exec'd filter.

A Go device plugin cannot import hami-trio; docs/allocation.md weighs exec'ing
``hami-trio allocate`` (or ``prepare-lock-dir``) per allocation against porting the rules.
This prints the medians that decision needs, plus the environment.  Run as any user:

    .venv/bin/python bench/allocation.py [--runs N] [--exec-runs M]

Figures are medians of wall time on a possibly busy machine; compare them as ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hami_trio.allocation import (
    ContainerAllocateResponse,
    Mount,
    configure_host_pid_broker,
    prepare_lock_parent,
)
from tests.allocation.immutable import clear_immutable


@contextlib.contextmanager
def scratch() -> Iterator[str]:
    """A temporary directory whose immutable flags (root, broker on) are cleared at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            yield tmp
        finally:
            clear_immutable(Path(tmp))


def median_us(func: object, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        func()  # type: ignore[operator]
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


def median_exec_ms(argv: list[str], stdin: bytes, env: dict[str, str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        subprocess.run(argv, input=stdin, env=env, capture_output=True, check=True)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--exec-runs", type=int, default=20)
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]} on {platform.platform()}, {os.cpu_count()} CPUs")
    me = os.geteuid()
    # A typical HAMi-core response: library, cache dir, preload, a few devices' env.
    response = ContainerAllocateResponse(
        envs={f"CUDA_DEVICE_MEMORY_LIMIT_{i}": "1000m" for i in range(4)},
        mounts=(
            Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
            Mount("/usr/local/vgpu", "/usr/local/vgpu/containers/uid_ctr", False),
            Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
            Mount("/tmp//vgpulock/", "/tmp/vgpulock", False),
        ),
    )
    with scratch() as tmp:
        parent = Path(tmp) / "tmp"
        parent.mkdir()
        parent.chmod(0o1777)
        lock = str(parent / "vgpulock")
        prepare_lock_parent(lock, me)
        prep = median_us(lambda: prepare_lock_parent(lock, me), args.runs)
        merge = median_us(lambda: configure_host_pid_broker(response, True), args.runs)
        print(f"prepare_lock_parent (existing dir): median {prep:.1f} us over {args.runs}")
        prepare_lock_parent(lock, me, broker=True)
        prep_broker = median_us(lambda: prepare_lock_parent(lock, me, broker=True), args.runs)
        print(
            f"prepare_lock_parent broker=True (hostpid already flagged): median "
            f"{prep_broker:.1f} us over {args.runs}"
        )
        print(f"configure_host_pid_broker (4 mounts): median {merge:.1f} us over {args.runs}")

        env = dict(os.environ, LIBVGPU_HOSTPID_BROKER="1")
        stdin = json.dumps(response.to_dict()).encode()
        base = median_exec_ms([sys.executable, "-c", "pass"], b"", env, args.exec_runs)
        argv = [sys.executable, "-m", "hami_trio"]
        filt = median_exec_ms(
            [*argv, "allocate", "--lock-parent", lock, "--owner", str(me)],
            stdin,
            env,
            args.exec_runs,
        )
        prep_cmd = median_exec_ms(
            [*argv, "prepare-lock-dir", lock, "--owner", str(me)], b"", env, args.exec_runs
        )
        print(f"exec python -c pass (baseline): median {base:.1f} ms over {args.exec_runs}")
        print(f"exec hami-trio allocate: median {filt:.1f} ms ({filt / base:.1f}x baseline)")
        print(f"exec hami-trio prepare-lock-dir: median {prep_cmd:.1f} ms ({prep_cmd / base:.1f}x)")


if __name__ == "__main__":
    main()
