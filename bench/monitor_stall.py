#!/usr/bin/env python3
"""Broker latency while hostile tenants make the monitor's ticks expensive.

The agent runs the host PID broker and the vGPU monitor in one trio run, so every stretch of
work the tick does without yielding is a stretch during which no broker exchange is
answered.  This benchmark builds what a tenant can build and measures what it costs the
broker:

- ``--hostile`` containers (default 64) whose region is the most expensive one a tenant can
  write: ``proc_num`` 1024, 16 devices, every slot live (~2 MB to read, ~100,000 integers to
  parse per tick); a separate *tenant* process rewrites slot 0 of each one every
  ``--interval / 2`` seconds, so the monitor's read cache never applies;
- one container directory that once held ``--huge-entries`` entries (default 400,000 with
  208-byte names) and is now empty: on ext4 it keeps its size (about 120 MiB), and it has no
  ``.cache`` file, so the monitor lists it again every tick;
- 100 ordinary containers (1 device, 1 slot).

For each scenario a fresh child process runs, in one trio run like ``hami-trio run``, the real
broker (``serve_broker`` on a socket in the work directory) and, except in ``broker alone``,
the real ``Monitor`` (interval ``--interval``, default 1 s).  While it runs, ``broker_load.c``
(the load generator of ``bench/broker_load.py``) runs ``--clients`` client threads (32) in its
``open`` mode for ``--seconds``: each on a fixed schedule of one exchange every
``--period-us`` (8 ms; 4,000 exchanges/s in all, 500 ms deadline), latency counted from the
scheduled time, so a stall is charged to every exchange due during it, as it would be to
independent HAMi-core processes starting at arbitrary times.  It checks
every answer and reports p50/p99.  The child
reports, from a trio instrument, the longest single step of the monitor's task (the longest
time the tick held the event loop) and of every other task, and the tick count.

**Read**: the p99 with hostile ticks against the p99 of the broker alone in the same run; the
monitor's longest step is the stall the broker's clients see at worst.  Figures from a shared
or 2-core machine are noisy: compare within one run.

Usage::

    .venv/bin/python bench/monitor_stall.py --quick         # about 30 s
    .venv/bin/python bench/monitor_stall.py                 # 10 s per scenario
    .venv/bin/python bench/monitor_stall.py --dir /var/tmp  # where the tree goes (ext4 shows
                                                            # the huge directory; tmpfs does not)

Every run writes a results directory (bench/_results.py): the load generator's raw JSON per
scenario, each child's JSON and stderr, the command lines, the environment, ``summary.md``
and ``SHA256SUMS``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._results import Results  # noqa: E402
from hami_trio.monitor.layout import MAX_DEVICES, MAX_SLOTS  # noqa: E402
from hami_trio.testing.regions import (  # noqa: E402
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)

NORMAL = 100
NAME_PAD = "x" * 200


def hostile_slot(seed: int) -> ProcSlot:
    return ProcSlot(
        pid=seed + 1,
        status=1,
        used=[MemoryUse(context_size=seed + d, total=(seed + 1) << 20) for d in range(16)],
        util=[UtilUse(sm_util=(seed + d) % 100) for d in range(16)],
    )


def build_tree(hook: Path, hostile: int, huge_entries: int) -> dict[str, Any]:
    """The containers directory; returns what was built (for the summary)."""
    root = hook / "containers"
    root.mkdir(parents=True)
    spec = RegionSpec(
        num=MAX_DEVICES,
        uuids=[f"GPU-{d:02d}" for d in range(MAX_DEVICES)],
        limits=[1 << 30] * MAX_DEVICES,
        procs=[hostile_slot(s) for s in range(MAX_SLOTS)],
        proc_num=MAX_SLOTS,
        recent_kernel=2,
    )
    for i in range(hostile):
        directory = root / f"hostile{i:04d}_main"
        directory.mkdir()
        write_region(directory / "x.cache", spec)
    for i in range(NORMAL):
        directory = root / f"n{i:04d}_main"
        directory.mkdir()
        write_region(
            directory / "x.cache",
            RegionSpec(uuids=[f"GPU-{i % 8:02d}"], procs=[hostile_slot(i)], recent_kernel=2),
        )
    huge_size = 0
    if huge_entries:
        huge = root / "huge_main"
        huge.mkdir()
        fd = os.open(huge, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(huge_entries):  # hard links: entries without an inode each
                if i % 10_000 == 0:  # ext4 allows 65,000 links per inode
                    seed = f"{i:08d}{NAME_PAD}"
                    os.close(os.open(seed, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
                else:
                    os.link(seed, f"{i:08d}{NAME_PAD}", src_dir_fd=fd, dst_dir_fd=fd)
            for i in range(huge_entries):
                os.unlink(f"{i:08d}{NAME_PAD}", dir_fd=fd)
            huge_size = os.fstat(fd).st_size
        finally:
            os.close(fd)
    fs = subprocess.run(
        ["stat", "-f", "-c", "%T", str(root)], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"hostile": hostile, "normal": NORMAL, "huge_dir_bytes": huge_size, "fs": fs}


# -- tenant: rewrites the hostile regions -------------------------------------------------


def tenant(hook: Path, period: float) -> None:
    root = hook / "containers"
    workloads = [SimulatedWorkload(p / "x.cache") for p in sorted(root.glob("hostile*_main"))]
    seed = 0
    while True:
        seed += 1
        for w in workloads:
            w.set_slot(0, hostile_slot(10_000 + seed))
        time.sleep(period)


# -- child: broker + monitor in one trio run ----------------------------------------------


def child(hook: Path, socket_path: Path, interval: float, monitor_on: bool) -> None:
    import trio

    from hami_trio.broker.server import BrokerConfig, serve_broker
    from hami_trio.monitor.loop import Monitor, MonitorConfig
    from hami_trio.pods.source import StaticPodSource

    class Steps(trio.abc.Instrument):
        """The longest step per kind of task, in wall time and in the thread's CPU time
        (the latter leaves out the time the kernel gave other processes: on a shared
        machine it is the figure that shows how long the task really held the loop)."""

        def __init__(self) -> None:
            self.started = (0.0, 0.0)
            self.longest: dict[str, float] = {}
            self.over_10ms: dict[str, int] = {}
            self.monitor_task: trio.lowlevel.Task | None = None

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.started = (time.perf_counter(), time.thread_time())

        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            wall = time.perf_counter() - self.started[0]
            cpu = time.thread_time() - self.started[1]
            kind = "monitor" if task is self.monitor_task else "other"
            for key, took in ((kind, wall), (kind + "_cpu", cpu)):
                if took > self.longest.get(key, 0.0):
                    self.longest[key] = took
            if cpu > 0.010:
                self.over_10ms[kind] = self.over_10ms.get(kind, 0) + 1

    steps = Steps()
    figures: dict[str, Any] = {}
    gc_pause = {"longest": 0.0, "started": 0.0}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_pause["started"] = time.thread_time()
        else:
            took = time.thread_time() - gc_pause["started"]
            gc_pause["longest"] = max(gc_pause["longest"], took)

    gc.callbacks.append(on_gc)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            broker = await nursery.start(
                serve_broker,
                BrokerConfig(socket_path=socket_path, expected_uid=os.geteuid()),
            )
            monitor: Monitor | None = None
            if monitor_on:
                config = MonitorConfig(
                    hook_path=hook,
                    interval=interval,
                    mig_lock_path=hook / "lock" / "mig.lock",
                    tick_deadline=30.0,
                )
                monitor = Monitor(config, pod_source=StaticPodSource())

                async def serve_monitor(*, task_status: Any) -> None:
                    steps.monitor_task = trio.lowlevel.current_task()
                    await monitor.serve(task_status=task_status)

                await nursery.start(serve_monitor)
            steps.started = (time.perf_counter(), time.thread_time())
            trio.lowlevel.add_instrument(steps)
            ticks_before = monitor.ticks if monitor is not None else 0
            print("ready", flush=True)
            # The parent closes our stdin when the load generator is done.
            await trio.to_thread.run_sync(sys.stdin.read)
            trio.lowlevel.remove_instrument(steps)
            figures["ticks"] = (monitor.ticks - ticks_before) if monitor is not None else 0
            if monitor is not None:
                monitor.request_stop()
            broker.stop()

    trio.run(main)
    figures["longest_step_ms"] = {k: round(v * 1e3, 2) for k, v in steps.longest.items()}
    figures["steps_over_10ms"] = steps.over_10ms
    figures["longest_gc_cpu_ms"] = round(gc_pause["longest"] * 1e3, 2)
    print(json.dumps(figures), flush=True)


# -- parent --------------------------------------------------------------------------------


def environment(res: Results, tree: dict[str, Any]) -> dict[str, str]:
    env = res.environment
    return {
        "python": env["python"].split()[0],
        "kernel": env["kernel"].split()[1],
        "cpu": env["cpu_model"],
        "cpus": str(env["cpu_count"]),
        "loadavg": env["loadavg_start"],
        "git": res.git.label(),
        "filesystem": tree["fs"],
        "huge dir": f"{tree['huge_dir_bytes'] / (1 << 20):.1f} MiB",
        "results": str(res.path),
    }


def run_scenario(
    res: Results,
    load: Path,
    work: Path,
    name: str,
    *,
    monitor_on: bool,
    args: argparse.Namespace,
) -> dict[str, Any]:
    socket_path = work / f"sock-{name}" / "broker.sock"
    socket_path.parent.mkdir(mode=0o755)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--hook",
        str(work),
        "--socket",
        str(socket_path),
        "--interval",
        str(args.interval),
    ]
    if not monitor_on:
        argv.append("--no-monitor")
    err_path = res.raw_path(f"child-{name}.err")
    with err_path.open("wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        assert proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            proc.kill()
            raise SystemExit(f"{name}: child did not start (see {err_path})")
        gen = res.run(
            [
                str(load),
                str(socket_path),
                "open",
                str(args.clients),
                str(args.seconds),
                str(args.period_us),
            ],
            name=f"load-{name}",
            check=True,
        )
        proc.stdin.close()
        out = proc.stdout.read()
        proc.wait(timeout=60)
        res.note_command(
            argv,
            name=f"child-{name}",
            returncode=proc.returncode,
            seconds=time.monotonic() - started,
            outputs=[err_path],
        )
    res.raw_path(f"child-{name}.json").write_bytes(out)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: child exited with {proc.returncode} (see {err_path})")
    result: dict[str, Any] = json.loads(gen.stdout)
    result.update(json.loads(out))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hostile", type=int, default=64, help="hostile regions (default 64)")
    parser.add_argument("--huge-entries", type=int, default=400_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="load per scenario")
    parser.add_argument("--interval", type=float, default=1.0, help="monitor interval (s)")
    parser.add_argument("--clients", type=int, default=32, help="paced client threads")
    parser.add_argument(
        "--period-us", type=int, default=8000, help="each client's period (default 8000 us)"
    )
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where the tree goes")
    parser.add_argument("--quick", action="store_true", help="4 s per scenario, 100k entries")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tenant", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-monitor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hook", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--socket", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.hook, args.socket, args.interval, not args.no_monitor)
        return
    if args.tenant:
        tenant(args.hook, args.interval / 2)
        return
    if args.quick:
        args.seconds = min(args.seconds, 4.0)
        args.huge_entries = min(args.huge_entries, 100_000)

    with Results("monitor_stall", argv=sys.argv) as res, res.tee():
        work = Path(tempfile.mkdtemp(prefix="hami-stall-", dir=args.dir))
        tenant_proc: subprocess.Popen[bytes] | None = None
        try:
            load = work / "broker_load"
            res.run(
                ["gcc", "-O2", "-Wall", "-pthread", "-o", str(load), str(HERE / "broker_load.c")],
                name="build-broker_load",
                check=True,
            )
            print(f"building the tree in {work} ...", flush=True)
            tree = build_tree(work, args.hostile, args.huge_entries)
            tenant_argv = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--tenant",
                "--hook",
                str(work),
                "--interval",
                str(args.interval),
            ]
            tenant_proc = subprocess.Popen(tenant_argv)
            res.note_command(
                tenant_argv,
                name="tenant",
                returncode=None,
                seconds=None,
                outputs=[],
                note="rewrites the hostile regions for the whole benchmark; SIGTERM at the end",
            )
            results = {
                "broker alone": run_scenario(res, load, work, "alone", monitor_on=False, args=args),
                "broker + hostile monitor": run_scenario(
                    res, load, work, "hostile", monitor_on=True, args=args
                ),
            }
        finally:
            if tenant_proc is not None:
                tenant_proc.send_signal(signal.SIGTERM)
                tenant_proc.wait()
            shutil.rmtree(work, ignore_errors=True)

        env = environment(res, tree)
        print("\nenvironment")
        for key, value in env.items():
            print(f"  {key:12} {value}")
        print(
            f"\n{tree['hostile']} hostile regions (proc_num 1024, 16 devices, rewritten every "
            f"{args.interval / 2:g} s), {tree['normal']} ordinary containers, one emptied "
            f"directory of {tree['huge_dir_bytes'] / (1 << 20):.1f} MiB; monitor interval "
            f"{args.interval:g} s; {args.clients} clients, one exchange every {args.period_us} us "
            f"each, for {args.seconds:g} s"
        )
        headers = [
            "scenario",
            "ok",
            "fail",
            "p50 us",
            "p99 us",
            "ticks",
            "monitor step ms (cpu)",
            "other step ms (cpu)",
            "gc cpu ms",
        ]
        rows: list[list[object]] = []
        for label, r in results.items():
            longest = r["longest_step_ms"]

            def step(kind: str, longest: dict[str, float] = longest) -> str:
                if kind not in longest:
                    return "-"
                return f"{longest[kind]:.1f} ({longest[kind + '_cpu']:.1f})"

            rows.append(
                [
                    label,
                    r["ok"],
                    r["fail"],
                    f"{r['p50_us']:.0f}",
                    f"{r['p99_us']:.0f}",
                    r["ticks"],
                    step("monitor"),
                    step("other"),
                    r["longest_gc_cpu_ms"],
                ]
            )
        widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]
        for line in [headers, ["-" * w for w in widths], *rows]:
            print("  ".join(f"{x!s:>{w}}" for x, w in zip(line, widths, strict=True)))
        alone, hostile = results["broker alone"], results["broker + hostile monitor"]
        ratio = hostile["p99_us"] / alone["p99_us"] if alone["p99_us"] else float("nan")
        print(f"\np99 with hostile ticks / p99 of the broker alone: {ratio:.2f}x")
        res.summary(
            "Broker p99 while hostile monitor ticks run",
            headers=headers,
            rows=rows,
            figures={
                "p99_alone_us": alone["p99_us"],
                "p99_hostile_us": hostile["p99_us"],
                "p99_ratio": ratio,
                "monitor_longest_step_ms": hostile["longest_step_ms"].get("monitor"),
                "monitor_longest_step_cpu_ms": hostile["longest_step_ms"].get("monitor_cpu"),
                "huge_dir_bytes": tree["huge_dir_bytes"],
            },
        )


if __name__ == "__main__":
    main()
