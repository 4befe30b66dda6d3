"""Both clients against the real broker (``hami-trio broker``), in the container-like sandbox.

The exchange HAMi-core will have in production: the broker runs as root in the host's PID
namespace, the client as uid 65534 in its own PID namespace behind the read-only bind mount.
The storms release 300 and 1000 C clients at the same instant; each must get its own host
PID.  Their wall time is printed (``pytest -s``), not asserted: the figures belong to
bench/client_storm.py (which keeps HAMi-core's 500 ms deadline), and this machine is shared -
so the storm clients here get a 2 s deadline and the test checks correctness, not speed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.clients import CClient, Client, PyClient
from tests.clients.harness import Sandbox, python_broker, run_in_sandbox

pytestmark = pytest.mark.root

_STORM = re.compile(
    r"clients=(?P<clients>\d+) successful=(?P<ok>\d+) failed=(?P<failed>\d+)"
    r" wall_ms=(?P<wall>[\d.]+)\n.*distinct_pids=(?P<distinct>\d+)"
    r" answers_equal_local_pid=(?P<local>\d+)"
)


# Per-client deadline in the storm tests: generous, so CPU contention from other work on the
# machine cannot turn a correctness test into a timing test.
STORM_DEADLINE = 2.0


@pytest.fixture
def broker(sandbox: Sandbox) -> Iterator[None]:
    with python_broker(sandbox.host_socket):
        yield


@pytest.fixture(params=["c", "python"])
def client(request: pytest.FixtureRequest, c_client: Path) -> Client:
    if request.param == "c":
        return CClient(c_client)
    return PyClient()


def test_real_broker_answers_the_clients_host_pid(
    client: Client, sandbox: Sandbox, broker: None
) -> None:
    outcome = client.run(sandbox)
    assert outcome.pid == outcome.run.host_pid, outcome.run.stderr
    assert outcome.run.ns_pids == (outcome.run.host_pid, 1)


def test_real_broker_over_a_read_write_mount_is_not_trusted(
    client: Client, sandbox: Sandbox, broker: None
) -> None:
    assert client.run(sandbox, read_only=False).reason == "not_read_only"


def test_stopped_broker_leaves_no_socket(client: Client, sandbox: Sandbox) -> None:
    with python_broker(sandbox.host_socket):
        pass
    assert client.run(sandbox).reason == "missing"


@pytest.mark.slow
@pytest.mark.parametrize("clients", [300, 1000])
def test_storm_of_c_clients_all_answered(
    c_client: Path, sandbox: Sandbox, broker: None, clients: int
) -> None:
    run = run_in_sandbox(
        sandbox,
        [
            str(c_client),
            "--storm",
            str(clients),
            "--deadline",
            str(STORM_DEADLINE),
            str(sandbox.client_socket),
        ],
        env={"PATH": "/usr/bin:/bin", "LIBVGPU_HOSTPID_BROKER": "1"},
        timeout=120,
    )
    print(f"\nstorm of {clients} C clients vs the Python broker:\n{run.stdout}")
    match = _STORM.search(run.stdout)
    assert match is not None, run.stdout + run.stderr
    assert (match["ok"], match["failed"]) == (str(clients), "0"), run.stdout
    assert match["distinct"] == str(clients)  # every process got its own PID
    assert match["local"] == "0"  # ... and it is a host PID, not the sandbox's
    assert run.returncode == 0
