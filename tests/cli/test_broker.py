"""``hami-trio broker``: foreground run, signals, start-up refusals, flag errors."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from hami_trio.agent.config import SETTINGS_BY_NAME, config_from_flags
from hami_trio.broker.boundary import default_lock_path
from hami_trio.broker.protocol import VALID_REQUEST, encode_response
from hami_trio.broker.server import DEFAULT_EXCHANGE_DEADLINE, DEFAULT_MAX_EXCHANGES, BrokerConfig
from hami_trio.cli.broker import parse_deadline, run_broker
from hami_trio.cli.main import build_parser, main
from hami_trio.errors import BrokerStartupError, ConfigError
from tests.broker.wire import blocking_exchange, exchange, present, read_to_eof, send_now


def start_broker(socket_path: Path, *extra: str) -> subprocess.Popen[str]:
    """``python -m hami_trio broker`` in the background; returns once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hami_trio", "broker", "--socket-path", str(socket_path), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines = ""
    for _ in range(10):  # a few start-up lines (e.g. an earlier version's lock removed)
        line = proc.stderr.readline()
        lines += line
        if "broker listening on" in line or not line:
            break
    if "broker listening on" not in lines:
        proc.kill()
        _, rest = proc.communicate()
        raise AssertionError(f"broker did not start: {lines}{rest}")
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_runs_in_foreground_and_stops_cleanly_on_signal(socket_path: Path, signum: int) -> None:
    proc = start_broker(socket_path, "--max-exchanges", "16", "--exchange-deadline", "250ms")
    try:
        assert blocking_exchange(socket_path) == encode_response(os.getpid())
        proc.send_signal(signum)
        returncode, stderr = finish(proc)
    finally:
        proc.kill()
        proc.wait()
    assert returncode == 0
    assert "broker stopped (1 exchanges served)" in stderr
    assert not socket_path.exists()
    assert default_lock_path(socket_path).exists()  # the lock file stays; it is unlocked
    assert os.listdir(socket_path.parent) == []  # nothing a workload could hold is left


def test_startup_refusal_is_one_clear_line(socket_path: Path) -> None:
    socket_path.parent.mkdir(mode=0o711)
    socket_path.write_text("data")
    proc = subprocess.run(
        [sys.executable, "-m", "hami_trio", "broker", "--socket-path", str(socket_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr == (
        f"hami-trio broker: --socket-path {socket_path}: path is a regular file, not a socket; "
        "refusing to replace it\n"
    )
    assert socket_path.read_text() == "data"


def test_second_broker_is_refused_and_first_keeps_running(socket_path: Path) -> None:
    first = start_broker(socket_path)
    try:
        second = subprocess.run(
            [sys.executable, "-m", "hami_trio", "broker", "--socket-path", str(socket_path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 1
        assert second.stderr.strip() == (
            f"hami-trio broker: --lock-path default {default_lock_path(socket_path)}: "
            "lock is held: another broker is running"
        )
        assert blocking_exchange(socket_path) == encode_response(os.getpid())
        first.terminate()
        assert finish(first)[0] == 0
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-exchanges", "many"], "--max-exchanges: 'many' is not an integer"),
        (["--max-exchanges", "0"], "--max-exchanges: must be at least 1, got '0'"),
        (["--exchange-deadline", "0"], "--exchange-deadline must be a positive duration"),
        (["--exchange-deadline", "soon"], "--exchange-deadline"),
        (["--log-level", "chatty"], "--log-level: unknown log level 'chatty'"),
    ],
)
def test_bad_flags_exit_2(
    socket_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["broker", "--socket-path", str(socket_path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hami-trio broker: ")
    assert message in err
    assert not socket_path.parent.exists()  # refused before touching anything


def test_broker_is_a_registered_command() -> None:
    args = build_parser().parse_args(["broker"])
    assert args.socket_path == Path("/var/run/hami/hostpid/broker.sock")
    assert (args.max_exchanges, args.exchange_deadline) == (None, None)  # the defaults below


def test_broker_shares_the_agents_settings(
    socket_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One definition, two flag names: the same defaults, parser and messages."""
    assert SETTINGS_BY_NAME["broker_exchange_deadline"].default == DEFAULT_EXCHANGE_DEADLINE
    assert SETTINGS_BY_NAME["broker_max_exchanges"].default == DEFAULT_MAX_EXCHANGES
    for agent_flag, broker_flag in (
        ("--broker-exchange-deadline", "--exchange-deadline"),
        ("--broker-max-exchanges", "--max-exchanges"),
    ):
        dest = agent_flag.removeprefix("--").replace("-", "_")
        with pytest.raises(ConfigError) as agent_error:
            config_from_flags({"hook_path": "/x", "no_kubernetes": True, dest: "-3"}, {})
        assert main(["broker", "--socket-path", str(socket_path), broker_flag, "-3"]) == 2
        broker_error = capsys.readouterr().err.removeprefix("hami-trio broker: ").strip()
        assert broker_error == str(agent_error.value).replace(agent_flag, broker_flag)
        assert "'-3'" in broker_error


@pytest.mark.parametrize(
    ("text", "seconds"), [("0.5", 0.5), ("2", 2.0), ("500ms", 0.5), ("1m", 60.0), ("1.5s", 1.5)]
)
def test_parse_deadline(text: str, seconds: float) -> None:
    assert parse_deadline(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1", "-1s", "inf", "nan", "0s", "soon", ""])
def test_parse_deadline_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="exchange-deadline"):
        parse_deadline(text)


# -- run_broker in this process: signals drive the shutdown --------------------------------------


async def test_first_signal_drains_second_cancels(socket_path: Path) -> None:
    config = BrokerConfig(socket_path=socket_path, exchange_deadline=30)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_broker, config)
            for _ in range(1000):
                if present(socket_path):
                    break
                await trio.sleep(0.01)
            assert await exchange(socket_path) == encode_response(os.getpid())
            slow = send_now(socket_path, VALID_REQUEST[:3])
            await trio.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
            await trio.sleep(0.05)
            assert not present(socket_path)  # stopped accepting at once
            start = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)  # do not wait for the 30 s deadline
        assert time.monotonic() - start < 5
    with slow:
        assert await read_to_eof(slow) == b""


async def test_run_broker_raises_startup_refusal(socket_path: Path) -> None:
    lock = default_lock_path(socket_path)
    lock.parent.mkdir(mode=0o700)
    os.mkfifo(lock, 0o600)
    with pytest.raises(BrokerStartupError, match="not a regular file"):
        await run_broker(BrokerConfig(socket_path=socket_path))


def test_lock_path_flag_is_used_and_checked(socket_path: Path, base_dir: Path) -> None:
    lock = base_dir / "elsewhere" / "my.lock"
    proc = start_broker(socket_path, "--lock-path", str(lock))
    try:
        assert blocking_exchange(socket_path) == encode_response(os.getpid())
        assert lock.is_file()
        assert not default_lock_path(socket_path).parent.exists()
        # The same lock held: refused, whatever socket path the second one names.
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "hami_trio",
                "broker",
                "--socket-path",
                str(base_dir / "other" / "b.sock"),
                "--lock-path",
                str(lock),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 1
        assert second.stderr.strip() == (
            f"hami-trio broker: --lock-path {lock}: lock is held: another broker is running"
        )
    finally:
        proc.terminate()
        finish(proc)
    inside = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_trio",
            "broker",
            "--socket-path",
            str(socket_path),
            "--lock-path",
            str(socket_path.parent / "broker.lock"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert inside.returncode == 1
    assert "lock directory is the socket's directory, which workloads mount" in inside.stderr


# --- a workload holding every file it can reach through its mount (tenant attack) ---------

LOCK_HOLDER = Path(__file__).parents[1] / "broker" / "lock_holder.py"


class Holder:
    """lock_holder.py running on a broker directory (see that module); its JSON lines."""

    def __init__(self, broker_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(LOCK_HOLDER), "setup", str(broker_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._buffer = b""
        try:
            self.report = self.next_line(10.0)
        except BaseException:
            if self.proc.returncode is None:
                self.stop()
            raise

    def next_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise TimeoutError("lock holder said nothing in time")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"lock holder exited: {self.stop()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def stop(self) -> str:
        """Close its stdin (it releases everything and exits); return its stderr."""
        try:
            _, err = self.proc.communicate(timeout=10)
        finally:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
        return err.decode(errors="replace")


@pytest.mark.root
@pytest.mark.parametrize("legacy_lock", [False, True], ids=["fresh", "old-broker.lock-left"])
def test_workload_holding_every_file_it_can_reach_cannot_stop_the_next_broker(
    socket_path: Path, legacy_lock: bool
) -> None:
    # The attack: a uid-0 workload process with no capabilities, in the workload's view (the
    # broker directory bind-mounted read-only at /tmp/vgpulock/hostpid), opens and flocks
    # everything it can reach, waits for the broker to exit (rolling update, crash) and
    # keeps holding; the next broker must start and serve all the same.
    first = start_broker(socket_path)
    holder: Holder | None = None
    try:
        assert blocking_exchange(socket_path) == encode_response(os.getpid())
        if legacy_lock:
            # What the previous version left in the socket directory: root's broker.lock.
            os.close(os.open(socket_path.parent / "broker.lock", os.O_CREAT | os.O_WRONLY, 0o600))
        holder = Holder(socket_path.parent)
        assert holder.report["cap_eff"] == "0000000000000000"  # no capability at all
        assert "." in holder.report["held"]  # the directory itself: flock needs no write
        assert holder.report["refused"]["broker.sock"].startswith("open:")  # a socket
        waiting = set(holder.report["waiting"])
        first.send_signal(signal.SIGTERM)
        assert finish(first)[0] == 0
        while waiting:  # the workload takes what the old broker held as soon as it exits
            waiting.discard(holder.next_line(10.0)["took"])
        second = start_broker(socket_path)  # must start although everything is held
        try:
            assert blocking_exchange(socket_path) == encode_response(os.getpid())
        finally:
            second.send_signal(signal.SIGTERM)
            returncode, stderr = finish(second)
        assert returncode == 0, stderr
    finally:
        first.kill()
        first.wait()
        if holder is not None:
            holder.stop()
