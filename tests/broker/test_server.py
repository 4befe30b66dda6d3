"""The broker server over real Unix sockets."""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from hami_trio.broker import server as server_module
from hami_trio.broker.protocol import (
    INVALID_RESPONSE,
    VALID_REQUEST,
    encode_response,
    parse_response,
)
from hami_trio.broker.server import (
    FD_RESERVE,
    BrokerConfig,
    BrokerHandle,
    accept_backoff,
    exchanges_within,
    serve_broker,
)
from hami_trio.errors import BrokerError, BrokerStartupError, ConfigError
from tests.broker.vectors import DOC_VECTORS, expected_answer
from tests.broker.wire import (
    blocking_exchange,
    exchange,
    present,
    read_to_eof,
    rejected,
    running_broker,
    send_now,
)
from tests.sandbox import namespace_argv, run_in_child

# A stand-alone client for other processes: prints its own PID and the answer it got, then
# (with "wait") blocks on stdin so the test can inspect it while it is alive.
CLIENT = """
import json, socket, sys, os
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(bytes.fromhex("4850494400010001"))
data = b""
while chunk := s.recv(64):
    data += chunk
print(json.dumps({"pid": os.getpid(), "answer": data.hex()}), flush=True)
if sys.argv[2:] == ["wait"]:
    sys.stdin.readline()
"""


def config(path: Path, **overrides: object) -> BrokerConfig:
    return BrokerConfig(socket_path=path, **overrides)  # type: ignore[arg-type]


# -- answers -----------------------------------------------------------------------------------


async def test_answers_the_callers_pid(socket_path: Path) -> None:
    async with running_broker(config(socket_path)) as handle:
        assert await exchange(socket_path) == encode_response(os.getpid())
        assert handle.stats.counts["ok"] == 1


async def test_answers_a_subprocess_pid(socket_path: Path) -> None:
    async with running_broker(config(socket_path)):
        result = await trio.run_process(
            [sys.executable, "-c", CLIENT, str(socket_path)], capture_stdout=True
        )
    report = json.loads(result.stdout)
    assert report["pid"] != os.getpid()
    assert bytes.fromhex(report["answer"]) == encode_response(report["pid"])


@pytest.mark.root
async def test_client_in_new_pid_namespace_gets_its_host_pid(socket_path: Path) -> None:
    async with running_broker(config(socket_path)):
        argv = namespace_argv([sys.executable, "-c", CLIENT, str(socket_path), "wait"])
        proc = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            line = b""
            with trio.fail_after(20):
                while not line.endswith(b"\n"):
                    chunk = await proc.stdout.receive_some()
                    assert chunk, "client exited without a report"
                    line += chunk
            report = json.loads(line)
            host_pid = parse_response(bytes.fromhex(report["answer"])).pid
            assert report["pid"] == 1  # what the client sees of itself
            assert host_pid != 1
            # The answered PID is that same process, seen from the host: its namespaced PID
            # is 1 and its parent is the unshare process.
            status = await trio.Path(f"/proc/{host_pid}/status").read_text()
            assert f"NSpid:\t{host_pid}\t1\n" in status
            assert f"PPid:\t{proc.pid}\n" in status
            await proc.stdin.send_all(b"\n")
            with trio.fail_after(20):
                assert await proc.wait() == 0
        finally:
            proc.kill()
            await proc.wait()


@pytest.mark.root
async def test_forked_client_in_new_pid_namespace_gets_its_host_pid(socket_path: Path) -> None:
    def client() -> tuple[int, bytes]:
        return os.getpid(), blocking_exchange(socket_path)

    async with running_broker(config(socket_path)):
        result = await trio.to_thread.run_sync(
            partial(run_in_child, client, pid_namespace=True, mount_namespace=True)
        )
    inner_pid, answer = result.value
    assert inner_pid == 1
    assert answer == encode_response(result.host_pid)


@pytest.mark.root
@pytest.mark.slow
async def test_peer_invisible_to_the_broker_gets_no_reply(socket_path: Path) -> None:
    # A broker inside a child PID namespace cannot see this test process: the kernel
    # reports PID 0 for it, and the broker must close without guessing.
    argv = namespace_argv(
        [sys.executable, "-m", "hami_trio", "broker", "--socket-path", str(socket_path)]
    )
    proc = await trio.lowlevel.open_process(argv, stderr=subprocess.PIPE)
    try:
        await wait_for_listener(socket_path)
        assert await exchange(socket_path) == b""
        children = await trio.Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
        broker_pid = int(children.split()[0])
        os.kill(broker_pid, signal.SIGTERM)  # to the broker itself: graceful stop
        with trio.fail_after(20):
            assert await proc.wait() == 0
        assert proc.stderr is not None
        stderr = b""
        while chunk := await proc.stderr.receive_some():
            stderr += chunk
        assert b"broker exchange dropped: peer_error" in stderr
        assert not present(socket_path)
    finally:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize(("case", "request_", "pid", "response"), DOC_VECTORS)
async def test_documented_exchanges_on_the_wire(
    socket_path: Path, case: str, request_: bytes, pid: int, response: bytes | None
) -> None:
    async with running_broker(config(socket_path)):
        answer = await exchange(socket_path, request_)
    expected = expected_answer(request_, os.getpid())
    assert answer == (b"" if expected is None else expected), case
    if response is not None and response[6:8] == b"\x00\x01":
        assert answer == INVALID_RESPONSE


async def test_trailing_bytes_are_ignored_and_close_is_clean(socket_path: Path) -> None:
    async with running_broker(config(socket_path)):
        sock = send_now(socket_path, VALID_REQUEST + b"trailing junk")
        with sock:
            # read_to_eof would raise ConnectionResetError if unread bytes reset the peer.
            assert await read_to_eof(sock) == encode_response(os.getpid())


# -- deadlines and slow clients (virtual time) -------------------------------------------------


async def test_partial_request_closed_at_deadline(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_broker(config(socket_path, exchange_deadline=0.5)) as handle:
        start = trio.current_time()
        sock = send_now(socket_path, VALID_REQUEST[:4])
        with sock:
            assert await read_to_eof(sock) == b""
        assert trio.current_time() - start == pytest.approx(0.5)
        assert handle.stats.counts["timeout"] == 1
        assert handle.in_flight == 0


async def test_request_in_pieces_is_answered(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_broker(config(socket_path)) as handle:
        with trio.socket.socket(socket.AF_UNIX) as sock:
            await sock.connect(str(socket_path))
            for byte in VALID_REQUEST:
                await trio.sleep(0.05)
                await sock.send(bytes([byte]))
            assert await read_to_eof(sock) == encode_response(os.getpid())
        assert handle.stats.counts["ok"] == 1


async def test_deadline_covers_the_whole_exchange(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Each byte comes well within the deadline, but together they take longer.
    closed_after: list[float] = []
    async with running_broker(config(socket_path, exchange_deadline=0.5)) as handle:
        with trio.socket.socket(socket.AF_UNIX) as sock:
            await sock.connect(str(socket_path))
            start = trio.current_time()

            async def dribble() -> None:
                for byte in VALID_REQUEST[:6]:  # the last at 0.45 s, then 0.09 s of silence
                    await sock.send(bytes([byte]))
                    await trio.sleep(0.09)

            async def wait_for_close() -> None:
                assert await read_to_eof(sock) == b""
                closed_after.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(dribble)
                nursery.start_soon(wait_for_close)
        assert handle.stats.counts["timeout"] == 1
    assert closed_after == [pytest.approx(0.5)]


async def test_limit_full_closes_new_connection_at_once(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_broker(config(socket_path, max_exchanges=2)) as handle:
        idle = [send_now(socket_path, b"") for _ in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        assert handle.in_flight == 2
        start = trio.current_time()
        await rejected(socket_path)
        assert trio.current_time() == start  # closed at once, not queued
        assert handle.stats.counts["rejected_full"] == 1
        # A prompt client needs no slot: it is answered while the limit is full.
        with send_now(socket_path) as prompt:
            assert await read_to_eof(prompt) == encode_response(os.getpid())
        assert trio.current_time() == start
        # Once the idle ones time out, slots are free again.
        for sock in idle:
            assert await read_to_eof(sock) == b""
            sock.close()
        assert await exchange(socket_path) == encode_response(os.getpid())
        assert handle.stats.counts["timeout"] == 2


@pytest.mark.slow
async def test_idle_flood_beyond_limit_leaves_legitimate_clients_answered(
    socket_path: Path,
) -> None:
    # Real time, bounded: 300 idle connections against 32 slots, each re-opened as soon as
    # the broker drops it, while 200 prompt clients ask for their PID.
    idle_conns, slots, legit = 300, 32, 200
    stop = trio.Event()
    reopened = 0

    async def attacker() -> None:
        nonlocal reopened
        while not stop.is_set():
            with trio.socket.socket(socket.AF_UNIX) as sock:
                try:
                    await sock.connect(str(socket_path))
                except OSError:
                    await trio.sleep(0.001)
                    continue
                await read_to_eof(sock)  # the broker dropped us: go again
                reopened += 1

    answers: list[bytes] = []
    async with running_broker(config(socket_path, max_exchanges=slots)) as handle:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(idle_conns):
                    nursery.start_soon(attacker)
                for _ in range(2000):
                    if handle.in_flight == slots and reopened >= idle_conns:
                        break
                    await trio.sleep(0.01)
                for _ in range(legit // 10):
                    socks = [send_now(socket_path) for _ in range(10)]
                    for sock in socks:
                        with sock:
                            answers.append(await read_to_eof(sock))
                stop.set()
                nursery.cancel_scope.cancel()
        counts = dict(handle.stats.counts)
    assert answers == [encode_response(os.getpid())] * legit
    assert counts["rejected_full"] >= idle_conns - slots
    assert counts["ok"] == legit


async def wait_for_listener(path: Path) -> None:
    """Wait (at most 20 s) until a broker in another process listens at ``path``."""
    with trio.fail_after(20):
        for _ in range(1000):
            try:
                with trio.socket.socket(socket.AF_UNIX) as probe:
                    await probe.connect(str(path))
                return
            except (FileNotFoundError, ConnectionRefusedError):
                await trio.sleep(0.02)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_ten_thousand_exchanges_leave_no_descriptor_behind(socket_path: Path) -> None:
    async with running_broker(config(socket_path)) as handle:
        for _ in range(100):  # warm up (trio's lazily created descriptors)
            await exchange(socket_path)
        before = open_fds()

        async def client(count: int) -> None:
            for _ in range(count):
                assert await exchange(socket_path) == encode_response(os.getpid())

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(client, 500)
        assert open_fds() == before
        assert handle.stats.counts["ok"] == 10_100


async def test_early_close_is_harmless(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_broker(config(socket_path)) as handle:
        # connect and close at once; half a request and close; a request and no read
        send_now(socket_path, b"").close()
        send_now(socket_path, VALID_REQUEST[:4]).close()
        send_now(socket_path, VALID_REQUEST).close()
        with trio.socket.socket(socket.AF_UNIX) as sock:  # closes while in the slow path
            await sock.connect(str(socket_path))
            await trio.testing.wait_all_tasks_blocked()
        await trio.testing.wait_all_tasks_blocked()
        assert await exchange(socket_path) == encode_response(os.getpid())
        counts = handle.stats.counts
        assert counts["eof"] == 3
        assert counts["ok"] + counts["peer_error"] == 2
        assert handle.in_flight == 0


# -- accept errors -----------------------------------------------------------------------------


def test_accept_backoff_schedule() -> None:
    pauses = [accept_backoff(0)]
    for _ in range(10):
        pauses.append(accept_backoff(pauses[-1]))
    assert pauses[:9] == [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0]
    assert pauses[9:] == [1.0, 1.0]


def failing_accept(handle: BrokerHandle, errors: list[int]) -> None:
    """Make the broker's next accepts fail with ``errors`` (then work again)."""
    server = handle._server
    real = server.accept_fd

    def accept() -> tuple[int, object]:
        if errors:
            code = errors.pop(0)
            raise OSError(code, os.strerror(code))
        return real()

    server.accept_fd = accept


async def test_transient_accept_errors_back_off_and_recover(
    socket_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "hami_trio.broker")
    async with running_broker(config(socket_path)) as handle:
        failing_accept(
            handle, [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM] + [errno.EMFILE] * 6
        )
        start = trio.current_time()
        with send_now(socket_path) as sock:
            assert await read_to_eof(sock) == encode_response(os.getpid())
        # 5 ms doubling, capped at 1 s: the wait is bounded and exactly the schedule.
        assert trio.current_time() - start == pytest.approx(
            0.005 + 0.01 + 0.02 + 0.04 + 0.08 + 0.16 + 0.32 + 0.64 + 1.0 + 1.0
        )
        # A success resets the pause.
        failing_accept(handle, [errno.EMFILE, errno.EMFILE])
        start = trio.current_time()
        with send_now(socket_path) as sock:
            assert await read_to_eof(sock) == encode_response(os.getpid())
        assert trio.current_time() - start == pytest.approx(0.015)
    accept_lines = [r for r in caplog.records if "accept failed" in r.getMessage()]
    assert len(accept_lines) == 1  # rate-limited, not one line per error


async def test_other_accept_error_ends_the_broker(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    errors: list[BrokerError] = []

    async def serve(*, task_status: trio.TaskStatus[BrokerHandle]) -> None:
        try:
            await serve_broker(config(socket_path), task_status=task_status)
        except BrokerError as exc:  # serve_broker raises it itself, not in a group
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve)
        idle = send_now(socket_path, VALID_REQUEST[:2])  # in flight: cancelled
        await trio.testing.wait_all_tasks_blocked()
        failing_accept(handle, [errno.EINVAL])
        send_now(socket_path, b"").close()
    (error,) = errors
    assert "accept failed" in str(error)
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.EINVAL
    # Its socket and lock are gone, the in-flight exchange was closed.
    assert not present(socket_path)
    with idle:
        assert await read_to_eof(idle) == b""
    async with running_broker(config(socket_path)):
        pass


@pytest.mark.slow
async def answered_after_rejections(path: Path) -> bytes:
    """Ask until the broker answers: while its one slot is held, a connection it accepts
    between the client's connect and send is closed unanswered (``rejected_full``), as a
    client of the real broker would see and fall back on; the promise is that one is
    answered again once the idle connections have timed out."""
    while True:
        try:
            sock = send_now(path)
        except (BrokenPipeError, ConnectionResetError):
            await trio.sleep(0.05)
            continue
        with sock:
            try:
                answer = await read_to_eof(sock)
            except ConnectionResetError:
                answer = b""
        if answer:
            return answer
        await trio.sleep(0.05)


async def test_descriptor_exhaustion_backs_off_and_recovers(socket_path: Path) -> None:
    # A real EMFILE: the broker process gets 40 descriptors; 60 idle connections exhaust
    # them; once the idle ones time out, a client is answered again.
    argv = [
        "prlimit",
        "--nofile=40:40",
        sys.executable,
        "-m",
        "hami_trio",
        "broker",
        "--socket-path",
        str(socket_path),
        "--exchange-deadline",
        "0.3",
    ]
    proc = await trio.lowlevel.open_process(argv, stderr=subprocess.PIPE)
    idle: list[trio.socket.SocketType] = []
    try:
        with trio.fail_after(20):
            await wait_for_listener(socket_path)
        # Stopped while they connect, the broker finds all 60 in its backlog at once and
        # accepts until EMFILE; running, it could accept and close them as they come.
        proc.send_signal(signal.SIGSTOP)
        try:
            idle = [send_now(socket_path, b"") for _ in range(60)]
        finally:
            proc.send_signal(signal.SIGCONT)
        with trio.fail_after(10):  # deadline 0.3 s + backoff <= 1 s + margin
            answer = await answered_after_rejections(socket_path)
        assert answer == encode_response(os.getpid())
        proc.terminate()
        with trio.fail_after(20):
            assert await proc.wait() == 0
        assert proc.stderr is not None
        stderr = b""
        while chunk := await proc.stderr.receive_some():
            stderr += chunk
        assert b"broker accept failed (EMFILE)" in stderr
        assert b"max_exchanges clamped from 4096 to 1: the descriptor limit 40" in stderr
    finally:
        for sock in idle:
            sock.close()
        proc.kill()
        await proc.wait()


# -- lifecycle -----------------------------------------------------------------------------------


async def test_graceful_stop_removes_socket_and_drains(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    done = trio.Event()

    async def serve(*, task_status: trio.TaskStatus[BrokerHandle]) -> None:
        await serve_broker(config(socket_path), task_status=task_status)
        done.set()

    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve)
        slow = send_now(socket_path, VALID_REQUEST[:4])
        await trio.testing.wait_all_tasks_blocked()
        assert handle.in_flight == 1
        handle.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not present(socket_path)  # new clients fail fast and fall back
        with pytest.raises(FileNotFoundError):
            send_now(socket_path)
        assert not done.is_set()  # still draining the in-flight exchange
        with slow:
            await slow.send(VALID_REQUEST[4:])
            assert await read_to_eof(slow) == encode_response(os.getpid())
        await done.wait()
    handle.stop()  # after the end: harmless


async def test_stop_waits_at_most_the_deadline(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve_broker, config(socket_path, exchange_deadline=0.5))
        start = trio.current_time()
        idle = send_now(socket_path, b"")
        await trio.testing.wait_all_tasks_blocked()
        handle.stop()
    assert trio.current_time() - start == pytest.approx(0.5)
    with idle:
        assert await read_to_eof(idle) == b""


async def test_cancellation_removes_socket_and_releases_lock(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve_broker, config(socket_path))
        idle = send_now(socket_path, b"")
        await trio.testing.wait_all_tasks_blocked()
        assert handle.in_flight == 1
        nursery.cancel_scope.cancel()
    assert not present(socket_path)
    with idle:
        assert await read_to_eof(idle) == b""
    async with running_broker(config(socket_path)):  # lock released
        assert await exchange(socket_path) == encode_response(os.getpid())


async def test_startup_refusal_is_raised_before_ready(socket_path: Path) -> None:
    await trio.Path(socket_path.parent).mkdir(mode=0o711)
    await trio.Path(socket_path).write_text("not a socket")
    async with trio.open_nursery() as nursery:
        with pytest.raises(BrokerStartupError, match="not a socket"):
            await nursery.start(serve_broker, config(socket_path))
    assert await trio.Path(socket_path).read_text() == "not a socket"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_exchanges": 0}, "max_exchanges must be at least 1"),
        ({"max_exchanges": 2.5}, "max_exchanges must be an integer"),
        ({"max_exchanges": True}, "max_exchanges must be an integer"),
        ({"exchange_deadline": 0}, "exchange_deadline must be a positive"),
        ({"exchange_deadline": float("inf")}, "exchange_deadline must be a positive"),
        ({"exchange_deadline": float("nan")}, "exchange_deadline must be a positive"),
        ({"expected_uid": -1}, "expected_uid must be >= 0"),
    ],
)
def test_config_is_validated(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(**overrides)  # type: ignore[arg-type]


def test_config_defaults() -> None:
    default = BrokerConfig()
    assert default.socket_path == Path("/var/run/hami/hostpid/broker.sock")
    assert default.exchange_deadline == 0.5
    assert default.max_exchanges == 4096
    assert default.expected_uid is None
    assert isinstance(BrokerConfig(socket_path="/tmp/x.sock").socket_path, Path)  # type: ignore[arg-type]


# -- metrics and logs ------------------------------------------------------------------------------


async def test_metrics_follow_the_contract(
    socket_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = CollectorRegistry()
    value: Callable[..., float | None] = registry.get_sample_value
    async with running_broker(config(socket_path, max_exchanges=1), registry) as handle:
        await exchange(socket_path)  # ok
        await exchange(socket_path, b"HPIX\x00\x01\x00\x01")  # invalid
        await exchange(socket_path, b"HP")  # eof
        idle = send_now(socket_path, b"")
        await trio.testing.wait_all_tasks_blocked()
        assert value("hami_trio_broker_exchanges_in_flight") == 1
        await rejected(socket_path)  # rejected_full
        with idle:
            await read_to_eof(idle)  # timeout
        counts = {
            outcome: value("hami_trio_broker_exchanges_total", {"outcome": outcome})
            for outcome in (
                "ok",
                "invalid",
                "timeout",
                "eof",
                "rejected_full",
                "evicted",
                "peer_error",
            )
        }
        assert counts == {
            "ok": 1,
            "invalid": 1,
            "timeout": 1,
            "eof": 1,
            "rejected_full": 1,
            "evicted": 0,
            "peer_error": 0,
        }
        assert value("hami_trio_broker_exchanges_in_flight") == 0
        # Every exchange but the rejected one is timed; the timeout took the whole deadline.
        histogram = "hami_trio_broker_exchange_duration_seconds"
        assert value(f"{histogram}_count") == 4
        assert value(f"{histogram}_bucket", {"le": "+Inf"}) == 4
        assert value(f"{histogram}_bucket", {"le": "0.0001"}) == 3  # no virtual time passed
        assert value(f"{histogram}_bucket", {"le": "0.25"}) == 3
        assert value(f"{histogram}_bucket", {"le": "1.0"}) == 4
        assert value(f"{histogram}_sum") == pytest.approx(0.5)
        assert handle.stats.total == 5
    # Unregistered when the broker ends: a successor can register the same names.
    assert value("hami_trio_broker_exchanges_in_flight") is None
    async with running_broker(config(socket_path), registry):
        assert value("hami_trio_broker_exchanges_total", {"outcome": "ok"}) == 0


async def test_dropped_exchanges_are_logged_rate_limited(
    socket_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "hami_trio.broker")
    broker = config(socket_path, max_exchanges=1, exchange_deadline=60)
    async with running_broker(broker) as handle:
        idle = send_now(socket_path, b"")  # holds the only slot
        await trio.testing.wait_all_tasks_blocked()
        await rejected(socket_path, 50)
        assert handle.stats.counts["rejected_full"] == 50
        await trio.sleep(11)  # past the log interval: the next line reports the suppressed
        await rejected(socket_path, 2)
        assert handle.stats.counts["rejected_full"] == 52
        idle.close()
    lines = [r.getMessage() for r in caplog.records if "rejected_full" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0] == "broker exchange dropped: rejected_full (1 so far)"
    assert lines[1] == (
        "broker exchange dropped: rejected_full (51 so far) (49 similar events suppressed)"
    )


async def test_second_broker_in_the_same_registry_is_refused_cleanly(
    base_dir: Path, socket_path: Path
) -> None:
    registry = CollectorRegistry()
    other = base_dir / "other" / "broker.sock"
    async with running_broker(config(socket_path), registry):
        async with trio.open_nursery() as nursery:
            with pytest.raises(ValueError, match="Duplicated timeseries"):
                await nursery.start(partial(serve_broker, config(other), registry=registry))
        assert not present(other)
        assert await exchange(socket_path) == encode_response(os.getpid())
    async with running_broker(config(other), registry):  # its lock was released
        pass


def test_slots_fit_the_descriptor_limit() -> None:
    assert exchanges_within(4096, 512) == 512 - FD_RESERVE
    assert exchanges_within(100, 512) == 100
    assert exchanges_within(4096, 4096 + FD_RESERVE) == 4096
    assert exchanges_within(4096, 10) == 1
    assert exchanges_within(4096, resource.RLIM_INFINITY) == 4096


async def test_the_broker_runs_with_the_slots_its_limit_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # ``hami-trio broker`` has no configuration step: the broker clamps on its own, to the
    # soft limit it could raise to.
    monkeypatch.setattr(server_module, "raise_fd_limit", lambda needed: 300)
    config = BrokerConfig(socket_path=tmp_path / "s" / "broker.sock", max_exchanges=4096)
    with caplog.at_level(logging.WARNING, logger="hami_trio.broker"):
        async with trio.open_nursery() as nursery:
            handle: BrokerHandle = await nursery.start(serve_broker, config)
            assert handle.max_exchanges == 300 - FD_RESERVE
            handle.stop()
    assert any(
        "max_exchanges clamped from 4096 to 44: the descriptor limit 300" in r.getMessage()
        for r in caplog.records
    )
