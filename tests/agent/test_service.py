"""serve_agent and run_agent in this process: start order, readiness, drain, failures.

The agent runs with its real tasks (broker, monitor, metrics endpoint, NVML follower) on
temporary paths; only NVML is a fake.  The failure after start is a real one: the broker's
listening socket is shut down underneath it (tests/agent/agent.py explains how), so its next
``accept`` fails with EINVAL.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from hami_trio.agent.config import AgentConfig, resolve_config
from hami_trio.agent.service import (
    AgentHandle,
    _Agent,
    _public_error,
    _TaskFailure,
    run_agent,
    serve_agent,
)
from hami_trio.broker.boundary import default_lock_path
from hami_trio.broker.protocol import VALID_REQUEST, encode_response
from hami_trio.cli.main import build_parser
from hami_trio.errors import (
    AgentError,
    BrokerError,
    BrokerStartupError,
    HttpServerError,
    PodSourceError,
)
from hami_trio.metrics.exportstate import NODE_LABEL
from hami_trio.pods.allocated import ALLOCATED_ANNOTATION
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, write_region
from tests.agent.agent import break_listener, http_get
from tests.broker.wire import exchange, present, read_to_eof, send_now
from tests.metrics.fake_nvml import FakeGpu, FakeNvml
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import wait_until, write_kubeconfig

GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def config_for(
    hook: Path,
    mig_lock: Path,
    *flags: str,
    socket_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> AgentConfig:
    """What ``hami-trio run <flags>`` would run with (broker on when ``socket_path``)."""
    argv = [
        "run",
        f"--hook-path={hook}",
        f"--mig-lock-path={mig_lock}",
        "--metrics-bind-address=127.0.0.1:0",
        "--debug-bind-address=127.0.0.1:0",
        "--interval=0.05",
        *flags,
    ]
    environment = dict(env or {})
    if socket_path is not None:
        argv.append(f"--broker-socket-path={socket_path}")
        environment["LIBVGPU_HOSTPID_BROKER"] = "1"
    if "NODE_NAME" not in environment:
        argv.append("--no-kubernetes")
    return resolve_config(build_parser().parse_args(argv), environment)


def add_container(hook: Path, uid: str = "pod-uid-1", name: str = "main", **spec: Any) -> Path:
    directory = hook / "containers" / f"{uid}_{name}"
    directory.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {"uuids": [GPU], "limits": [8 << 30]} | spec
    write_region(directory / "abc.cache", RegionSpec(**fields))
    return directory


async def scrape(handle: AgentHandle, path: str = "/metrics") -> tuple[int, str]:
    return await trio.to_thread.run_sync(http_get, handle.metrics_address.port, path)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def flock_free(path: Path) -> bool:
    with open(path, "rb") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(gpus=[FakeGpu(uuid=GPU)])


# -- start, serve, drain ----------------------------------------------------------------------


async def test_everything_starts_serves_and_drains(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    add_container(hook)
    config = config_for(hook, mig_lock, socket_path=socket_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
            assert handle.readiness() == {"broker": True, "monitor": True, "mig-lock-dir": True}
            assert handle.broker is not None
            assert handle.broker.socket_path == socket_path
            assert handle.monitor.ticks >= 1  # ready only after the first tick
            assert mig_lock.parent.is_dir()
            assert await exchange(socket_path) == encode_response(os.getpid())

            status, text = await scrape(handle)
            assert status == 200
            found = samples(text)
            assert found[("hami_trio_broker_exchanges_total", frozenset({("outcome", "ok")}))] == 1
            assert ("hami_vgpu_memory_limit_bytes", frozenset({
                ("namespace", ""), ("pod", "pod-uid-1"), ("container", "main"),
                ("vdevice_index", "0"), ("device_uuid", GPU), ("zone", "vGPU"),
            })) in found  # fmt: skip
            host = [name for name, _ in found if name == "hami_host_gpu_utilization_ratio"]
            assert host == ["hami_host_gpu_utilization_ratio"]
            assert await scrape(handle, "/readyz") == (
                200,
                "[+]broker ok\n[+]monitor ok\n[+]mig-lock-dir ok\nreadyz check passed\n",
            )

            # Somebody removes the socket file: clients would find nothing, so not ready.
            os.rename(socket_path, socket_path.with_name("moved.sock"))
            assert handle.readiness()["broker"] is False
            assert (await scrape(handle, "/readyz"))[0] == 503
            os.rename(socket_path.with_name("moved.sock"), socket_path)
            assert handle.readiness()["broker"] is True

            port = handle.metrics_address.port
            handle.request_stop()
            assert handle.stopping
    assert not present(socket_path)
    assert flock_free(default_lock_path(socket_path))
    assert refused(port)
    assert not nvml.initialized  # NVML was closed on the way out


async def test_drain_lets_an_in_flight_exchange_finish(
    hook: Path,
    mig_lock: Path,
    socket_path: Path,
    nvml: FakeNvml,
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = config_for(
        hook, mig_lock, "--broker-exchange-deadline=4", "--interval=1", socket_path=socket_path
    )
    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
        slow = send_now(socket_path, VALID_REQUEST[:3])
        await trio.testing.wait_all_tasks_blocked()
        sent = trio.current_time()
        handle.request_stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not present(socket_path)  # stopped accepting at once
    # The exchange ran to its own deadline (counted), and the agent waited for it.
    assert trio.current_time() - sent >= 4
    assert handle.broker is not None
    assert handle.broker.stats.counts["timeout"] == 1
    with slow:
        assert await read_to_eof(slow) == b""


async def test_drain_is_cut_at_the_shutdown_timeout(
    hook: Path,
    mig_lock: Path,
    socket_path: Path,
    nvml: FakeNvml,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = config_for(
        hook,
        mig_lock,
        "--broker-exchange-deadline=30",
        "--shutdown-timeout=1",
        "--interval=1",
        socket_path=socket_path,
    )
    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
        slow = send_now(socket_path, VALID_REQUEST[:3])
        await trio.testing.wait_all_tasks_blocked()
        stopped = trio.current_time()
        handle.request_stop()
    assert 1 <= trio.current_time() - stopped < 2
    assert handle.broker is not None
    assert handle.broker.stats.counts["timeout"] == 0  # cancelled, not timed out
    assert "graceful stop took longer than 1s; cancelling what is left" in caplog.text
    with slow:
        assert await read_to_eof(slow) == b""


# -- failures ---------------------------------------------------------------------------------


async def test_broker_failure_after_start_stops_the_agent(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    config = config_for(hook, mig_lock, socket_path=socket_path)
    errors: list[AgentError] = []

    async def agent(*, task_status: trio.TaskStatus[AgentHandle]) -> None:
        try:
            await serve_agent(config, nvml=nvml, task_status=task_status)
        except AgentError as exc:  # raised as itself, not inside a group
            errors.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle: AgentHandle = await nursery.start(agent)
            port = handle.metrics_address.port
            assert (await scrape(handle))[0] == 200  # opens NVML
            assert nvml.initialized
            break_listener(os.getpid(), socket_path)
    (error,) = errors
    assert (error.task, error.started) == ("broker", True)
    assert str(error) == f"broker failed: {socket_path}: accept failed: Invalid argument"
    assert isinstance(error.__cause__, BrokerError)
    # Everything else was cancelled and cleaned up.
    assert not present(socket_path)
    assert flock_free(default_lock_path(socket_path))
    assert refused(port)
    assert not nvml.initialized


async def test_broker_refusal_fails_start_up_before_anything_else_runs(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    socket_path.parent.mkdir(mode=0o711)
    socket_path.write_bytes(b"data")  # noqa: ASYNC240 - before the agent runs
    config = config_for(hook, mig_lock, socket_path=socket_path)
    with pytest.raises(BrokerStartupError) as info:  # the error itself, not a group
        await serve_agent(config, nvml=nvml)
    assert str(info.value) == (
        f"{socket_path}: path is a regular file, not a socket; refusing to replace it"
    )
    assert socket_path.read_bytes() == b"data"  # noqa: ASYNC240 - after it stopped
    assert not mig_lock.parent.exists()  # the monitor never started
    assert nvml.init_calls == 0


async def test_busy_metrics_port_stops_the_tasks_already_started(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = config_for(
            hook, mig_lock, f"--metrics-bind-address=127.0.0.1:{port}", socket_path=socket_path
        )
        with pytest.raises(HttpServerError, match=f"cannot listen on 127.0.0.1:{port}"):
            await serve_agent(config, nvml=nvml)
    assert mig_lock.parent.is_dir()  # the monitor had started ...
    assert not present(socket_path)  # ... and the broker: its socket is gone again
    assert flock_free(default_lock_path(socket_path))


async def test_unusable_kubeconfig_fails_start_up(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    config = config_for(
        hook,
        mig_lock,
        f"--kubeconfig={hook / 'missing'}",
        socket_path=socket_path,
        env={"NODE_NAME": "node-a"},
    )
    with pytest.raises(PodSourceError, match="cannot configure the Kubernetes client"):
        await serve_agent(config, nvml=nvml)
    assert not present(socket_path)
    assert not mig_lock.parent.exists()


async def test_a_task_that_returns_on_its_own_is_a_failure(hook: Path, mig_lock: Path) -> None:
    agent = _Agent(config_for(hook, mig_lock))

    async def quits(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()

    failures: list[_TaskFailure] = []

    async def supervised(*, task_status: trio.TaskStatus[None]) -> None:
        try:
            await agent.supervise("pod-watch", quits, task_status=task_status)
        except _TaskFailure as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(supervised)
    (failure,) = failures
    assert (failure.task, failure.started) == ("pod-watch", True)
    error = _public_error(failure)
    assert isinstance(error, AgentError)
    assert str(error) == "pod-watch stopped although no stop was requested"

    # Once a stop was requested, returning is how a task says it is done.
    agent.request_stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.supervise, "pod-watch", quits)


def test_public_error_names_the_task() -> None:
    before = _TaskFailure("metrics", False, HttpServerError("cannot listen on :1: busy"))
    assert _public_error(before) is before.error  # already one clear line
    bug = _TaskFailure("monitor", False, OSError(5, "Input/output error"))
    assert str(_public_error(bug)) == (
        "monitor failed to start: OSError: [Errno 5] Input/output error"
    )
    after = _TaskFailure("broker", True, BrokerError("/s: accept failed: Invalid argument"))
    error = _public_error(after)
    assert isinstance(error, AgentError)
    assert (error.task, error.started) == ("broker", True)
    assert str(error) == "broker failed: /s: accept failed: Invalid argument"


# -- MIG lock ---------------------------------------------------------------------------------


async def test_mig_lock_pauses_monitor_and_releases_nvml(
    hook: Path, mig_lock: Path, nvml: FakeNvml
) -> None:
    config = config_for(hook, mig_lock)

    async def wait_for(predicate: Callable[[], bool]) -> None:
        with trio.fail_after(10):
            while not predicate():  # noqa: ASYNC110 - state of several tasks, no single event
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
        assert "hami_host_gpu_utilization_ratio" in (await scrape(handle))[1]
        os.close(os.open(mig_lock, os.O_CREAT | os.O_WRONLY, 0o644))
        await wait_for(lambda: handle.monitor.paused and not nvml.initialized)
        _, text = await scrape(handle)
        assert "hami_trio_monitor_mig_paused 1.0" in text
        assert "hami_host_gpu_utilization_ratio" not in text  # NVML released
        assert handle.readiness() == {"monitor": True, "mig-lock-dir": True}  # a pause: no stall
        os.unlink(mig_lock)
        ticks = handle.monitor.ticks
        await wait_for(lambda: not handle.monitor.paused and handle.monitor.ticks > ticks)
        text = (await scrape(handle))[1]
        assert "hami_trio_monitor_mig_paused 0.0" in text
        assert "hami_host_gpu_utilization_ratio" in text
        handle.request_stop()


# -- signals (run_agent) ----------------------------------------------------------------------


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("restore_signals")
async def test_first_signal_drains_second_cancels(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "hami_trio")
    config = config_for(hook, mig_lock, "--broker-exchange-deadline=30", socket_path=socket_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle: AgentHandle = await nursery.start(partial(run_agent, config, nvml=nvml))
            slow = send_now(socket_path, VALID_REQUEST[:3])
            await trio.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(5):
                while present(socket_path):  # noqa: ASYNC110 - a file another task removes
                    await trio.sleep(0.01)
            assert handle.stopping
            start = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)  # do not wait for the 30 s deadline
    assert time.monotonic() - start < 5
    assert (
        "SIGTERM, stopping after the current tick and the broker's in-flight exchanges "
        "(at most 10s; a second signal cancels at once)" in caplog.text
    )
    assert "SIGINT again: cancelling what is still running" in caplog.text
    with slow:
        assert await read_to_eof(slow) == b""


@pytest.mark.usefixtures("restore_signals")
async def test_a_signal_during_start_up_stops_once_started(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "hami_trio")
    config = config_for(hook, mig_lock, socket_path=socket_path)
    default = signal.getsignal(signal.SIGTERM)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_agent, config, nvml=nvml))
            # Until run_agent catches the signal (its very first step): far from ready yet.
            while signal.getsignal(signal.SIGTERM) is default:
                await trio.lowlevel.checkpoint()
            os.kill(os.getpid(), signal.SIGTERM)
    messages = [record.getMessage() for record in caplog.records]
    stopping = next(i for i, m in enumerate(messages) if m.startswith("SIGTERM, stopping"))
    ready = next(i for i, m in enumerate(messages) if m.startswith("agent ready"))
    stopped = next(i for i, m in enumerate(messages) if m.startswith("agent stopped"))
    assert stopping < ready < stopped  # the start-up finished, then the usual drain
    assert not present(socket_path)


@pytest.mark.usefixtures("restore_signals")
async def test_run_agent_raises_the_task_error(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    config = config_for(hook, mig_lock, socket_path=socket_path)
    errors: list[AgentError] = []

    async def agent(*, task_status: trio.TaskStatus[AgentHandle]) -> None:
        try:
            await run_agent(config, nvml=nvml, task_status=task_status)
        except AgentError as exc:
            errors.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent)
            break_listener(os.getpid(), socket_path)
    (error,) = errors
    assert str(error).startswith("broker failed: ")
    assert not present(socket_path)


# -- pods on /metrics: allocation, lifecycle, why a container is (not) exported -----------------


async def test_pod_lifecycle_and_export_states_through_the_agent(
    hook: Path, mig_lock: Path, nvml: FakeNvml, tmp_path: Path
) -> None:
    """The real agent against the fake API server: what the pods say is what /metrics says.

    A completed pod's rows go (its directory stays: the pod still exists), a restarted
    container keeps its directory and its rows, a directory of a container the pod does not
    list is not exported (and kept), and only a deleted pod's directories are removed, by
    the lister's existing rule (here with a resync interval of 0).
    """
    fake = FakeKubeApi()
    allocation = {ALLOCATED_ANNOTATION: f"{GPU},NVIDIA,3072,40:;"}
    node = {NODE_LABEL: "node-a"}
    async with trio.open_nursery() as outer:
        await outer.start(fake.serve)
        batch = fake.add_pod("batch", labels=node | {"team": "a"}, annotations=allocation)
        serve = fake.add_pod("serve", labels=node | {"team": "b"}, annotations=allocation)
        idle = fake.add_pod("idle", labels=node, annotations=allocation)  # no directory
        broken = fake.add_pod("broken", labels=node, containers=("main", "waiting"))
        dirs = {
            "batch": add_container(hook, batch),
            "serve": add_container(hook, serve),
            "stale": add_container(hook, serve, "renamed"),  # serve lists no such container
            "rejected": hook / "containers" / f"{broken}_main",
            "waiting": hook / "containers" / f"{broken}_waiting",  # no cuInit yet: no file
        }
        dirs["rejected"].mkdir()
        (dirs["rejected"] / "x.cache").write_bytes(b"\x01" * 64)  # not HAMi-core's magic
        dirs["waiting"].mkdir()
        kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
        config = config_for(
            hook,
            mig_lock,
            f"--kubeconfig={kubeconfig}",
            "--resync-interval=0s",
            "--pod-labels-allowlist=team",
            env={"NODE_NAME": "node-a"},
        )
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))

                async def scraped(check: Callable[[dict[Any, float]], bool]) -> dict[Any, float]:
                    while True:
                        status, text = await scrape(handle)
                        assert status == 200
                        found = samples(text)
                        if check(found):
                            return found
                        await trio.sleep(0.05)

                def states(found: dict[Any, float]) -> dict[str, float]:
                    return {
                        dict(labels)["state"]: value
                        for (name, labels), value in found.items()
                        if name == "hami_trio_monitor_containers"
                    }

                def pods_of(found: dict[Any, float], family: str) -> set[str]:
                    return {dict(labels)["pod"] for name, labels in found if name == family}

                found = await scraped(lambda f: states(f).get("exported") == 2)
                assert states(found) == {
                    "exported": 2,
                    "paused": 0,
                    "no_pod": 1,  # the renamed container
                    "completed": 0,
                    "rejected": 1,
                    "no_cache_file": 1,
                }
                assert pods_of(found, "hami_vgpu_memory_used_bytes") == {"batch", "serve"}
                # Allocated before any use: the idle pod has no directory at all.
                allocated = {
                    (dict(labels)["pod"], value)
                    for (name, labels), value in found.items()
                    if name == "hami_trio_container_allocated_memory_bytes"
                }
                assert allocated == {(p, 3072 << 20) for p in ("batch", "serve", "idle")}
                info = {
                    (dict(labels)["pod"], dict(labels)["pod_uid"], dict(labels)["phase"])
                    for name, labels in found
                    if name == "hami_trio_pod_info"
                }
                assert info == {
                    ("batch", batch, "Running"),
                    ("serve", serve, "Running"),
                    ("idle", idle, "Running"),
                    ("broken", broken, "Running"),
                }
                teams = {
                    (dict(labels)["pod"], dict(labels)["label_team"])
                    for name, labels in found
                    if name == "hami_trio_pod_labels"
                }
                assert teams == {("batch", "a"), ("serve", "b"), ("idle", ""), ("broken", "")}
                last_tick = found[("hami_trio_monitor_last_tick_timestamp_seconds", frozenset())]
                assert abs(last_tick - time.time()) < 30

                # The batch pod completes; the serve pod's container crashes and restarts.
                fake.modify_pod(batch, phase="Succeeded")
                fake.modify_pod(serve, restart="main")
                found = await scraped(lambda f: states(f).get("completed") == 1)
                assert pods_of(found, "hami_vgpu_memory_used_bytes") == {"serve"}
                assert pods_of(found, "hami_trio_container_allocated_memory_bytes") == {
                    "serve",
                    "idle",
                }
                # A directory of a UID no pod has goes at once (resync interval 0) ...
                stranger = add_container(hook, "uid-of-no-pod")
                await scraped(lambda _: not stranger.exists())
                ticks = handle.monitor.ticks
                await scraped(lambda _: handle.monitor.ticks >= ticks + 5)
                # ... but every pod still exists: none of theirs goes, whatever its state.
                assert all(path.is_dir() for path in dirs.values())
                assert states(await scraped(lambda _: True))["no_pod"] == 1

                fake.delete_pod(batch)
                found = await scraped(lambda _: not dirs["batch"].exists())
                assert pods_of(found, "hami_trio_pod_info") == {"serve", "idle", "broken"}
                assert dirs["serve"].is_dir()
                handle.request_stop()
        outer.cancel_scope.cancel()


# -- the debug view ---------------------------------------------------------------------------


async def debug_get(handle: AgentHandle, path: str) -> tuple[int, str]:
    assert handle.debug_address is not None
    return await trio.to_thread.run_sync(http_get, handle.debug_address.port, path)


DEAD_PID = 2_000_000_000  # above the kernel's largest pid_max (2**22)


def debug_fixture(hook: Path) -> RegionSpec:
    """Three container directories: a loaded v1 file, a refused file, no file yet."""
    spec = RegionSpec(
        uuids=[GPU],
        limits=[8 << 30],
        sm_limits=[50],
        priority=0,
        utilization_switch=1,
        procs=[
            ProcSlot(
                pid=10,
                hostpid=os.getpid(),  # alive: running
                used=[MemoryUse(total=1 << 30)],
                util=[UtilUse(sm_util=30)],
            ),
            ProcSlot(pid=11, hostpid=0, used=[MemoryUse(total=2 << 20)]),  # unknown
            ProcSlot(pid=12, hostpid=DEAD_PID),  # above any pid_max: exited
        ],
    )
    directory = hook / "containers" / "pod-uid-1_main"
    directory.mkdir(parents=True)
    write_region(directory / "abc.cache", spec)
    refused = hook / "containers" / "pod-uid-2_side"
    refused.mkdir()
    (refused / "x.cache").write_bytes(b"0123")
    (hook / "containers" / "pod-uid-3_idle").mkdir()
    return spec


async def test_debug_view_serves_what_the_files_say_on_its_own_port(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    spec = debug_fixture(hook)
    config = config_for(hook, mig_lock, socket_path=socket_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
            assert await exchange(socket_path) == encode_response(os.getpid())
            assert handle.debug_address is not None
            assert handle.debug_address.port not in (0, handle.metrics_address.port)

            status, body = await debug_get(handle, "/debug/state")
            assert status == 200
            doc = json.loads(body)
            by_dir = {entry["directory"].rsplit("/", 1)[1]: entry for entry in doc["containers"]}
            assert sorted(by_dir) == ["pod-uid-1_main", "pod-uid-2_side", "pod-uid-3_idle"]
            main = by_dir["pod-uid-1_main"]
            assert (main["namespace"], main["pod"], main["container"]) == ("", "pod-uid-1", "main")
            assert main["file"] == str(hook / "containers" / "pod-uid-1_main" / "abc.cache")
            assert (main["status"], main["format"], main["version"]) == ("loaded", "v1", "1.2")
            # The file said 1; alone on its GPU, the first tick wrote 0, which the document's
            # usage read (after that tick) finds.
            assert (main["priority"], main["utilization_switch"]) == (0, 0)
            assert doc["monitor"]["usage_read_at"] is not None
            assert main["devices"] == [
                {
                    "index": 0,
                    "uuid": GPU,
                    "uuid_state": "valid",
                    "used_bytes": (1 << 30) + (2 << 20),
                    "limit_bytes": spec.limits[0],
                    "sm_util": 30,
                    "core_limit": 50,
                    "processes": 2,
                }
            ]
            assert main["processes"] == [
                {"pid": 10, "host_pid": os.getpid(), "state": "running"},
                {"pid": 11, "host_pid": 0, "state": "unknown"},
                {"pid": 12, "host_pid": DEAD_PID, "state": "exited"},
            ]
            assert main["process_states"] == {"running": 1, "exited": 1, "unknown": 1}
            assert doc["monitor"]["checks_liveness"] is True
            # priority 0 and nobody else on the GPU: never blocked
            assert (main["blocked"], main["blocked_since"], main["blocks"]) == (False, None, 0)
            # Without Kubernetes there is no allocation annotation to read.
            assert main["allocated"] is None
            assert main["export"]["state"] == "exported"
            assert by_dir["pod-uid-2_side"]["export"]["state"] == "rejected"
            assert by_dir["pod-uid-3_idle"]["export"]["state"] == "no_cache_file"
            side = by_dir["pod-uid-2_side"]
            assert side["rejection"]["reason"] == "too_small"
            assert by_dir["pod-uid-3_idle"]["status"] == "no_cache_file"

            assert doc["broker"]["socket_path"] == str(socket_path)
            assert doc["broker"]["exchanges"]["ok"] == 1
            assert doc["monitor"]["by_status"] == {"loaded": 1, "no_cache_file": 1, "rejected": 1}
            assert doc["monitor"]["ticks"] >= 1
            assert doc["pods"]["source"] == "static"

            status, body = await debug_get(handle, "/debug/containers?pod=pod-uid-2")
            picked = json.loads(body)
            assert [e["container"] for e in picked["containers"]] == ["side"]
            assert "broker" not in picked
            status, body = await debug_get(handle, "/debug/broker")
            assert json.loads(body)["broker"]["exchanges"]["ok"] == 1
            assert (await debug_get(handle, "/debug/nothing"))[0] == 404
            # Never on the metrics port: every pod can reach that one.
            assert (await scrape(handle, "/debug/state"))[0] == 404
            assert (await scrape(handle, "/debug/containers"))[0] == 404
            assert "debug" not in handle.readiness()
            handle.request_stop()


async def test_debug_view_can_be_turned_off(hook: Path, mig_lock: Path, nvml: FakeNvml) -> None:
    config = config_for(hook, mig_lock, "--debug-bind-address=off")
    assert config.debug_bind is None
    async with trio.open_nursery() as nursery:
        handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
        assert handle.debug_address is None
        assert handle.debug_document()["monitor"]["ticks"] >= 1  # the document still exists
        handle.request_stop()


async def test_busy_debug_port_fails_start_up_naming_the_flag_and_address(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = config_for(
            hook, mig_lock, f"--debug-bind-address=127.0.0.1:{port}", socket_path=socket_path
        )
        with pytest.raises(
            HttpServerError,
            match=f"^--debug-bind-address 127.0.0.1:{port}: cannot listen on 127.0.0.1:{port}",
        ):
            await serve_agent(config, nvml=nvml)
    assert not present(socket_path)  # the tasks already started were stopped


async def test_debug_view_names_pods_from_the_api_server_and_why_others_are_unknown(
    hook: Path, mig_lock: Path, base_dir: Path, nvml: FakeNvml
) -> None:
    async with trio.open_nursery() as nursery:
        fake = FakeKubeApi()
        await nursery.start(fake.serve)
        uid = fake.add_pod(
            "trainer-0",
            namespace="team-a",
            labels={"hami.io/vgpu-node": "node-a"},
            init_containers=("setup",),
            # init container first (none for it), then main: one device of 3 GiB, 40 %
            annotations={ALLOCATED_ANNOTATION: f";{GPU},NVIDIA,3072,40:;"},
        )
        add_container(hook, uid, "main")
        add_container(hook, "not-on-this-node", "main")
        env = {
            "NODE_NAME": "node-a",
            "KUBECONFIG": write_kubeconfig(base_dir / "kc", f"http://127.0.0.1:{fake.port}"),
        }
        config = config_for(hook, mig_lock, env=env)
        handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
        with trio.fail_after(20):
            while True:  # the watch is connected after the first list
                if handle.pod_source.authoritative:
                    break
                await trio.sleep(0.02)
        status, body = await debug_get(handle, "/debug/state")
        doc = json.loads(body)
        assert status == 200
        known, unknown = doc["containers"]  # known pods first
        assert (known["namespace"], known["pod"], known["pod_uid"]) == ("team-a", "trainer-0", uid)
        assert known["identity"] == {"known": True, "reason": None}
        assert known["allocated"] == {
            "devices": [{"uuid": GPU, "type": "NVIDIA", "memory_mib": 3072, "cores": 40}],
            "truncated": False,
        }
        assert known["export"]["state"] == "exported"
        assert unknown["allocated"] is None
        assert unknown["export"]["state"] == "no_pod"
        assert (unknown["namespace"], unknown["pod"]) == (None, None)
        assert unknown["identity"] == {
            "known": False,
            "reason": "pod UID 'not-on-this-node' is not known to the pod watch of node "
            "'node-a' (deleted, on another node, or not scheduled by HAMi here)",
        }
        pods = doc["pods"]
        assert (pods["source"], pods["node"], pods["ready"], pods["authoritative"]) == (
            "kubernetes",
            "node-a",
            True,
            True,
        )
        assert pods["pods"] == 1
        assert pods["resource_version"] is not None
        assert doc["broker"] is None
        picked = json.loads((await debug_get(handle, "/debug/containers?namespace=team-a"))[1])
        assert [e["pod"] for e in picked["containers"]] == ["trainer-0"]
        handle.request_stop()
        fake.stop()


# -- beside another broker (HAMi's, during a cut-over) -----------------------------------


async def test_another_broker_at_the_socket_path_is_waited_beside_never_fought(
    hook: Path,
    mig_lock: Path,
    socket_path: Path,
    nvml: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hami_trio.agent import service as service_module

    monkeypatch.setattr(service_module, "FOREIGN_BROKER_RETRY", 0.2)
    # HAMi's broker as its device plugin runs it: a root socket in a 0711 directory and its
    # broker.lock, held with flock, inside that directory.
    socket_path.parent.mkdir(mode=0o711)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(socket_path))
    other.listen(16)
    hami_lock = socket_path.parent / "broker.lock"
    lock_file = open(hami_lock, "wb")  # noqa: SIM115, ASYNC230 - held across the test
    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    identity = (os.stat(socket_path).st_dev, os.stat(socket_path).st_ino)
    config = config_for(hook, mig_lock, socket_path=socket_path)
    with caplog.at_level(logging.INFO), trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
            assert handle.broker is None  # waiting: the monitor and metrics run
            assert handle.readiness()["broker"] is True  # the node's workloads are served
            found = samples((await scrape(handle))[1])
            assert found[("hami_trio_broker_foreign_listener", frozenset())] == 1
            status, body = await debug_get(handle, "/debug/broker")
            assert status == 200
            foreign = json.loads(body)["broker"]["foreign_listener"]
            assert "another server is listening" in foreign
            assert f"HAMi's own broker: it holds {hami_lock}" in foreign
            await trio.sleep(0.6)  # several retries: the other broker's files stay as they are
            assert (os.stat(socket_path).st_dev, os.stat(socket_path).st_ino) == identity
            assert hami_lock.exists()
            assert not flock_free(hami_lock)
            warned = [r for r in caplog.records if getattr(r, "event", None) == "foreign_broker"]
            assert len(warned) == 1  # said once, not every retry

            # HAMi's broker is switched off (its socket left behind, its lock released).
            other.close()
            lock_file.close()
            await wait_until(lambda: handle.broker is not None)
            assert await exchange(socket_path) == encode_response(os.getpid())
            found = samples((await scrape(handle))[1])
            assert found[("hami_trio_broker_foreign_listener", frozenset())] == 0
            assert handle.readiness()["broker"] is True
            handle.request_stop()
    assert not present(socket_path)
    gone = [r for r in caplog.records if getattr(r, "event", None) == "foreign_broker_gone"]
    assert len(gone) == 1


async def test_a_stop_while_waiting_beside_another_broker_drains_at_once(
    hook: Path, mig_lock: Path, socket_path: Path, nvml: FakeNvml
) -> None:
    socket_path.parent.mkdir(mode=0o711)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(socket_path))
        other.listen(16)
        config = config_for(hook, mig_lock, socket_path=socket_path)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                handle: AgentHandle = await nursery.start(partial(serve_agent, config, nvml=nvml))
                assert handle.broker is None
                handle.request_stop()
        assert present(socket_path)  # the other broker's socket is left alone
