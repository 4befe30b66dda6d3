#!/usr/bin/env python3
"""Load benchmark of the host PID broker against a minimal C epoll server.

How this works: the script compiles ``broker_load.c`` (the load generator) and
``ref_server.c`` (the C reference server) with gcc into a temporary directory, starts
``hami-trio broker`` and the reference side by side on fresh sockets, and runs the same
scenarios against both, interleaved (ours, ref, ref, ours, ...) so that drift on a shared
machine hits both alike.  Every exchange is checked by the generator (status 0 and the PID of
the sending process).  For each run it records exchanges/s, p50/p99 latency (connect to last
byte) and the server's CPU time per exchange (from ``/proc/PID/stat``), then prints medians
and our/ref ratios, and the environment.

Scenarios: back-to-back clients at concurrency 1, 8, 64 and 256, as threads of one process
and as separate processes; and a slowloris run: K idle connections, each re-opened as soon as
the server drops it, beside 8 legitimate client threads (one exchange per millisecond each,
500 ms client deadline), reporting the share of legitimate requests answered.

Targets: at concurrency 64, at least 0.7x the reference's exchanges/s and a p99 no
worse than 2x; with 2000 idle connections, >= 99 % of legitimate requests answered, p99 < 10 ms.

Usage::

    .venv/bin/python bench/broker_load.py --quick      # a few seconds
    .venv/bin/python bench/broker_load.py              # full run (a few minutes)
    .venv/bin/python bench/broker_load.py --json bench/results/run.json

Every run also writes a results directory (bench/_results.py): under
``bench/results/broker_load-<time>-<rev>/`` the load generator's raw JSON of every run, both
servers' stderr, the build and run command lines, the environment, ``summary.md`` and
``SHA256SUMS``.  Figures from a shared or small machine are noisy: compare ratios from the
same run, and rerun on a quiet machine before drawing conclusions.  See bench/README.md and
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._results import Results, loadavg  # noqa: E402  (needs the repository on sys.path)

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """One server under test: its process and socket."""

    name: str
    proc: subprocess.Popen[bytes]
    socket: Path

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Scenario:
    """One load shape: generator mode, concurrency, idle connections, seconds per run."""

    mode: str
    concurrency: int
    seconds: float
    idle: int = 0

    @property
    def label(self) -> str:
        if self.mode == "slowloris":
            return f"slowloris idle={self.idle} legit={self.concurrency}"
        return f"{self.mode:7} c={self.concurrency}"


@dataclass
class Result:
    """Runs of one scenario against one server."""

    runs: list[dict[str, float]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(run[key] for run in self.runs)


def build(work: Path, res: Results) -> tuple[Path, Path]:
    """Compile the load generator and the reference server; return their paths."""
    load = work / "broker_load"
    ref = work / "ref_server"
    for source, binary, extra in (
        (HERE / "broker_load.c", load, ["-pthread"]),
        (HERE / "ref_server.c", ref, []),
    ):
        res.run(
            ["gcc", "-O2", "-Wall", "-o", str(binary), str(source), *extra],
            name=f"build-{binary.name}",
            check=True,
        )
    return load, ref


def wait_listening(path: Path, proc: subprocess.Popen[bytes]) -> None:
    import socket

    for _ in range(500):
        if proc.poll() is not None:
            raise SystemExit(f"server for {path} exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"server for {path} did not start")


def start_servers(
    work: Path, ref_binary: Path, max_exchanges: int, res: Results, logs: list[IO[bytes]]
) -> list[Server]:
    """Start both servers; their stderr goes to ``raw/server-*.err`` of the results."""
    ours_path = work / "ours" / "broker.sock"
    ref_path = work / "ref.sock"
    ours_argv = [
        sys.executable,
        "-m",
        "hami_trio",
        "broker",
        "--socket-path",
        str(ours_path),
        "--max-exchanges",
        str(max_exchanges),
        "--log-level",
        "error",
    ]
    ref_argv = [str(ref_binary), str(ref_path), str(max_exchanges), "500"]
    procs = []
    for name, argv, cwd in (("ours", ours_argv, ROOT), ("ref", ref_argv, None)):
        log_path = res.raw_path(f"server-{name}.err")
        log = log_path.open("wb")
        logs.append(log)
        procs.append(subprocess.Popen(argv, cwd=cwd, stderr=log))
        res.note_command(
            argv,
            name=f"server-{name}",
            returncode=None,
            seconds=None,
            outputs=[log_path],
            note="runs for the whole benchmark, stopped with SIGTERM at the end",
        )
    ours, ref = procs
    servers = [Server("ours", ours, ours_path), Server("ref", ref, ref_path)]
    for server in servers:
        wait_listening(server.socket, server.proc)
    return servers


def run_once(
    load: Path, server: Server, scenario: Scenario, res: Results, rep: int
) -> dict[str, float]:
    argv = [
        str(load),
        str(server.socket),
        scenario.mode,
        str(scenario.concurrency),
        str(scenario.seconds),
    ]
    if scenario.idle:
        argv.append(str(scenario.idle))
    cpu_before = server.cpu_seconds()
    wall_before = time.monotonic()
    name = f"{scenario.mode}-c{scenario.concurrency}-idle{scenario.idle}-{server.name}-run{rep}"
    out = res.run(argv, name=name, check=True).stdout
    wall = time.monotonic() - wall_before
    cpu = server.cpu_seconds() - cpu_before
    result: dict[str, float] = json.loads(out)
    result["server_cpu_s"] = cpu
    result["server_cpu_pct"] = 100 * cpu / wall
    result["cpu_us_per_exchange"] = 1e6 * cpu / result["ok"] if result["ok"] else float("nan")
    if server.proc.poll() is not None:
        raise SystemExit(f"{server.name} server died during {scenario.label}")
    return result


def environment(res: Results) -> dict[str, str]:
    """The lines printed under "environment" (all of it is in environment.json too)."""
    env = res.environment
    versions = {name.lower(): version for name, version in env["packages"].items()}
    return {
        "cpu": env["cpu_model"],
        "cpus": str(env["cpu_count"]),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gcc": env["gcc"],
        "loadavg at start": env["loadavg_start"],
        "git": res.git.label(),
        **{dist: versions.get(dist, "not installed") for dist in ("hami-trio", "trio")},
        "prometheus-client": versions.get("prometheus_client", "not installed"),
        "results": str(res.path),
    }


def scenarios(quick: bool, seconds: float | None, idle: int | None) -> list[Scenario]:
    if quick:
        run = seconds or 0.5
        shapes = [Scenario("threads", c, run) for c in (1, 8, 64, 256)]
        shapes.append(Scenario("procs", 64, run))
        shapes.append(Scenario("slowloris", 8, max(run, 1.0), idle or 500))
        return shapes
    run = seconds or 3.0
    shapes = [Scenario(mode, c, run) for mode in ("threads", "procs") for c in (1, 8, 64, 256)]
    shapes.append(Scenario("slowloris", 8, max(run, 5.0), idle or 2000))
    return shapes


def report(
    shapes: list[Scenario], results: dict[tuple[str, str], Result], env: dict[str, str]
) -> tuple[list[list[object]], dict[str, object]]:
    """Print the tables; return the summary rows and headline figures for the results."""
    rows: list[list[object]] = []
    figures: dict[str, object] = {}
    print("\nenvironment")
    for key, value in env.items():
        print(f"  {key:18} {value}")
    print(
        "\nmedians over the repetitions; ratio = ours / ref "
        "(rate: higher is better, p99: lower is better)"
    )
    header = (
        f"{'scenario':34} {'server':6} {'exch/s':>9} {'p50 us':>8} {'p99 us':>8} "
        f"{'cpu us/ex':>9} {'cpu %':>6} {'fail':>6}"
    )
    print(header)
    print("-" * len(header))
    for shape in shapes:
        for name in ("ours", "ref"):
            res = results[(shape.label, name)]
            extra = ""
            if shape.mode == "slowloris":
                extra = (
                    f"  answered {res.median('answered_pct'):.2f}%"
                    f"  idle re-opened {res.median('idle_reopened') / shape.seconds:.0f}/s"
                )
            print(
                f"{shape.label:34} {name:6} {res.median('rate'):9.0f} {res.median('p50_us'):8.0f} "
                f"{res.median('p99_us'):8.0f} {res.median('cpu_us_per_exchange'):9.1f} "
                f"{res.median('server_cpu_pct'):6.0f} {int(sum(r['fail'] for r in res.runs)):6d}"
                f"{extra}"
            )
        ours, ref = results[(shape.label, "ours")], results[(shape.label, "ref")]
        rate_ratio = ours.median("rate") / ref.median("rate") if ref.median("rate") else 0.0
        p99_ratio = ours.median("p99_us") / ref.median("p99_us") if ref.median("p99_us") else 0.0
        print(f"{'':34} {'ratio':6} {rate_ratio:9.2f} {'':8} {p99_ratio:8.2f}")
        answered = (
            f"{ours.median('answered_pct'):.2f} / {ref.median('answered_pct'):.2f}"
            if shape.mode == "slowloris"
            else ""
        )
        rows.append(
            [
                shape.label.strip(),
                f"{ours.median('rate'):.0f}",
                f"{ref.median('rate'):.0f}",
                f"{rate_ratio:.2f}",
                f"{ours.median('p99_us'):.0f}",
                f"{ref.median('p99_us'):.0f}",
                f"{p99_ratio:.2f}",
                f"{ours.median('cpu_us_per_exchange'):.1f}",
                f"{ref.median('cpu_us_per_exchange'):.1f}",
                int(sum(r["fail"] for r in ours.runs) + sum(r["fail"] for r in ref.runs)),
                answered,
            ]
        )
    print("\ntargets")
    target = next((s for s in shapes if s.mode == "threads" and s.concurrency == 64), None)
    if target is not None:
        ours, ref = results[(target.label, "ours")], results[(target.label, "ref")]
        rate_ratio = ours.median("rate") / ref.median("rate")
        p99_ratio = ours.median("p99_us") / ref.median("p99_us")
        figures["c64_threads_rate_ratio"] = round(rate_ratio, 3)
        figures["c64_threads_p99_ratio"] = round(p99_ratio, 3)
        figures["c64_threads_rate_ours"] = round(ours.median("rate"))
        print(
            f"  c=64 threads: rate {rate_ratio:.2f}x ref (target >= 0.70: "
            f"{'met' if rate_ratio >= 0.7 else 'MISSED'}), p99 {p99_ratio:.2f}x ref "
            f"(target <= 2.0: {'met' if p99_ratio <= 2.0 else 'MISSED'})"
        )
    slow = next((s for s in shapes if s.mode == "slowloris"), None)
    if slow is not None:
        ours = results[(slow.label, "ours")]
        answered, p99 = ours.median("answered_pct"), ours.median("p99_us")
        figures[f"slowloris_idle{slow.idle}_answered_pct"] = round(answered, 3)
        figures[f"slowloris_idle{slow.idle}_p99_ms"] = round(p99 / 1000, 3)
        print(
            f"  slowloris idle={slow.idle}: {answered:.2f}% answered (target >= 99: "
            f"{'met' if answered >= 99 else 'MISSED'}), p99 {p99 / 1000:.2f} ms "
            f"(target < 10: {'met' if p99 < 10_000 else 'MISSED'})"
        )
    return rows, figures


SUMMARY_HEADERS = [
    "scenario",
    "ours exch/s",
    "ref exch/s",
    "ratio",
    "ours p99 us",
    "ref p99 us",
    "p99 ratio",
    "ours cpu us/ex",
    "ref cpu us/ex",
    "fail",
    "answered % ours / ref",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds in all")
    parser.add_argument("--repeat", type=int, help="runs per scenario and server (3; quick: 1)")
    parser.add_argument("--seconds", type=float, help="seconds per run (3; quick: 0.5)")
    parser.add_argument("--idle", type=int, help="idle connections in the slowloris run")
    parser.add_argument(
        "--max-exchanges", type=int, default=4096, help="slots, for both servers (4096)"
    )
    parser.add_argument(
        "--only", help="run only scenarios whose label contains this text (e.g. slowloris)"
    )
    parser.add_argument("--json", type=Path, help="also write every run to this file")
    parser.add_argument(
        "--results-root",
        type=Path,
        help="where the results directory goes (default bench/results)",
    )
    args = parser.parse_args()
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build the load generator")
    repeat = args.repeat or (1 if args.quick else 3)
    shapes = scenarios(args.quick, args.seconds, args.idle)
    if args.only:
        shapes = [shape for shape in shapes if args.only in shape.label]
    with Results("broker_load", root=args.results_root) as res, res.tee():
        env = environment(res)
        work = Path(tempfile.mkdtemp(prefix="hami-trio-bench-", dir="/tmp"))
        servers: list[Server] = []
        logs: list[IO[bytes]] = []
        try:
            load, ref_binary = build(work, res)
            servers = start_servers(work, ref_binary, args.max_exchanges, res, logs)
            results = {(s.label, srv.name): Result() for s in shapes for srv in servers}
            for shape in shapes:
                for rep in range(repeat):
                    # Alternate who goes first, so slow drift on the machine hits both alike.
                    order = servers if rep % 2 == 0 else list(reversed(servers))
                    for server in order:
                        run = run_once(load, server, shape, res, rep)
                        results[(shape.label, server.name)].runs.append(run)
                        print(
                            f"{shape.label:34} {server.name:5} rate={run['rate']:9.0f} "
                            f"p99={run['p99_us']:7.0f}us fail={int(run['fail'])}",
                            flush=True,
                        )
            env["loadavg at end"] = loadavg()
            rows, figures = report(shapes, results, env)
            runs = {f"{label} {name}": res_.runs for (label, name), res_ in results.items()}
            res.raw("runs.json", json.dumps({"environment": env, "runs": runs}, indent=2))
            res.summary(
                "Host PID broker load: hami-trio broker vs C epoll reference, interleaved",
                headers=SUMMARY_HEADERS,
                rows=rows,
                figures=figures,
                notes=[
                    f"Medians over {repeat} run(s) per scenario and server; ratio = ours / "
                    "ref (exchanges/s: higher is better; p99: lower is better).",
                    "Targets: c=64 threads rate >= 0.70x ref and p99 <= 2x ref; "
                    "slowloris 2000 idle: >= 99 % answered, p99 < 10 ms.",
                ],
            )
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({"environment": env, "runs": runs}, indent=2))
            print(f"\nresults: {res.path}")
        finally:
            for server in servers:
                server.proc.send_signal(signal.SIGTERM)
            for server in servers:
                try:
                    server.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.proc.kill()
                    server.proc.wait()
            for log in logs:
                log.close()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
