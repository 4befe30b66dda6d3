#!/usr/bin/env python3
"""Monitor scale benchmark: tick time, where it goes, and peak RSS for N containers.

Builds ``N`` v1 ``.cache`` files (2 devices, 8 live process slots each, sparse on disk) under
a temporary ``$HOOK_PATH/containers``, then, for each N, starts a *fresh* Python process
that runs the monitor's tick (refresh + Observe + write back) and reports:

- the median / p90 / max wall time of one tick, over ``--ticks`` ticks after warm-up, and
  the CPU time of the child per tick and per container (much less sensitive to other load
  on a shared machine than wall time);
- the longest stretch the tick held the event loop (a trio instrument: the longest step of
  the tick's task, wall and thread CPU time) and the garbage collections during the ticks;
- a breakdown of the tick's CPU time (``--breakdown`` rounds after the ticks): the steps of
  a refresh measured one by one over every container with the calls the lister makes (list the
  containers directory, the two ``pread`` s - the tail one through one byte past the known
  end, the size probe -, decode with the region's :class:`RegionDecoder` = read and decode
  minus the read, change detection = the same for unchanged bytes), then the real
  ``lister.update()``, Observe and ``lister.apply()``; ``lister other`` is what update costs
  beyond the steps measured alone (its own bookkeeping and the inotify drain).  ``lstat`` is
  the identity ``lstat`` alone, which the tick pays only for a container whose directory is
  not watched or saw a name change (the fallback), so it is not part of ``update``;
  ``writes`` is the write-back's system calls alone (size probe and ``pwrite``), and the
  system calls of a busy container (reads and writes) are printed as the floor under any
  Python;
- the child's peak RSS (``ru_maxrss``), so each N is measured without the others' garbage:
  ``peak_rss_mb`` after the ticks and the agent's own renders and HTTP scrapes (before
  prometheus-client's reference ``generate_latest``), ``peak_rss_with_pods_mb`` after the
  pod collector's measurement too.

The child sets the garbage collector as ``hami-trio run`` does before ``trio.run`` (the
start-up objects frozen, the youngest generation's threshold raised), with whichever of those
functions the measured checkout has.

Two workloads: ``static`` (files unchanged between ticks: the monitor's change detection
applies) and ``churn`` (before every tick each container's slot 0 and ``recent_kernel``
change, as they do on a node where every container launches kernels; the change is made
outside the timed section).  Targets: N=1000 churn tick <= 15 ms, static <= 8 ms,
N=2000 / N=1000 <= 2.1x, CPU per busy container per tick <= 15 us, the tick never holding
the loop more than 20 ms at N=2000 churn; no regression of the scrape (<= 45 ms at N=1000)
or of the peak RSS (<= 65 MB at N=1000).

``--code DIR`` runs the same benchmark against the ``hami_trio`` of another checkout (the
base of a change, say), so before and after can be measured interleaved in one sitting with
one benchmark.

The pod measurement (``pod_scrape_cost``) scrapes with Kubernetes' pod matching, every pod
carrying labels, a phase and an allocation annotation, with and without the pod collector.

Extension point: the metrics work adds scrape latency by appending, in this file, an async
callable to :data:`MEASUREMENTS` (the child process re-imports this file); each receives the
warmed-up ``Monitor`` and returns extra figures, printed under the tick figures.

Usage::

    .venv/bin/python bench/monitor_scale.py                 # N = 100, 1000, 2000, both modes
    .venv/bin/python bench/monitor_scale.py --n 1000 --mode static --ticks 30
    .venv/bin/python bench/monitor_scale.py --n 1000 2000 --mode churn --code ../base
    .venv/bin/python bench/monitor_scale.py --json           # one JSON document on stdout

Every run (not the per-N children) writes a results directory (bench/_results.py): each
child's raw JSON and stderr, the exact child command lines, the environment, ``summary.md``
and ``SHA256SUMS``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._results import Results, git_state  # noqa: E402

#: The checkout whose ``hami_trio`` is measured (``--code``; default: this one).
CODE = Path(os.environ.get("HAMI_BENCH_CODE", REPO)).resolve()
if CODE != REPO:
    sys.path.insert(0, str(CODE))

from hami_trio.testing.regions import (  # noqa: E402
    MemoryUse,
    ProcSlot,
    RegionSpec,
    SimulatedWorkload,
    UtilUse,
    write_region,
)

Figures = dict[str, float]
#: Extra measurements run in the child after the tick measurement (``Monitor`` -> figures).
MEASUREMENTS: list[Callable[[object], Awaitable[Figures]]] = []

DEVICES = 2
LIVE_SLOTS = 8
GPUS_PER_NODE = 8
SCRAPES = 101


def _uid(i: int) -> str:
    return f"{i:08d}-0000-4000-8000-000000000000"


def _slots(seed: int) -> list[ProcSlot]:
    return [
        ProcSlot(
            pid=100 + s,
            hostpid=10_000 + seed * 16 + s,
            status=1,
            used=[
                MemoryUse(
                    context_size=300 << 20,
                    module_size=20 << 20,
                    data_size=(s + 1) << 28,
                    offset=0,
                    total=((s + 1) << 28) + (320 << 20),
                )
                for _ in range(DEVICES)
            ],
            util=[UtilUse(sm_util=(seed + s) % 40) for _ in range(DEVICES)],
        )
        for s in range(LIVE_SLOTS)
    ]


def build_tree(hook: Path, n: int) -> None:
    """Create ``hook/containers/{uid}_main/x.cache`` for ``n`` containers."""
    root = hook / "containers"
    root.mkdir(parents=True)
    for i in range(n):
        directory = root / f"{_uid(i)}_main"
        directory.mkdir()
        gpus = [f"GPU-{(i + d) % GPUS_PER_NODE:08d}-bench" for d in range(DEVICES)]
        write_region(
            directory / "x.cache",
            RegionSpec(
                num=DEVICES,
                uuids=gpus,
                limits=[8 << 30] * DEVICES,
                sm_limits=[50] * DEVICES,
                procs=_slots(i),
                priority=i % 3,
                recent_kernel=2,
                last_kernel_time=1_700_000_000,
            ),
        )


def environment(res: Results) -> dict[str, str]:
    """What the figures were measured on (all of it is in the results' environment.json)."""
    env = res.environment
    return {
        "python": env["python"].split()[0],
        "kernel": env["kernel"].split()[1],
        "cpu": env["cpu_model"],
        "cpus": str(env["cpu_count"]),
        "loadavg": env["loadavg_start"],
        "git": res.git.label(),
        "code": str(CODE) if CODE == REPO else f"{CODE} at {git_state(CODE).label()}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# -- child: one N, one process -----------------------------------------------------------


def _insights(monitor: object) -> Any:
    """The collector's ``insights`` argument in the measured checkout's terms: a callable of
    the tick's insights (before the usage read), or True (the usage view's)."""
    return getattr(monitor, "insights", True)


async def scrape_latency(monitor: object) -> Figures:
    """Scrape the warmed-up monitor's metrics over real HTTP ``SCRAPES`` times per variant."""
    import urllib.request

    import trio
    from prometheus_client import CollectorRegistry, generate_latest

    from hami_trio.goparse import BindAddress
    from hami_trio.metrics.collector import BuildInfoCollector, VGpuCollector
    from hami_trio.metrics.endpoint import render_metrics, serve_http
    from hami_trio.monitor.loop import Monitor
    from hami_trio.pods.source import StaticPodSource

    assert isinstance(monitor, Monitor)
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector())
    # Every container under its pod UID (the --no-kubernetes naming): all are exported.
    registry.register(
        VGpuCollector(
            monitor,
            StaticPodSource(),
            node_name="bench",
            kubernetes=False,
            insights=_insights(monitor),  # the process, limit and feedback-state families
        )
    )

    def fetch(url: str, headers: dict[str, str]) -> tuple[float, int]:
        start = time.perf_counter()
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as reply:
            size = _drain(reply)
        return time.perf_counter() - start, size

    def in_process(render: Callable[[], object]) -> float:
        samples = []
        for _ in range(11):
            start = time.perf_counter()
            render()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e3

    def cpu_min(render: Callable[[], object], times: int = 21) -> float:
        """The least CPU time of ``times`` renders (other load on a shared machine only adds)."""
        samples = []
        for _ in range(times):
            start = time.process_time()
            render()
            samples.append(time.process_time() - start)
        return min(samples) * 1e3

    figures: Figures = {
        "render_ms": in_process(lambda: render_metrics(registry, "", [])),
        "render_cpu_min_ms": cpu_min(lambda: render_metrics(registry, "", [])),
    }
    variants = {
        "scrape": {},  # plain Prometheus text, uncompressed
        # What a Prometheus server asks for: OpenMetrics, gzip.
        "prom_scrape": {
            "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.1",
            "Accept-Encoding": "gzip",
        },
    }
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_http, BindAddress("127.0.0.1", 0), registry)
        url = f"http://127.0.0.1:{bound.port}/metrics"
        for prefix, headers in variants.items():
            await trio.to_thread.run_sync(fetch, url, headers)  # warm-up
            latencies = []
            size = 0
            for _ in range(SCRAPES):
                seconds, size = await trio.to_thread.run_sync(fetch, url, headers)
                latencies.append(seconds)
            latencies.sort()
            figures[f"{prefix}_median_ms"] = statistics.median(latencies) * 1e3
            figures[f"{prefix}_p99_ms"] = latencies[round(0.99 * (len(latencies) - 1))] * 1e3
            figures[f"{prefix}_bytes"] = float(size)
        nursery.cancel_scope.cancel()
    # The agent's own peak: the monitor, its renders and HTTP scrapes. prometheus_client's
    # reference renderer below (not what the agent serves) builds every sample as an object
    # and would set the high-water mark by itself.
    figures["peak_rss_mb"] = _peak_rss_mb()
    figures["generate_latest_ms"] = in_process(lambda: generate_latest(registry))
    return figures


MEASUREMENTS.append(scrape_latency)


async def usage_read(monitor: object, change: Callable[[int], None], n: int) -> Figures:
    """The usage read alone, right after a tick (CPU and wall, medians of 7), and the longest
    the event loop waited while one ran in a worker thread (a task that only checkpoints
    measures its own gaps).  None of it where the checkout has no usage read."""
    import trio

    usage = getattr(monitor, "usage", None)
    if usage is None:
        return {}
    cpu, wall = [], []
    for r in range(7):
        change(300 + r)
        await monitor.tick()  # type: ignore[attr-defined]
        start, start_cpu = time.perf_counter(), time.process_time()
        view = usage(0.0)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        loaded = sum(1 for s in view.containers.values() if s.snapshot is not None)
        if loaded != n:
            raise SystemExit(f"usage read loaded {loaded} of {n}")
    change(400)
    await monitor.tick()  # type: ignore[attr-defined]
    gaps: list[float] = []
    done = trio.Event()

    async def reader() -> None:
        await trio.to_thread.run_sync(usage, 0.0)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        last = time.perf_counter()
        while not done.is_set():
            await trio.lowlevel.checkpoint()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    return {
        "usage_read_cpu_median_ms": statistics.median(cpu) * 1e3,
        "usage_read_median_ms": statistics.median(wall) * 1e3,
        "usage_read_loop_held_max_ms": max(gaps) * 1e3,
    }


async def render_after_ticks(monitor: object, change: Callable[[int], None]) -> Figures:
    """The render right after a tick, as when Prometheus scrapes less often than the monitor
    ticks: in ``churn`` every container has a new snapshot (nothing rendered before is
    reusable), in ``static`` the same objects (everything is).  The scrape figures above
    render the same tick 101 times over; this is the other end.  CPU time of the render
    alone (the tick is not timed), least and median of 7 rounds."""
    from prometheus_client import CollectorRegistry

    from hami_trio.metrics.collector import BuildInfoCollector, VGpuCollector
    from hami_trio.metrics.endpoint import render_metrics
    from hami_trio.monitor.loop import Monitor
    from hami_trio.pods.source import StaticPodSource

    assert isinstance(monitor, Monitor)
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector())
    registry.register(
        VGpuCollector(
            monitor,
            StaticPodSource(),
            node_name="bench",
            kubernetes=False,
            insights=_insights(monitor),
        )
    )
    render_metrics(registry, "", [])  # label strings rendered, as after the first scrape
    cpu = []
    for r in range(7):
        change(500 + r)
        await monitor.tick()
        start = time.process_time()
        render_metrics(registry, "", [])
        cpu.append(time.process_time() - start)
    return {
        "render_after_tick_cpu_min_ms": min(cpu) * 1e3,
        "render_after_tick_cpu_median_ms": statistics.median(cpu) * 1e3,
    }


async def pod_scrape_cost(monitor: object) -> Figures:
    """The scrape with Kubernetes' pod matching, and what the pod collector adds to it.

    Every container's pod carries the node label, two team/app labels, phase Running and a
    two-device ``hami.io/vgpu-devices-allocated`` annotation (the pod collector's work per
    pod); the vGPU collector matches pods as with Kubernetes.  ``k8s_render_ms`` is the
    vGPU collector alone, ``k8s_pods_render_ms`` the same registry plus the pod collector
    (absent where the tree has none, e.g. before it existed).
    """
    import urllib.request

    import trio
    from prometheus_client import CollectorRegistry

    from hami_trio.goparse import BindAddress
    from hami_trio.metrics.collector import VGpuCollector
    from hami_trio.metrics.endpoint import render_metrics, serve_http
    from hami_trio.monitor.loop import Monitor
    from hami_trio.pods.source import PodInfo, StaticPodSource

    assert isinstance(monitor, Monitor)
    pods: dict[str, PodInfo] = {}
    # A tree from before PodInfo had a phase: the same pods without it.
    phase = {"phase": "Running"} if "phase" in PodInfo.__dataclass_fields__ else {}
    for i, state in enumerate(monitor.containers().values()):
        gpus = [f"GPU-{(i + d) % GPUS_PER_NODE:08d}-bench" for d in range(DEVICES)]
        pods[state.pod_uid] = PodInfo(
            uid=state.pod_uid,
            namespace="bench",
            name=f"pod-{i}",
            containers=("main",),
            labels={"hami.io/vgpu-node": "bench", "team": f"t{i % 7}", "app": "train"},
            annotations={
                "hami.io/vgpu-devices-allocated": "".join(f"{g},NVIDIA,8192,50:" for g in gpus)
                + ";"
            },
            **phase,  # type: ignore[arg-type]
        )
    source = StaticPodSource(pods.values())

    def median_ms(render: Callable[[], object], times: int = 11) -> float:
        samples = []
        for _ in range(times):
            start = time.perf_counter()
            render()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e3

    def cpu_ms(render: Callable[[], object], times: int = 21) -> float:
        """The least CPU time of ``times`` renders: what the work costs, without the other
        load of a shared machine (which only ever adds)."""
        samples = []
        for _ in range(times):
            start = time.process_time()
            render()
            samples.append(time.process_time() - start)
        return min(samples) * 1e3

    registry = CollectorRegistry()
    vgpu = VGpuCollector(monitor, source, node_name="bench", kubernetes=True, all_pods=lambda: pods)
    figures: Figures = {}
    try:
        from hami_trio.metrics.pods import PodCollector
    except ImportError:  # a tree without the pod collector: the baseline
        registry.register(vgpu)
        figures["k8s_render_ms"] = median_ms(lambda: render_metrics(registry, "", []))
        figures["k8s_render_cpu_min_ms"] = cpu_ms(lambda: render_metrics(registry, "", []))
        return figures
    collector = PodCollector(lambda: pods, node_name="bench", label_allowlist=("team", "app"))
    start = time.perf_counter()
    collector.collect()  # decodes every annotation, renders every pod's rows
    figures["pod_collector_cold_ms"] = (time.perf_counter() - start) * 1e3
    figures["pod_collector_ms"] = median_ms(collector.collect)
    figures["pod_collector_cpu_min_ms"] = cpu_ms(collector.collect)
    registry.register(vgpu)
    figures["k8s_render_ms"] = median_ms(lambda: render_metrics(registry, "", []))
    figures["k8s_render_cpu_min_ms"] = cpu_ms(lambda: render_metrics(registry, "", []))
    registry.register(collector)
    figures["k8s_pods_render_ms"] = median_ms(lambda: render_metrics(registry, "", []))
    figures["k8s_pods_render_cpu_min_ms"] = cpu_ms(lambda: render_metrics(registry, "", []))

    def fetch(url: str) -> float:
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as reply:
            _drain(reply)
        return time.perf_counter() - start

    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_http, BindAddress("127.0.0.1", 0), registry)
        url = f"http://127.0.0.1:{bound.port}/metrics"
        await trio.to_thread.run_sync(fetch, url)
        latencies = [await trio.to_thread.run_sync(fetch, url) for _ in range(SCRAPES)]
        figures["k8s_pods_scrape_median_ms"] = statistics.median(latencies) * 1e3
        nursery.cancel_scope.cancel()
    return figures


MEASUREMENTS.append(pod_scrape_cost)


class _Stretches:
    """A trio instrument: the longest step of one task (the time it held the event loop
    without a checkpoint) while armed, in wall time and in the thread's CPU time."""

    def __init__(self, task: object) -> None:
        self.task = task
        self.armed = False
        self.started = (0.0, 0.0)
        self.longest_wall = 0.0
        self.longest_cpu = 0.0

    def arm(self) -> None:
        """From now on (the step in progress counts from here)."""
        self.armed = True
        self.started = (time.perf_counter(), time.thread_time())

    def disarm(self) -> None:
        """Until :meth:`arm` (the step in progress counts up to here)."""
        self.after_task_step(self.task)
        self.armed = False

    def before_task_step(self, task: object) -> None:
        if task is self.task:
            self.started = (time.perf_counter(), time.thread_time())

    def after_task_step(self, task: object) -> None:
        if task is self.task and self.armed:
            self.longest_wall = max(self.longest_wall, time.perf_counter() - self.started[0])
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - self.started[1])


class _GcTime:
    """Time spent in garbage collections (and full ones counted) while enabled."""

    def __init__(self) -> None:
        self.on = False
        self.started = 0.0
        self.total = 0.0
        self.longest = 0.0
        self.full = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        self.total += took
        self.longest = max(self.longest, took)
        self.full += info.get("generation") == 2


def _drain(reply: Any) -> int:
    """Read an HTTP answer to its end in pieces and count its bytes: the client shares the
    agent's process here, and holding each 4.5 MB answer whole (``read()``) would add the
    client's copies to the peak RSS the bench reports as the agent's."""
    size = 0
    while chunk := reply.read(1 << 16):
        size += len(chunk)
    return size


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


async def breakdown(  # noqa: C901 - one measurement, step after step
    monitor: object, change: Callable[[int], None], rounds: int
) -> Figures:
    """Where a tick's time goes (see the module docstring): each step alone, over every
    container, with the same calls the lister makes; then the real update, Observe, apply."""
    import trio

    from hami_trio.monitor import snapshot as snapshots
    from hami_trio.monitor.feedback import observe
    from hami_trio.monitor.layout import LAYOUTS, Format, clamp_proc_num, layout_for_size
    from hami_trio.monitor.loop import Monitor
    from hami_trio.monitor.state import parse_container_dirname

    # The checkout's tick decoder: the tail alone (TickDecoder), or tail and live slots.
    tick_decoder = getattr(snapshots, "TickDecoder", None)
    tail_only = tick_decoder is not None
    RegionDecoder = tick_decoder or snapshots.RegionDecoder

    assert isinstance(monitor, Monitor)
    lister = monitor.lister
    pods = lister._pods  # the bench repeats the lister's own lookups
    root = lister.containers_dir
    names = sorted(lister.tracked_names())
    handles = [lister.handle_of(name) for name in names]
    paths = [lister._tracked[name].cache_path for name, h in zip(names, handles, strict=True) if h]
    if len(paths) != len(names):
        raise SystemExit("breakdown: a container without an open handle")
    fds = [os.open(os.path.join(root, path), os.O_RDWR | os.O_CLOEXEC) for path in paths]
    decoders = [RegionDecoder() for _ in paths]
    steps = ("list", "lstat", "read", "decode", "detect", "update", "observe", "apply", "writes")
    took: dict[str, list[float]] = {step: [] for step in (*steps, "tail_floor")}
    try:
        for r in range(rounds + 1):  # round 0 primes the decoders
            change(1000 + r)
            clock = time.thread_time  # CPU time: on a loaded machine wall time is mostly noise
            t0 = clock()
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            with os.scandir(root_fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    key = parse_container_dirname(entry.name)
                    if key is not None:
                        pods.lookup(key.pod_uid)
            t1 = clock()
            sizes = []
            for path, handle in zip(paths, handles, strict=True):
                assert handle is not None
                st = os.stat(path, dir_fd=root_fd, follow_symlinks=False)
                handle.matches(st)
                sizes.append(st.st_size)
            t2 = clock()
            os.close(root_fd)

            # Each region is read as the tick reads it (tail, then the head up to the live
            # slots) and its bytes dropped at once; holding every container's head (17 MB at
            # N=1000) would charge page faults to the reads and cache misses to the decode.
            def read(fd: int, size: int) -> tuple[bytes, bytes]:
                layout = layout_for_size(size)
                assert layout is not None
                # through one byte past the known end: the size probe of a watched container
                tail = os.pread(fd, size - layout.tail_offset + 1, layout.tail_offset)
                if tail_only:
                    return tail[: layout.tail_size], b""
                slots = clamp_proc_num(int.from_bytes(tail[:4], "little", signed=True))
                return tail[: layout.tail_size], os.pread(fd, layout.body_size(slots), 0)

            def decode(decoder: Any, fd: int, size: int) -> None:
                tail, head = read(fd, size)
                decoder.start(size)
                step = decoder.feed(tail)
                if isinstance(step, tuple):
                    offset, length = step
                    decoder.feed(head if head else os.pread(fd, length, offset))

            for fd, size in zip(fds, sizes, strict=True):
                read(fd, size)
            t3 = clock()
            for decoder, fd, size in zip(decoders, fds, sizes, strict=True):
                decode(decoder, fd, size)
            t4 = clock()
            for decoder, fd, size in zip(decoders, fds, sizes, strict=True):
                decode(decoder, fd, size)
            t5 = clock()
            view = await lister.update()
            t6 = clock()
            snapshots = {k: s.snapshot for k, s in view.items() if s.snapshot is not None}
            writes = observe(snapshots)
            t7 = clock()
            lister.apply(writes)
            t8 = clock()
            if r == 0:
                continue
            read_alone = t3 - t2  # decode and detect are what reading and decoding add
            for step, seconds in zip(
                steps,
                (
                    t1 - t0,
                    t2 - t1,
                    read_alone,
                    t4 - t3 - read_alone,
                    t5 - t4 - read_alone,
                    t6 - t5,
                    t7 - t6,
                ),
                strict=False,
            ):
                took[step].append(seconds)
            took["apply"].append(t8 - t7)
            # The system calls of a write-back alone, as apply makes them for a busy
            # container: the two-byte size probe and one 4-byte pwrite (of the word the file
            # holds already, so nothing changes).
            words = [os.pread(fd, 4, LAYOUTS[Format.V1].recent_kernel) for fd in fds]
            t9 = clock()
            for fd, size, word in zip(fds, sizes, words, strict=True):
                os.pread(fd, 2, size - 1)
                os.pwrite(fd, word, LAYOUTS[Format.V1].recent_kernel)
            took["writes"].append(clock() - t9)
            # The new tick's floor: one tail pread (through one byte past the end) per
            # container, with the least Python around it.
            layout = LAYOUTS[Format.V1]
            want = sizes[0] - layout.tail_offset + 1
            offset = layout.tail_offset
            pread = os.pread
            t10 = clock()
            for fd in fds:
                pread(fd, want, offset)
            took["tail_floor"].append(clock() - t10)
            await trio.lowlevel.checkpoint()
    finally:
        for fd in fds:
            os.close(fd)
    figures = {f"breakdown_{step}_ms": _median_ms(took[step]) for step in steps}
    figures["tail_pread_floor_us"] = _median_ms(took["tail_floor"]) * 1e3 / len(fds)
    # A watched, quiet container pays no lstat: update is list + read + decode + the rest.
    measured = sum(figures[f"breakdown_{s}_ms"] for s in ("list", "read", "decode"))
    figures["breakdown_lister_other_ms"] = figures["breakdown_update_ms"] - measured
    # What the system calls alone cost per busy container (two preads, size probe and
    # pwrite): the floor under any Python of a churning tick on this machine.
    syscalls = sum(figures[f"breakdown_{s}_ms"] for s in ("read", "writes"))
    figures["syscalls_per_container_us"] = syscalls * 1e3 / len(fds)
    return figures


def child(hook: Path, n: int, ticks: int, mode: str, rounds: int) -> Figures:
    import trio

    from hami_trio.monitor.loop import Monitor, MonitorConfig
    from hami_trio.pods.source import PodInfo, StaticPodSource

    pods = StaticPodSource(
        [
            PodInfo(uid=_uid(i), namespace="bench", name=f"pod-{i}", containers=("main",))
            for i in range(n)
        ]
    )
    config = MonitorConfig(hook_path=hook, mig_lock_path=hook / "mig" / "lock")
    workloads = [
        SimulatedWorkload(hook / "containers" / f"{_uid(i)}_main" / "x.cache") for i in range(n)
    ]

    def change(t: int) -> None:
        if mode == "churn":
            for i, work in enumerate(workloads):
                work.set_slot(0, _slots(i + t + 1)[0])
                work.launch_kernel(now=1_700_000_000 + t)

    # The process's garbage-collector policy as `hami-trio run` sets it before trio.run, in
    # whatever form the measured checkout has it.
    from hami_trio import _trio as trio_helpers

    for policy in ("freeze_startup_objects", "raise_young_gc_threshold"):
        getattr(trio_helpers, policy, lambda: None)()

    async def run() -> Figures:
        monitor = Monitor(config, pod_source=pods)
        for _ in range(3):  # open every handle, settle the feedback
            await monitor.tick()
        loaded = sum(1 for s in monitor.containers().values() if s.snapshot is not None)
        if loaded != n:
            raise SystemExit(f"only {loaded} of {n} containers loaded")
        stretches = _Stretches(trio.lowlevel.current_task())
        collections = _GcTime()
        gc.callbacks.append(collections)
        trio.lowlevel.add_instrument(stretches)  # type: ignore[arg-type]
        samples = []
        cpu = []
        for t in range(ticks):
            change(t)
            collections.on = True
            stretches.arm()
            start, start_cpu = time.perf_counter(), time.process_time()
            await monitor.tick()
            samples.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            stretches.disarm()
            collections.on = False
        trio.lowlevel.remove_instrument(stretches)  # type: ignore[arg-type]
        gc.callbacks.remove(collections)
        samples.sort()
        figures: Figures = {
            "tick_median_ms": statistics.median(samples) * 1e3,
            "tick_p90_ms": samples[int(0.9 * (len(samples) - 1))] * 1e3,
            "tick_max_ms": samples[-1] * 1e3,
            # CPU time of this process only: less sensitive to other load on a shared host
            "tick_cpu_median_ms": statistics.median(cpu) * 1e3,
            "tick_cpu_per_container_us": statistics.median(cpu) * 1e6 / n,
            "longest_stretch_ms": stretches.longest_wall * 1e3,
            "longest_stretch_cpu_ms": stretches.longest_cpu * 1e3,
            "gc_ms_per_tick": collections.total * 1e3 / ticks,
            "gc_longest_ms": collections.longest * 1e3,
            "gc_full_collections": float(collections.full),
        }
        figures.update(await usage_read(monitor, change, n))
        for measure in MEASUREMENTS:
            figures.update(await measure(monitor))  # scrape_latency: peak_rss_mb
        # before the breakdown, which holds every container's bytes at once
        figures["peak_rss_with_pods_mb"] = _peak_rss_mb()
        figures.update(await render_after_ticks(monitor, change))
        if rounds:
            figures.update(await breakdown(monitor, change, rounds))
        # What the node costs every 15 s (Prometheus' usual interval) at the 5 s tick: three
        # ticks and one scrape right after a tick (with its usage read, where there is one).
        figures["work_per_15s_cpu_ms"] = (
            3 * figures["tick_cpu_median_ms"] + figures["render_after_tick_cpu_median_ms"]
        )
        monitor.close()
        return figures

    return trio.run(run)


# -- parent ---------------------------------------------------------------------------------


def measure(res: Results, hook: Path, n: int, ticks: int, mode: str, rounds: int) -> Figures:
    proc = res.run(
        [sys.executable, __file__, "--child", str(hook), str(n), str(ticks), mode, str(rounds)],
        name=f"{mode}-n{n}",
        env={**os.environ, "HAMI_BENCH_CODE": str(CODE)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"child for N={n} failed:\n{proc.stderr}")
    figures: Figures = json.loads(proc.stdout)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 2000])
    parser.add_argument("--ticks", type=int, default=21)
    parser.add_argument("--mode", choices=["static", "churn", "both"], default="both")
    parser.add_argument(
        "--breakdown", type=int, default=5, metavar="ROUNDS", help="breakdown rounds (0: none)"
    )
    parser.add_argument(
        "--code", type=Path, help="measure the hami_trio of this checkout (default: this one)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--results-root", type=Path, help="where the results directory goes (bench/results)"
    )
    parser.add_argument(
        "--child", nargs=5, metavar=("HOOK", "N", "TICKS", "MODE", "ROUNDS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        hook, n, ticks, mode, rounds = args.child
        print(json.dumps(child(Path(hook), int(n), int(ticks), mode, int(rounds))))
        return 0
    if args.code is not None:
        global CODE  # the children get it through the environment
        CODE = args.code.resolve()

    modes = ["static", "churn"] if args.mode == "both" else [args.mode]
    with Results("monitor_scale", root=args.results_root) as res, res.tee():
        env = environment(res)
        results: dict[str, dict[str, Figures]] = {mode: {} for mode in modes}
        with tempfile.TemporaryDirectory(prefix="hami-bench-") as tmp:
            for n in args.n:
                hook = Path(tmp) / f"n{n}"
                build_tree(hook, n)
                for mode in modes:
                    results[mode][str(n)] = measure(res, hook, n, args.ticks, mode, args.breakdown)
        res.raw("results.json", json.dumps({"environment": env, "results": results}, indent=2))
        summarise(res, results, args.ticks)
        if args.json:
            print(json.dumps({"environment": env, "results": results}, indent=2))
            return 0
        print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
        print(f"results: {res.path}")
        report(results, args.ticks)
    return 0


_BREAKDOWN = ("list", "read", "decode", "lister_other", "observe", "apply", "writes", "lstat")


def report(results: dict[str, dict[str, Figures]], ticks: int) -> None:
    """Print the tables, the breakdown and the target lines."""
    print(f"workload: v1 files, {DEVICES} devices, {LIVE_SLOTS} live slots, {ticks} ticks")
    for mode, by_n in results.items():
        print(f"\n[{mode}]")
        print(
            f"{'N':>6} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'cpu med ms':>11} "
            f"{'cpu/ctr us':>11} {'stretch ms':>11} {'gc ms/tick':>11} {'peak RSS MB':>12}"
        )
        for n, fig in by_n.items():
            print(
                f"{n:>6} {fig['tick_median_ms']:>10.2f} {fig['tick_p90_ms']:>8.2f} "
                f"{fig['tick_max_ms']:>8.2f} {fig['tick_cpu_median_ms']:>11.2f} "
                f"{fig['tick_cpu_per_container_us']:>11.2f} {fig['longest_stretch_ms']:>11.2f} "
                f"{fig['gc_ms_per_tick']:>11.2f} {fig['peak_rss_mb']:>12.1f}"
            )
        if any("breakdown_update_ms" in fig for fig in by_n.values()):
            print("breakdown, CPU ms per tick (medians; update = list + read + decode +")
            print("lister_other; writes = the system calls of apply alone; lstat = the identity")
            print("lstat of the containers inotify cannot vouch for, alone; detect = decoding")
            print("unchanged bytes, for comparison):")
            print(f"{'N':>6} " + " ".join(f"{step:>12}" for step in (*_BREAKDOWN, "detect")))
            for n, fig in by_n.items():
                if "breakdown_update_ms" in fig:
                    cells = [fig[f"breakdown_{step}_ms"] for step in (*_BREAKDOWN, "detect")]
                    print(f"{n:>6} " + " ".join(f"{cell:>12.2f}" for cell in cells))
        for n, fig in by_n.items():
            extra = {
                k: v
                for k, v in fig.items()
                if not k.startswith(
                    ("tick_", "peak_rss", "breakdown_", "longest_", "gc_", "syscalls_")
                )
            }
            if extra:
                print(f"N={n}: " + ", ".join(f"{k} = {v:.3f}" for k, v in extra.items()))
        targets(mode, by_n)


def targets(mode: str, by_n: dict[str, Figures]) -> None:
    """The target lines for one workload."""
    if "100" in by_n:
        # The monitor's memory floor: this process holds the monitor, the scrape and no more.
        rss = by_n["100"]["peak_rss_mb"]
        print(f"target N=100 {mode}: peak RSS {rss:.1f} MB (<= 40, the monitor alone)")
    if "1000" not in by_n:
        return
    k = by_n["1000"]
    goal = 15 if mode == "churn" else 8
    print(
        f"targets N=1000 {mode}: tick {k['tick_median_ms']:.1f} ms (<= {goal}), CPU per "
        f"container {k['tick_cpu_per_container_us']:.1f} us (<= 15), "
        f"RSS {k['peak_rss_mb']:.0f} MB (<= 65)"
    )
    if "tail_pread_floor_us" in k:
        floor = k["tail_pread_floor_us"]
        print(
            f"         new tick floor, one tail pread per container with the least Python "
            f"around it: {floor:.2f} us; tick CPU per container / floor "
            f"{k['tick_cpu_per_container_us'] / floor:.2f} (<= 2)"
        )
    if "work_per_15s_cpu_ms" in k:
        print(
            f"         per 15 s (3 ticks + 1 scrape after a tick): "
            f"{k['work_per_15s_cpu_ms']:.1f} ms CPU"
        )
    if "syscalls_per_container_us" in k:
        # The floor under any Python: what the kernel alone takes for one busy container.
        print(
            f"         system calls per busy container, with the least Python around them (two "
            f"preads, size probe, pwrite): {k['syscalls_per_container_us']:.1f} us"
        )
    if "2000" in by_n:
        two = by_n["2000"]
        ratio = two["tick_median_ms"] / k["tick_median_ms"]
        print(f"         N=2000 / N=1000 tick ratio {ratio:.2f} (<= 2.1)")
        print(
            f"         N=2000 longest stretch without a checkpoint "
            f"{two['longest_stretch_ms']:.1f} ms, CPU {two['longest_stretch_cpu_ms']:.1f} ms"
            + (" (<= 20)" if mode == "churn" else "")
        )
    if "scrape_median_ms" in k:
        print(
            f"         scrape median {k['scrape_median_ms']:.1f} ms (<= 45), "
            f"p99 {k['scrape_p99_ms']:.1f} ms"
        )


def summarise(res: Results, results: dict[str, dict[str, Figures]], ticks: int) -> None:
    """Write summary.md / summary.json of the results directory."""
    rows: list[list[object]] = []
    figures: dict[str, object] = {}
    for mode, by_n in results.items():
        for n, fig in by_n.items():
            rows.append(
                [
                    mode,
                    n,
                    f"{fig['tick_median_ms']:.2f}",
                    f"{fig['tick_p90_ms']:.2f}",
                    f"{fig['tick_cpu_median_ms']:.2f}",
                    f"{fig['tick_cpu_per_container_us']:.2f}",
                    f"{fig['longest_stretch_ms']:.2f}",
                    f"{fig['peak_rss_mb']:.1f}",
                    f"{fig.get('scrape_median_ms', float('nan')):.1f}",
                    f"{fig.get('scrape_p99_ms', float('nan')):.1f}",
                ]
            )
            for name in (
                "tick_median_ms",
                "tick_cpu_per_container_us",
                "longest_stretch_ms",
                "peak_rss_mb",
                "scrape_median_ms",
                "scrape_p99_ms",
                *(f"breakdown_{step}_ms" for step in _BREAKDOWN),
            ):
                if name in fig:
                    figures[f"{mode}_n{n}_{name}"] = round(fig[name], 2)
        if "1000" in by_n and "2000" in by_n:
            ratio = by_n["2000"]["tick_median_ms"] / by_n["1000"]["tick_median_ms"]
            figures[f"{mode}_tick_ratio_n2000_n1000"] = round(ratio, 2)
    res.summary(
        "Monitor scale: tick time, peak RSS and /metrics scrape for N containers",
        headers=[
            "mode",
            "N",
            "tick median ms",
            "tick p90 ms",
            "tick CPU median ms",
            "CPU per container us",
            "longest stretch ms",
            "peak RSS MB",
            "scrape median ms",
            "scrape p99 ms",
        ],
        rows=rows,
        figures=figures,
        notes=[
            f"v1 files, {DEVICES} devices, {LIVE_SLOTS} live slots; {ticks} ticks after warm-up, "
            "each N in a fresh process. static: files unchanged between ticks; churn: every "
            "container's slot 0 and recent_kernel change before each tick.",
            "Targets: N=1000 churn tick <= 15 ms, static <= 8 ms; N=2000 <= 2.1x "
            "N=1000; CPU per container <= 15 us; longest stretch <= 20 ms at N=2000 churn; "
            "scrape (plain text over real HTTP, 101 scrapes) <= 45 ms and peak RSS <= 65 MB "
            "at N=1000.",
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
