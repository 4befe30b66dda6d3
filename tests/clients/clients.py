"""The clients under test, behind one interface, so every contract test runs for each.

A client is run inside the sandbox (tests/clients/harness.py) and reports either a PID or a
reason name.  Both clients print the same thing: the PID on stdout with exit 0, or the reason
name on stdout with exit 1 (and a detail line on stderr).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.clients.harness import ClientRun, Sandbox, run_in_sandbox

PY_CHILD = Path(__file__).with_name("py_client_child.py")


@dataclass(frozen=True)
class Outcome:
    """What the client answered, with the run it came from."""

    pid: int | None
    reason: str | None
    run: ClientRun

    @property
    def elapsed(self) -> float:
        """Seconds the query took: as reported by the client (``client_elapsed=`` on
        stderr, the Python child), else from "go" to the process's exit (the C client)."""
        match = re.search(r"client_elapsed=([\d.]+)", self.run.stderr)
        return float(match.group(1)) if match else self.run.elapsed


def client_env(switch: str | None) -> dict[str, str]:
    """A client's minimal environment; ``switch`` is LIBVGPU_HOSTPID_BROKER (None: unset)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if switch is not None:
        env["LIBVGPU_HOSTPID_BROKER"] = switch
    return env


def parse_outcome(run: ClientRun) -> Outcome:
    """Turn a client's exit status and stdout into an :class:`Outcome`.

    Raises:
        AssertionError: the client did neither (crash, usage error, garbage output).
    """
    text = run.stdout.strip()
    if run.returncode == 0 and text.isdigit():
        return Outcome(int(text), None, run)
    if run.returncode == 1 and text.isidentifier():
        return Outcome(None, text, run)
    raise AssertionError(
        f"client misbehaved: rc={run.returncode} out={run.stdout!r} {run.stderr!r}"
    )


@dataclass(frozen=True)
class CClient:
    """The C reference client, ``hostpid-client``, run as uid 65534 through setpriv."""

    binary: Path
    name: str = "c"

    def run(
        self,
        box: Sandbox,
        *,
        socket: Path | None = None,
        deadline: float = 0.5,
        read_only: bool = True,
        switch: str | None = "1",
    ) -> Outcome:
        """Query once from inside ``box``; ``switch`` is LIBVGPU_HOSTPID_BROKER (None: unset)."""
        env = client_env(switch)
        argv = [str(self.binary), "--deadline", str(deadline), str(socket or box.client_socket)]
        return parse_outcome(run_in_sandbox(box, argv, read_only=read_only, env=env))


@dataclass(frozen=True)
class PyClient:
    """The Python client through ``hami-trio hostpid``, dropping to uid 65534 after imports."""

    name: str = "python"

    def run(
        self,
        box: Sandbox,
        *,
        socket: Path | None = None,
        deadline: float = 0.5,
        read_only: bool = True,
        switch: str | None = "1",
    ) -> Outcome:
        """Query once from inside ``box``; ``switch`` is LIBVGPU_HOSTPID_BROKER (None: unset)."""
        env = client_env(switch)
        argv = [
            sys.executable,
            str(PY_CHILD),
            "--socket-path",
            str(socket or box.client_socket),
            "--deadline",
            str(deadline),
        ]
        run = run_in_sandbox(box, argv, read_only=read_only, client_drops_itself=True, env=env)
        return parse_outcome(run)


#: Either client; both have ``name`` and the same ``run`` signature.
Client = CClient | PyClient
