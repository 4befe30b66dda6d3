#!/usr/bin/env python3
"""Concurrent start: N processes learn their host PID at once - broker vs the fallback path.

What it measures: the seed's release benchmark "concurrent cuInit() and first primary context
creation", made runnable without a GPU.  N separate processes (N = 50, 300, 1000) are released
at the same instant and each must learn its host PID:

- **broker, C client**: ``hostpid-client --storm N`` (clients/c), the code path HAMi-core
  takes, against ``hami-trio broker``;
- **broker, Python client**: N forked Python processes, each calling
  ``hami_trio.broker.client.query_host_pid`` (bench/pystorm.py);
- **fallback model**: what HAMi-core does without the broker - a node-wide lock (``flock`` on
  one file) held for a critical section per process, by default 60 ms: the cost of a cold
  primary-context retain (~31 ms) + release (~12 ms) and the work around it measured upstream
  (HAMi issue 1662, https://github.com/Project-HAMi/HAMi/issues/1662).
  bench/fallback_model.c; ``--hold-ms`` changes the critical section.

Both broker storms run like a container: uid 65534 in their own PID namespace, the broker
directory bind-mounted read-only (tests/clients/harness.py), every client doing all of
HAMi-core's checks under its 500 ms deadline; a run counts only if every client got a
distinct PID.  The fallback model runs on the host (a lock needs no sandbox).

For each N it reports per-process latency (release -> answer) p50/p99/max, the wall time until
all N are done, failures, and the speed-up: fallback wall time / broker wall time.

**Real CUDA.** When ``libcuda.so.1`` loads and ``cuInit`` succeeds, it also times, for the same
N, real ``cuInit(0)`` in parallel and ``cuDevicePrimaryCtxRetain`` + ``Release`` per process -
once without a lock and once under the node-wide flock (what the fallback path really costs on
this GPU; its retain+release times calibrate ``--hold-ms``).  Without a GPU these rows are
skipped and the summary says why.

Run as root from the repository root (namespaces, bind mounts)::

    .venv/bin/python bench/concurrent_start.py                 # N = 50 300 1000, one run each
    .venv/bin/python bench/concurrent_start.py --runs 3        # release figures
    .venv/bin/python bench/concurrent_start.py --sizes 50 --hold-ms 43

Every run writes a results directory (bench/_results.py) with every storm's raw output.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._results import Results, loadavg  # noqa: E402  (needs the repository on sys.path)
from bench._storm import StormReport, parse_storm, run_sandboxed, sandbox_with_broker  # noqa: E402
from tests.clients.harness import (  # noqa: E402
    Sandbox,
    build_c_client,
    c_client_build_command,
)
from tests.sandbox import world_readable_dir  # noqa: E402

HERE = Path(__file__).resolve().parent
PYSTORM = HERE / "pystorm.py"
#: Upstream's measured cost of the fallback's critical section per process (HAMi issue 1662).
DEFAULT_HOLD_MS = 60
# A forked Python client costs a few MB of private memory; refuse storms that would not fit.
_PY_CLIENT_MIB = 6
CLIENT_ENV = {"PATH": "/usr/bin:/bin", "LIBVGPU_HOSTPID_BROKER": "1"}

PATHS = {
    "broker-c": "broker, C client",
    "broker-py": "broker, Python client",
    "fallback": "fallback model (flock {hold} ms)",
    "cuda-nolock": "real CUDA: cuInit + retain/release, no lock",
    "cuda-locked": "real CUDA: cuInit + retain/release under flock",
}


@dataclass
class Series:
    """The runs of one path at one N."""

    reports: list[StormReport] = field(default_factory=list)
    failed_runs: int = 0
    skipped: str = ""

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.reports)


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def record(series: Series, report: StormReport | None, returncode: int, label: str) -> None:
    """Keep a run's report; print its one-line outcome."""
    if report is None:
        series.failed_runs += 1
        print(f"    {label}: no report (exit {returncode})")
        return
    series.reports.append(report)
    if not report.all_ok:
        series.failed_runs += 1
    failures = f" failures: {report.failures}" if report.failures else ""
    print(
        f"    {label}: wall {report.wall_ms:9.1f} ms  p50 {report.p50_ms:8.2f}  "
        f"p99 {report.p99_ms:8.2f}  max {report.max_ms:8.2f}  "
        f"ok {report.successful}/{report.clients}{failures}",
        flush=True,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 300, 1000])
    parser.add_argument("--runs", type=int, default=1, help="runs per path and N (1)")
    parser.add_argument(
        "--hold-ms",
        type=int,
        default=DEFAULT_HOLD_MS,
        help=f"critical section of the fallback model ({DEFAULT_HOLD_MS} ms, HAMi issue 1662)",
    )
    parser.add_argument(
        "--deadline", type=float, default=0.5, help="C client deadline (0.5 s, HAMi-core's)"
    )
    parser.add_argument(
        "--py-deadline",
        type=float,
        default=5.0,
        help="Python client deadline (5 s: a thousand interpreters on a small machine need "
        "more than 0.5 s of CPU just to run; see bench/README.md)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=["broker-c", "broker-py", "fallback", "cuda"],
        default=["broker-c", "broker-py", "fallback", "cuda"],
    )
    parser.add_argument("--libcuda", default="libcuda.so.1", help="driver library to try")
    parser.add_argument(
        "--results-root", type=Path, help="where the results directory goes (bench/results)"
    )
    return parser.parse_args()


@dataclass
class Setup:
    """What the storms run with."""

    res: Results
    args: argparse.Namespace
    box: Sandbox
    client: Path
    model: Path
    lock: Path
    series: dict[tuple[str, int], Series]

    def one(self, key: str, size: int) -> Series:
        return self.series.setdefault((key, size), Series())


def storm_broker_c(setup: Setup, size: int, number: int) -> None:
    args, box = setup.args, setup.box
    run, report = run_sandboxed(
        setup.res,
        box,
        [
            str(setup.client),
            "--deadline",
            str(args.deadline),
            "--storm",
            str(size),
            str(box.client_socket),
        ],
        name=f"broker-c-n{size}-run{number}",
        env=CLIENT_ENV,
    )
    record(setup.one("broker-c", size), report, run.returncode, "broker, C client     ")


def storm_broker_py(setup: Setup, size: int, number: int) -> None:
    args, box = setup.args, setup.box
    one = setup.one("broker-py", size)
    need = size * _PY_CLIENT_MIB
    if mem_available_mib() < 2 * need:
        one.skipped = f"needs ~{need} MiB free"
        print(f"    broker, Python client: skipped ({one.skipped})")
        return
    run, report = run_sandboxed(
        setup.res,
        box,
        [
            sys.executable,
            str(PYSTORM),
            "broker",
            "--sandboxed",
            "--storm",
            str(size),
            "--deadline",
            str(args.py_deadline),
            str(box.client_socket),
        ],
        name=f"broker-py-n{size}-run{number}",
        env=CLIENT_ENV,
        client_drops_itself=True,
    )
    record(one, report, run.returncode, "broker, Python client")


def storm_fallback(setup: Setup, size: int, number: int) -> None:
    hold = setup.args.hold_ms
    done = setup.res.run(
        [setup.model, "--storm", str(size), "--hold-ms", str(hold), setup.lock],
        name=f"fallback-n{size}-run{number}",
        timeout=size * hold / 1000 * 3 + 60,
    )
    record(
        setup.one("fallback", size),
        parse_storm(done.stdout),
        done.returncode,
        "fallback model       ",
    )


STORMS = {"broker-c": storm_broker_c, "broker-py": storm_broker_py, "fallback": storm_fallback}


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("needs root (namespaces, bind mounts, setpriv)", file=sys.stderr)
        return 2
    if shutil.which("gcc") is None:
        print("needs gcc", file=sys.stderr)
        return 2
    series: dict[tuple[str, int], Series] = {}
    cuda_note = ""
    with Results("concurrent_start", root=args.results_root) as res, res.tee():
        env = res.environment
        print(f"cpu: {env['cpu_model']} x{env['cpu_count']}  load: {env['loadavg_start']}")
        print(f"git: {res.git.label()}  results: {res.path}")
        work = Path(tempfile.mkdtemp(prefix="ht-cstart-", dir="/tmp"))
        try:
            with world_readable_dir("ht-cstart-bin-") as bindir:
                client = build_c_client(bindir)
                res.note_command(
                    c_client_build_command(bindir),
                    name="build-hostpid-client",
                    returncode=0,
                    seconds=None,
                )
                model = work / "fallback_model"
                res.run(
                    [
                        "gcc",
                        "-O2",
                        "-Wall",
                        "-Wextra",
                        "-Werror",
                        "-o",
                        model,
                        HERE / "fallback_model.c",
                    ],
                    name="build-fallback_model",
                    check=True,
                )
                with sandbox_with_broker(res) as box:
                    setup = Setup(res, args, box, client, model, work / "vgpulock.lock", series)
                    for size in args.sizes:
                        print(f"N={size}")
                        for number in range(args.runs):
                            for key, storm in STORMS.items():
                                if key in args.paths:
                                    storm(setup, size, number)
            if "cuda" in args.paths:
                cuda_note = run_cuda(res, args, series, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"loadavg after: {loadavg()}")
        summarise(res, args, series, cuda_note)
    failed = any(s.failed_runs for s in series.values())
    return 1 if failed else 0


def run_cuda(
    res: Results, args: argparse.Namespace, series: dict[tuple[str, int], Series], work: Path
) -> str:
    """Real CUDA storms when the driver works; returns a note for the summary."""
    probe = res.run(
        [sys.executable, PYSTORM, "cuda", "--storm", "1", "--libcuda", args.libcuda],
        name="cuda-probe",
    )
    if probe.returncode == 3:
        note = probe.stdout.strip() or "cuda unavailable"
        print(f"real CUDA: skipped ({note})")
        return f"Real CUDA rows skipped: {note}."
    for size in args.sizes:
        print(f"N={size} real CUDA")
        for number in range(args.runs):
            for key, extra in (
                ("cuda-nolock", []),
                ("cuda-locked", ["--lock", str(work / "cuda.lock")]),
            ):
                one = series.setdefault((key, size), Series())
                done = res.run(
                    [
                        sys.executable,
                        PYSTORM,
                        "cuda",
                        "--storm",
                        str(size),
                        "--libcuda",
                        args.libcuda,
                        *extra,
                    ],
                    name=f"{key}-n{size}-run{number}",
                    timeout=600,
                )
                record(one, parse_storm(done.stdout), done.returncode, PATHS[key])
                phases = [line for line in done.stdout.splitlines() if "phases_ms" in line]
                for line in phases:
                    print(f"      {line}")
    return "Real CUDA rows: phases (init, retain, release) are in the raw output."


def summarise(
    res: Results, args: argparse.Namespace, series: dict[tuple[str, int], Series], note: str
) -> None:
    rows: list[list[object]] = []
    figures: dict[str, object] = {"hold_ms": args.hold_ms}
    for size in args.sizes:
        fallback = series.get(("fallback", size))
        for key, label in PATHS.items():
            one = series.get((key, size))
            if one is None:
                continue
            name = label.format(hold=args.hold_ms)
            if not one.reports:
                rows.append([size, name, one.skipped or "no report", "", "", "", "", ""])
                continue
            wall = one.median("wall_ms")
            speedup = ""
            if key.startswith("broker") and fallback and fallback.reports:
                ratio = fallback.median("wall_ms") / wall if wall else float("inf")
                speedup = f"{ratio:.0f}x"
                figures[f"speedup_{key}_n{size}"] = round(ratio, 1)
            failures = sum(r.failed for r in one.reports)
            rows.append(
                [
                    size,
                    name,
                    f"{len(one.reports) - one.failed_runs}/{len(one.reports)}",
                    f"{wall:.1f}",
                    f"{one.median('p50_ms'):.2f}",
                    f"{one.median('p99_ms'):.2f}",
                    f"{max(r.max_ms for r in one.reports):.2f}",
                    f"{failures}",
                    speedup,
                ]
            )
            figures[f"{key}_n{size}_wall_ms"] = round(wall, 1)
            figures[f"{key}_n{size}_p99_ms"] = round(one.median("p99_ms"), 2)
    print("\nsummary (medians over runs; speed-up = fallback wall / broker wall)")
    for row in rows:
        print("  " + "  ".join(str(cell) for cell in row))
    res.summary(
        "Concurrent start: N processes learn their host PID - broker vs fallback path",
        headers=[
            "N",
            "path",
            "runs all ok",
            "wall ms",
            "p50 ms",
            "p99 ms",
            "max ms",
            "failed clients",
            "speed-up vs fallback",
        ],
        rows=rows,
        figures=figures,
        notes=[
            "wall: release of all N processes -> the last one knows its PID; p50/p99/max: per "
            "process, release -> answer (medians over runs; max over runs).",
            f"Fallback model: a node-wide flock held {args.hold_ms} ms per process (cold primary "
            "context retain ~31 ms + release ~12 ms + surroundings, HAMi issue 1662).",
            f"Client deadlines: C {args.deadline} s (HAMi-core's), Python {args.py_deadline} s; "
            "broker clients run as uid 65534 in their own PID namespace behind a read-only "
            "bind mount.",
            note,
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
