"""Capture what the real agent answers on a fixed tree, to compare two versions byte for byte.

A refactoring that promises "behaviour unchanged" shows it with this: build the tree once
(``--build DIR``), then run each version's ``hami-trio run`` over a fresh copy of it
(``--capture DIR --out OUT``) and ``cmp`` the two OUT folders.  The tree holds v0 and v1
regions, one to three devices, running, swapped and exited slots, a high and a low priority
container sharing a GPU (so the feedback writes), a region with no file yet and one that is
not a region.  Only values that a run measures (durations, timestamps, uptimes, the agent's
own memory and descriptors) are replaced by ``<measured>``: the list is :data:`MEASURED`
and every replaced line is counted in ``OUT/measured.txt``, so a difference hidden there is
visible too.

Usage::

    python -m tools.answers --build /tmp/tree
    python -m tools.answers --capture /tmp/tree --out /tmp/before   # in the old checkout
    python -m tools.answers --capture /tmp/tree --out /tmp/after    # in the new one
    diff -r /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PATHS = (
    "/metrics",
    "/healthz",
    "/readyz",
)
DEBUG_PATHS = (
    "/debug/state",
    "/debug/containers",
    "/debug/monitor",
    "/debug/broker",
    "/debug/pods",
)
# Metric families (and debug keys) whose values a run measures rather than derives from the
# tree; their values are replaced, their lines kept.
MEASURED = re.compile(
    r"^(hami_trio_monitor_tick_duration_seconds\w*|hami_trio_monitor_last_tick_timestamp_seconds"
    r"|hami_trio_monitor_removal_oldest_pending_seconds|hami_trio_build_info_start\w*"
    r"|hami_trio_monitor_usage_read_timestamp_seconds|hami_trio_container_blocked_seconds_total"
    r"|process_\w+|python_gc_\w+|hami_trio_http_\w*seconds\w*|hami_trio_\w*_seconds_(sum|bucket)"
    r"|hami_trio_metrics_\w+|hami_trio_scrape_\w+|hami_trio_\w*render\w*|\w+_created)(\{[^}]*\})? "
)
MEASURED_KEYS = frozenset(
    {
        "now",
        "generated_at",
        "started_at",
        "uptime_seconds",
        "last_tick_at",
        "last_tick_duration_seconds",
        "usage_read_at",
        "usage_read_seconds",
        "tick_duration_seconds",
        "age_seconds",
        "read_at",
        "blocked_seconds",
    }
)
_TICKS = 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def build(tree: Path) -> None:
    """Write the fixed tree under ``tree/containers`` (the hook path is ``tree``)."""
    from hami_trio.monitor.layout import Format
    from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, write_region

    containers = tree / "containers"
    containers.mkdir(parents=True)
    gpu_a, gpu_b, gpu_c = (f"GPU-{n:08x}-1111-2222-3333-444455556666" for n in (0xA, 0xB, 0xC))
    mib = 1 << 20

    def slot(
        pid: int, host: int, status: int, mem: tuple[int, ...], sm: tuple[int, ...]
    ) -> ProcSlot:
        return ProcSlot(
            pid=pid,
            hostpid=host,
            status=status,
            used=[
                MemoryUse(context_size=m // 8, module_size=m // 8, data_size=m - m // 4, total=m)
                for m in mem
            ],
            util=[UtilUse(sm_util=s) for s in sm],
            monitorused=list(mem),
        )

    specs: dict[str, RegionSpec] = {
        "00000000-0000-0000-0000-000000000001_inference": RegionSpec(
            uuids=[gpu_a],
            limits=[8192 * mib],
            sm_limits=[60],
            priority=0,
            recent_kernel=2,
            procs=[
                slot(1, 5000001, 1, (900 * mib,), (55,)),
                slot(2, 5000002, 1, (300 * mib,), (20,)),
            ],
        ),
        "00000000-0000-0000-0000-000000000002_training": RegionSpec(
            uuids=[gpu_a],
            limits=[16384 * mib],
            sm_limits=[40],
            priority=1,
            recent_kernel=2,
            procs=[slot(7, 5000011, 1, (4096 * mib,), (35,)), slot(8, 0, 2, (512 * mib,), (0,))],
        ),
        "00000000-0000-0000-0000-000000000003_multi": RegionSpec(
            num=3,
            uuids=[gpu_a, gpu_b, gpu_c],
            limits=[4096 * mib, 4096 * mib, 2048 * mib],
            sm_limits=[100, 50, 0],
            procs=[
                slot(1, 5000021, 1, (100 * mib, 200 * mib, 300 * mib), (10, 20, 30)),
                slot(2, 5000022, 0, (50 * mib, 0, 70 * mib), (0, 0, 0)),
            ],
        ),
        "00000000-0000-0000-0000-000000000004_legacy": RegionSpec(
            format=Format.V0,
            uuids=[gpu_b],
            limits=[2048 * mib],
            sm_limits=[25],
            procs=[slot(3, 5000031, 1, (1024 * mib,), (12,))],
        ),
        "00000000-0000-0000-0000-000000000005_idle": RegionSpec(uuids=[gpu_c], limits=[1024 * mib]),
    }
    for name, spec in specs.items():
        directory = containers / name
        directory.mkdir()
        write_region(directory / f"{name.split('_', 1)[0]}.cache", spec)
    (containers / "00000000-0000-0000-0000-000000000006_nofile").mkdir()
    bad = containers / "00000000-0000-0000-0000-000000000007_notregion"
    bad.mkdir()
    (bad / "x.cache").write_bytes(b"not a region" * 100)


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _strip_json(value: object) -> object:
    if isinstance(value, dict):
        return {
            k: ("<measured>" if k in MEASURED_KEYS else _strip_json(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_strip_json(v) for v in value]
    return value


def _metrics_lines(body: bytes) -> Iterator[tuple[bool, str]]:
    for line in body.decode().splitlines():
        if MEASURED.match(line):
            yield True, line.rsplit(" ", 1)[0] + " <measured>"
        else:
            yield False, line


def capture(tree: Path, out: Path) -> None:
    """Run ``hami-trio run`` over a copy of ``tree``; write its answers under ``out``."""
    out.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryDirectory() as work:
        hook = Path(work) / "hook"
        shutil.copytree(tree, hook, symlinks=True)
        metrics, debug = _free_port(), _free_port()
        interval = 0.25
        argv = [
            sys.executable,
            "-m",
            "hami_trio",
            "run",
            "--hook-path",
            str(hook),
            "--no-kubernetes",
            "--node-name",
            "fixed-node",
            "--interval",
            str(interval),
            "--mig-lock-path",
            str(Path(work) / "mig" / "lock"),
            "--lock-parent-path",
            str(Path(work) / "lockparent"),
            "--metrics-bind-address",
            f"127.0.0.1:{metrics}",
            "--debug-bind-address",
            f"127.0.0.1:{debug}",
        ]
        env = {k: v for k, v in os.environ.items() if k != "LIBVGPU_HOSTPID_BROKER"}
        with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE) as proc:
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        status, _, _ = _get(f"http://127.0.0.1:{metrics}/readyz")
                        if status == 200:
                            break
                    except OSError:
                        pass
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("the agent did not become ready")
                    time.sleep(0.1)
                time.sleep(interval * _TICKS)
                measured = 0
                for base, paths in ((metrics, PATHS), (debug, DEBUG_PATHS)):
                    for path in paths:
                        status, headers, body = _get(f"http://127.0.0.1:{base}{path}")
                        name = path.strip("/").replace("/", "_")
                        kind = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
                        if path == "/metrics":
                            lines = list(_metrics_lines(body))
                            measured += sum(1 for hidden, _ in lines if hidden)
                            text = "\n".join(line for _, line in lines) + "\n"
                        elif "json" in kind:
                            doc = _strip_json(json.loads(body))
                            text = json.dumps(doc, indent=1, sort_keys=False) + "\n"
                        else:
                            text = body.decode(errors="replace")
                        text = text.replace(work, "<work>")
                        (out / f"{name}.txt").write_text(f"{status} {kind}\n{text}")
                (out / "measured.txt").write_text(f"{measured} /metrics lines measured\n")
            finally:
                proc.terminate()
                proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--build", type=Path, metavar="DIR", help="write the fixed tree")
    group.add_argument("--capture", type=Path, metavar="DIR", help="run the agent over DIR")
    parser.add_argument("--out", type=Path, help="where --capture writes the answers")
    args = parser.parse_args()
    if args.build is not None:
        build(args.build)
    else:
        if args.out is None:
            parser.error("--capture needs --out")
        capture(args.capture, args.out)


if __name__ == "__main__":
    main()
