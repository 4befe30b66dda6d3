"""Target ``broker``: the live broker under hostile and clumsy clients.

How this works: the target runs the real broker (``python -m hami_trio broker``, through the
test harness's ``python_broker``) as a separate process for the whole target, with a short
exchange deadline so stalls are cheap.  Each input is a :class:`~tests.strategies.connections.
Session`: up to 32 clients run concurrently (trio tasks in this process), each sending a
request stream split at random points with random pauses, maybe a stall past the deadline, an
oversized write, an early close or a half-close; beside them up to 200 idle connections that
send nothing.  After every session the target checks what the broker must guarantee:

- a client whose 8 bytes all arrived well inside the deadline (under half of it, measured on
  the client's side from connect) gets exactly the right answer: status 0 and this process's
  PID for the valid request, ``status 1, PID 0`` for any other 8 bytes; extra bytes change
  nothing;
- every other client gets that same right answer or nothing at all (a stalled client may be
  answered if its bytes beat the timer), and a client that sent fewer than 8 bytes always gets
  nothing; never a partial, wrong or foreign answer;
- the broker closes every connection within its deadline (plus scheduling slack): no client is
  left hanging;
- afterwards the broker still answers a fresh valid request with the right PID, its process
  is alive, and its number of open file descriptors returns to the baseline taken at start.

A second property runs the same sessions against a broker with only 4 slots, so connections
are also rejected because the limit is full: there only the "right answer or nothing", "no
hang", "still answers" and "descriptors back to baseline" rules apply.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trio

from fuzz.campaign import Property, Target
from hami_trio.broker.protocol import (
    INVALID_RESPONSE,
    REQUEST_SIZE,
    VALID_REQUEST,
    encode_response,
)
from tests.broker.wire import blocking_exchange
from tests.clients.harness import python_broker
from tests.strategies import connections as st_conn

__all__ = ["DEADLINE", "TARGET"]

#: The exchange deadline the fuzzed brokers run with (seconds).
DEADLINE = 0.2
#: A stall is this much longer than the deadline.
_STALL = DEADLINE * 1.5
# A client must be answered for sure only if its request was complete this early.
_SURE = DEADLINE * 0.5
# How long past its deadline a connection may stay open before the broker counts as hanging
# (generous: a shared 2-core machine can starve a process for a while).
_HANG_SLACK = 3.0
# How long the descriptor count may take to return to its baseline.
_FD_SETTLE = DEADLINE + 5.0
_CHUNK = 65_536


@dataclass
class _Broker:
    path: Path
    pid: int
    baseline_fds: int


_BROKERS: dict[str, _Broker] = {}


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def _broker_session() -> Iterator[None]:
    """Run the two brokers for the whole target; record their descriptor baselines."""
    base = Path(tempfile.mkdtemp(prefix="ht-fuzz-", dir="/tmp"))
    try:
        with contextlib.ExitStack() as stack:
            for name, extra in (("default", ()), ("tight", ("--max-exchanges", "4"))):
                path = base / name / "broker.sock"
                proc = stack.enter_context(
                    python_broker(
                        path,
                        "--exchange-deadline",
                        str(DEADLINE),
                        "--log-level",
                        "error",
                        *extra,
                    )
                )
                # The baseline after a first exchange: everything lazy is allocated by now.
                blocking_exchange(path, timeout=2.0)
                _BROKERS[name] = _Broker(path, proc.pid, _fd_count(proc.pid))
            try:
                yield
            finally:
                _BROKERS.clear()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class _Outcome:
    received: bytes = b""
    complete_after: float | None = None  # seconds from connect until 8 bytes were written
    read: bool = False  # the client read until the broker closed
    hung: bool = False  # the broker kept the connection open far past its deadline


def _expected(stream: bytes) -> bytes | None:
    """The answer the broker owes for a request stream (None: no answer)."""
    if len(stream) < REQUEST_SIZE:
        return None
    if stream[:REQUEST_SIZE] == VALID_REQUEST:
        return encode_response(os.getpid())
    return INVALID_RESPONSE


async def _send(sock: trio.socket.SocketType, data: bytes) -> bool:
    """Write all of ``data``; False once the broker has closed (EPIPE/ECONNRESET)."""
    view = memoryview(data)
    try:
        while view:
            view = view[await sock.send(view[:_CHUNK]) :]
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


async def _client(path: Path, plan: st_conn.ConnectionPlan, out: _Outcome) -> None:
    await trio.sleep(plan.delay)
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            await sock.connect(str(path))
        except ConnectionRefusedError:
            return  # the tight broker's backlog is full: nothing was accepted, nothing owed
        start = trio.current_time()
        written, open_ = 0, True
        for index, (pause, piece) in enumerate(zip(plan.pauses, plan.pieces, strict=True)):
            await trio.sleep(_STALL if index == plan.stall_before else pause)
            open_ = await _send(sock, piece)
            if not open_:
                break
            written += len(piece)
            if out.complete_after is None and written >= REQUEST_SIZE:
                out.complete_after = trio.current_time() - start
        if open_ and plan.oversize:
            # With no request yet, the block completes it (zeros: an invalid request).
            open_ = await _send(sock, bytes(plan.oversize))
            if open_ and out.complete_after is None and written + plan.oversize >= REQUEST_SIZE:
                out.complete_after = trio.current_time() - start
        if plan.ending == "close":
            return
        if plan.ending == "half_close":
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        out.read = True
        with trio.move_on_after(DEADLINE + _STALL + _HANG_SLACK) as scope:
            while True:
                try:
                    chunk = await sock.recv(64)
                except ConnectionResetError:
                    break  # closed with our unread bytes in its buffer: a close all the same
                if not chunk:
                    break
                out.received += chunk
        out.hung = scope.cancelled_caught


async def _idle(path: Path, hold: float | None) -> None:
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            await sock.connect(str(path))
        except ConnectionRefusedError:
            return
        if hold is not None:
            await trio.sleep(hold)
            return
        with trio.move_on_after(DEADLINE + _HANG_SLACK):
            with contextlib.suppress(ConnectionResetError):
                while await sock.recv(64):
                    pass


async def _drive(path: Path, session: st_conn.Session) -> list[_Outcome]:
    outcomes = [_Outcome() for _ in session.plans]
    async with trio.open_nursery() as nursery:
        for _ in range(session.idle):
            nursery.start_soon(_idle, path, session.idle_hold)
        for plan, out in zip(session.plans, outcomes, strict=True):
            nursery.start_soon(_client, path, plan, out)
    return outcomes


def _settle(broker: _Broker) -> None:
    """Wait for the broker's descriptors to return to baseline; check it still answers."""
    stop = time.monotonic() + _FD_SETTLE
    while (count := _fd_count(broker.pid)) != broker.baseline_fds:
        assert time.monotonic() < stop, (
            f"broker holds {count} descriptors, {broker.baseline_fds} at start, "
            f"{_FD_SETTLE:.1f} s after the session"
        )
        time.sleep(0.02)
    assert blocking_exchange(broker.path, timeout=2.0) == encode_response(os.getpid()), (
        "broker stopped answering"
    )


def _check(name: str, session: st_conn.Session, strict: bool) -> None:
    broker = _BROKERS[name]
    outcomes = trio.run(_drive, broker.path, session)
    for plan, out in zip(session.plans, outcomes, strict=True):
        assert not out.hung, f"connection left open past its deadline: {plan}"
        if not out.read:
            continue
        owed = _expected(plan.stream)
        context = f"{plan} received {out.received!r} owed {owed!r}"
        if owed is None:
            assert out.received == b"", "answered a request shorter than 8 bytes: " + context
            continue
        assert out.received in (b"", owed), "wrong or partial answer: " + context
        sure = (
            strict
            and out.complete_after is not None
            and out.complete_after < _SURE
            and plan.stall_before is None
        )
        if sure:
            assert out.received == owed, "a prompt request was not answered: " + context
    _settle(broker)


def check_default(session: st_conn.Session) -> None:
    """The broker with default limits: prompt requests answered exactly, nothing else wrong."""
    _check("default", session, strict=True)


def check_tight(session: st_conn.Session) -> None:
    """A broker with 4 slots: rejections allowed, wrong answers and leaks never."""
    _check("tight", session, strict=False)


TARGET = Target(
    name="broker",
    description="live broker: split, paused, stalled, oversized, early-closed and idle clients",
    ci_seconds=45,
    weight=2.0,
    session=_broker_session,
    properties=(
        Property(
            "default_limits",
            (st_conn.sessions(),),
            check_default,
            weight=3.0,
            shrink_seconds=30,
        ),
        Property("four_slots", (st_conn.sessions(max_idle=20),), check_tight, shrink_seconds=30),
    ),
)
