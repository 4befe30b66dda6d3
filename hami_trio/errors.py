"""The exceptions hami-trio raises, in one small flat hierarchy.

Every class says who raises it and what the operator (or the calling code) should do.
Low-level causes (``OSError`` and friends) are chained with ``raise ... from exc`` so the
original errno survives in ``__cause__``.  Expected, tenant-driven failures (a malformed
``.cache`` file, a bad request on the broker socket) are values or typed errors that the
caller handles per item; they never take the agent down.
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "BrokerError",
    "BrokerStartupError",
    "CacheFileRejected",
    "ConfigError",
    "DemoError",
    "HamiTrioError",
    "HttpServerError",
    "LockDirError",
    "PodSourceError",
]


class HamiTrioError(Exception):
    """Base class of every error hami-trio raises on purpose.

    Catch this only at a process boundary (the CLI turns it into one line and a non-zero
    exit); inside the agent, catch the specific subclass you can handle.
    """


class ConfigError(HamiTrioError, ValueError):
    """A flag, environment variable or argument has a value we cannot use.

    Raised at start-up by the configuration parsers.  The message names the flag or variable
    and the offending value; the CLI exits 2.  Operator: fix the value and restart.
    """


class BrokerError(HamiTrioError):
    """The host PID broker failed after it started (for example a fatal accept error).

    Raised out of the broker's task; in the agent it cancels every other task and the process
    exits non-zero so Kubernetes restarts it.  Operator: read the cause.
    """


class BrokerStartupError(BrokerError):
    """The broker refused to start: its directory, lock file or socket path is unsafe or taken.

    Raised before the broker reports ready.  The message names the path and the reason (a
    symlink, wrong owner, a live socket of another broker, ...).  Operator: fix the path or stop
    the other broker; nothing was created or removed that the broker does not own.
    """


class ForeignBrokerError(BrokerStartupError):
    """Another broker serves the socket path: it answers there, or it holds the lock.

    Raised before the broker reports ready; during a cut-over from HAMi that is HAMi's own
    broker in its device plugin.  The agent does not fail on it: it runs without its broker,
    says so (log, ``hami_trio_broker_foreign_listener``, ``hami-trio status``) and takes the
    path over once the other broker is gone.  Operator: switch the other broker off.
    """


class LockDirError(HamiTrioError):
    """The shared lock parent (``/tmp/vgpulock``) could not be prepared safely.

    Raised by the allocation integration; the device plugin must fail that allocation rather
    than return an unsafe mount.  The message names the path and the reason.
    """


class PodSourceError(HamiTrioError):
    """The Kubernetes pod source cannot be configured (no kubeconfig, no service account).

    Raised at start-up.  Transient API errors after start-up are retried with backoff and do
    not raise.  Operator: check ``NODE_NAME``, ``KUBECONFIG`` or the in-cluster service account.
    """


class CacheFileRejected(HamiTrioError):
    """A ``.cache`` file was rejected for a reason the monitor counts and reports.

    Raised per file by the monitor's loader and region reader.  ``reason`` is a short
    machine-readable token (``too_small``, ``magic``, ``unknown_version``, ``not_regular_file``,
    ``hard_link``, ``replaced``, ``truncated``, ``io_error``, ``too_many_files``) used as the
    ``reason`` label of ``hami_trio_monitor_files_rejected_total``; the message is for humans
    and names the file, the size and the values found.  Routine and never fatal: the monitor
    skips that container until its file loads again.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class HttpServerError(HamiTrioError):
    """The metrics and health endpoint cannot listen on ``--metrics-bind-address``.

    Raised at start-up, before the endpoint reports ready: the address is in use, not local,
    needs privileges, or its host does not resolve.  Operator: pick a free address or stop the
    other process; the agent exits 1.
    """


class AgentError(HamiTrioError):
    """A task of the agent (``hami-trio run``) failed, and with it the whole agent.

    Raised by :func:`hami_trio.agent.service.serve_agent` when a task fails after the agent started
    (the broker's accept loop, the monitor, the pod watch, the metrics endpoint, ...), or
    fails to start with an error that is not already a :class:`HamiTrioError`.  Every other
    task has been cancelled and cleaned up (the broker's socket removed) before it is raised.
    ``task`` names the task, ``started`` says whether it had reported ready, and the task's
    own exception is the ``__cause__``.  Operator: read the cause; Kubernetes restarts the
    agent (its exit status is 1).
    """

    def __init__(self, task: str, message: str, *, started: bool) -> None:
        super().__init__(message)
        self.task = task
        self.started = started


class DemoError(HamiTrioError):
    """The local demo (``hami-trio demo``) could not run: a workload failed to start or
    attach, or its sandbox could not be built.

    Raised by :mod:`hami_trio.demo` before or while the workloads start; the message names the
    workload and the reason (its log file holds the details).  User: run the demo as root, or
    enable unprivileged user namespaces, or read the workload's log.
    """
