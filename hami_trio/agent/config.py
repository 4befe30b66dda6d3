"""The agent's configuration: flags, environment fallbacks, one frozen :class:`AgentConfig`.

How this works: every setting is one row of :data:`SETTINGS`, a ``--flag`` and an
environment variable (HAMi's name where it has one, else ``HAMI_TRIO_<FLAG>``); a flag wins
over its variable, the variable over the default, and an empty variable counts as unset.  The
broker's switch is ``LIBVGPU_HOSTPID_BROKER`` alone, on only for exactly ``1``.
:func:`add_agent_arguments` puts the flags on a parser (every default ``None``, so "not
given" is visible); :func:`resolve_config` is pure and raises
:class:`~hami_trio.errors.ConfigError` naming the flag or variable and the value
(:func:`config_from_flags` is the same for callers without a command line);
:func:`check_host` checks that ``HOOK_PATH`` exists.  Warnings (an invalid
``HAMI_RESYNC_INTERVAL`` falls back to 5m, as in HAMi) are returned in
:attr:`AgentConfig.warnings`.  Every setting: docs/operations.md (Configuration).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import resource
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

from hami_trio.allocation.constants import LOCK_PARENT
from hami_trio.broker.boundary import DEFAULT_LOCK_PATH, DEFAULT_SOCKET_PATH
from hami_trio.broker.server import (
    DEFAULT_EXCHANGE_DEADLINE,
    DEFAULT_MAX_EXCHANGES,
    FD_RESERVE,
    BrokerConfig,
    exchanges_within,
)
from hami_trio.errors import ConfigError
from hami_trio.goparse import (
    BROKER_SWITCH_ENV,
    BindAddress,
    broker_switch_on,
    parse_bind_address,
    parse_go_duration,
    parse_seconds,
)
from hami_trio.http.server import DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT, HttpLimits
from hami_trio.logs import LogFormat
from hami_trio.metrics.pods import parse_label_allowlist
from hami_trio.monitor.loop import DEFAULT_INTERVAL, DEFAULT_RESYNC_INTERVAL, MonitorConfig
from hami_trio.monitor.miglock import DEFAULT_MIG_LOCK_PATH
from hami_trio.pods.access import KubeAccess, validate_node_name

__all__ = [
    "DEBUG_OFF",
    "DEFAULT_DEBUG_BIND_ADDRESS",
    "DEFAULT_METRICS_BIND_ADDRESS",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "SETTINGS",
    "SETTINGS_BY_NAME",
    "AgentConfig",
    "Setting",
    "add_agent_arguments",
    "check_host",
    "config_from_flags",
    "flag_argv",
    "resolve_config",
]

#: HAMi vGPUmonitor's metrics address: every interface, port 9394.
DEFAULT_METRICS_BIND_ADDRESS: Final = ":9394"
#: The debug view's address: the loopback interface only (host PIDs and file paths are not
#: for every pod to read); ``kubectl exec`` into the agent's pod reaches it.
DEFAULT_DEBUG_BIND_ADDRESS: Final = "127.0.0.1:9395"
#: The value of ``--debug-bind-address`` (or its variable) that turns the debug port off; an
#: empty flag does too (an empty variable counts as unset, like every variable).
DEBUG_OFF: Final = "off"
#: How long a graceful stop may take before what is left is cancelled (seconds).  Well within
#: the chart's 30 s termination grace period: the broker drains within its exchange deadline
#: (0.5 s) and a monitor tick within its interval (5 s).
DEFAULT_SHUTDOWN_TIMEOUT: Final = 10.0
_LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
# Go's strconv.ParseBool, which HAMi's components use for boolean variables.
_TRUE: Final = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "false", "FALSE", "False"})


def _positive_int(text: str, origin: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ConfigError(f"{origin}: {text!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{origin}: must be at least 1, got {text!r}")
    return value


def _seconds(text: str, origin: str) -> float:
    return parse_seconds(text, name=origin)


@dataclass(frozen=True, slots=True)
class Setting:
    """One configurable value: its flag, its environment variable and its help line.

    Attributes:
        dest: the argparse destination and the key in :attr:`AgentConfig.sources`.
        flag: the command-line flag.
        env: the environment variable read when the flag is not given.
        help: the help text (the default is appended).
        metavar: the value's placeholder in ``--help``; None for an on/off flag.
        broker: only ``hami-trio run`` has it (``monitor`` runs without the broker).
        parse: turns the text into the value, ``parse(text, origin)``, raising
            :class:`~hami_trio.errors.ConfigError` that names ``origin`` (the flag or
            variable) and the text; None: the setting has rules of its own in
            :func:`resolve_config`.
        default: the value when neither the flag nor the variable is given (with ``parse``).
    """

    dest: str
    flag: str
    env: str
    help: str
    metavar: str | None = "VALUE"
    broker: bool = False
    parse: Callable[[str, str], Any] | None = None
    default: Any = None

    def value(self, text: str | None, origin: str) -> Any:
        """``default`` for no text, else ``parse(text, origin)``.

        Raises:
            ConfigError: the text is not a valid value (named by ``origin``).
        """
        assert self.parse is not None, f"{self.dest} has no parser"
        return self.default if text is None else self.parse(text, origin)


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "hook_path",
        "--hook-path",
        "HOOK_PATH",
        "HAMi's hook directory; its containers/ holds one directory per vGPU container (required)",
        "DIR",
    ),
    Setting(
        "node_name",
        "--node-name",
        "NODE_NAME",
        "this node's name; scopes the pod watch (required with Kubernetes; without it the "
        "host metrics' node label, default the host name)",
        "NAME",
    ),
    Setting(
        "kubeconfig",
        "--kubeconfig",
        "KUBECONFIG",
        "kubeconfig of the pod watch (default: the in-cluster service account)",
        "PATH",
    ),
    Setting(
        "no_kubernetes",
        "--no-kubernetes",
        "HAMI_TRIO_NO_KUBERNETES",
        "no pod watch: every container directory is live under its pod UID and none is ever "
        "deleted",
        None,
    ),
    Setting(
        "resync_interval",
        "--resync-interval",
        "HAMI_RESYNC_INTERVAL",
        "Go duration a gone pod's container directory is kept before removal (default 5m; "
        "an invalid HAMI_RESYNC_INTERVAL is a warning and the default, as in HAMi)",
        "DURATION",
    ),
    Setting(
        "interval",
        "--interval",
        "HAMI_TRIO_INTERVAL",
        "seconds (or a Go duration) between monitor ticks (default 5)",
        "SECONDS",
        parse=_seconds,
        default=DEFAULT_INTERVAL,
    ),
    Setting(
        "mig_lock_path",
        "--mig-lock-path",
        "HAMI_TRIO_MIG_LOCK_PATH",
        f"MIG apply lock; the monitor pauses while it exists (default {DEFAULT_MIG_LOCK_PATH})",
        "PATH",
    ),
    Setting(
        "lock_parent_path",
        "--lock-parent-path",
        "HAMI_TRIO_LOCK_PARENT_PATH",
        "the workloads' shared lock parent as mounted into the agent; checked read-only every "
        "interval and exported as hami_trio_lock_parent_ok (missing is fine: not prepared yet) "
        f"(default {LOCK_PARENT})",
        "PATH",
    ),
    Setting(
        "prepare_lock_parent",
        "--prepare-lock-parent",
        "HAMI_TRIO_PREPARE_LOCK_PARENT",
        "prepare the lock parent once at start, like an allocation (root 01777; with the broker "
        "on the mount point hostpid root 0755 and immutable); needs it mounted writable and "
        "CAP_LINUX_IMMUTABLE, as the chart does with the broker on",
        None,
    ),
    Setting(
        "metrics_bind_address",
        "--metrics-bind-address",
        "HAMI_TRIO_METRICS_BIND_ADDRESS",
        "host:port of /metrics, /healthz and /readyz; ':9394' = every interface, port 0 = a "
        f"free port (default {DEFAULT_METRICS_BIND_ADDRESS})",
        "ADDR",
    ),
    Setting(
        "debug_bind_address",
        "--debug-bind-address",
        "HAMI_TRIO_DEBUG_BIND_ADDRESS",
        "host:port of the debug view (/debug/state, read by hami-trio status); keep it on the "
        f"loopback interface: it shows host PIDs and file paths; '{DEBUG_OFF}' (or an empty "
        f"flag) turns it off (default {DEFAULT_DEBUG_BIND_ADDRESS})",
        "ADDR",
    ),
    Setting(
        "metrics_max_connections",
        "--metrics-max-connections",
        "HAMI_TRIO_METRICS_MAX_CONNECTIONS",
        "connections the metrics port serves at once; one more closes the one waiting on its "
        f"client the longest (default {DEFAULT_MAX_CONNECTIONS})",
        "N",
        parse=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
    ),
    Setting(
        "metrics_request_timeout",
        "--metrics-request-timeout",
        "HAMI_TRIO_METRICS_REQUEST_TIMEOUT",
        "seconds (or a Go duration) from a metrics-port request's first byte to the last byte "
        f"of its answer; a client slower than that is closed (default {DEFAULT_REQUEST_TIMEOUT:g})",
        "SECONDS",
        parse=_seconds,
        default=DEFAULT_REQUEST_TIMEOUT,
    ),
    Setting(
        "legacy_metrics",
        "--legacy-metrics",
        "HAMI_TRIO_LEGACY_METRICS",
        "also export HAMi's legacy metric names (vGPU_device_memory_usage_in_bytes, ...)",
        None,
    ),
    Setting(
        "pod_labels_allowlist",
        "--pod-labels-allowlist",
        "HAMI_TRIO_POD_LABELS_ALLOWLIST",
        "comma-separated pod label keys exported as label_<key> on hami_trio_pod_labels, for "
        "joins (e.g. team,app; at most 32; default none)",
        "KEYS",
    ),
    Setting(
        "exclude_exited_processes",
        "--exclude-exited-processes",
        "HAMI_TRIO_EXCLUDE_EXITED_PROCESSES",
        "leave process slots whose host PID no longer exists out of the exported memory and "
        "utilisation sums (upstream keeps them: usage stuck at its peak); needs the host PID "
        "namespace, where the agent runs in the chart",
        None,
    ),
    Setting(
        "broker_socket_path",
        "--broker-socket-path",
        "HAMI_TRIO_BROKER_SOCKET_PATH",
        f"Unix socket of the host PID broker (default {DEFAULT_SOCKET_PATH}, which needs "
        f"root); the broker runs only when {BROKER_SWITCH_ENV}=1",
        "PATH",
        broker=True,
    ),
    Setting(
        "broker_lock_path",
        "--broker-lock-path",
        "HAMI_TRIO_BROKER_LOCK_PATH",
        "lock file that keeps a second broker from starting; never in, below or above the "
        "socket's directory, which workloads mount (default: beside it, "
        f"<socket dir>-lock/broker.lock, i.e. {DEFAULT_LOCK_PATH})",
        "PATH",
        broker=True,
    ),
    Setting(
        "broker_max_exchanges",
        "--broker-max-exchanges",
        "HAMI_TRIO_BROKER_MAX_EXCHANGES",
        "broker exchanges that may wait for their request at once; more are closed at once "
        f"(default {DEFAULT_MAX_EXCHANGES})",
        "N",
        broker=True,
        parse=_positive_int,
        default=DEFAULT_MAX_EXCHANGES,
    ),
    Setting(
        "broker_exchange_deadline",
        "--broker-exchange-deadline",
        "HAMI_TRIO_BROKER_EXCHANGE_DEADLINE",
        "total time of one broker exchange, seconds or a Go duration such as 500ms "
        f"(default {DEFAULT_EXCHANGE_DEADLINE})",
        "SECONDS",
        broker=True,
        parse=_seconds,
        default=DEFAULT_EXCHANGE_DEADLINE,
    ),
    Setting(
        "shutdown_timeout",
        "--shutdown-timeout",
        "HAMI_TRIO_SHUTDOWN_TIMEOUT",
        "after SIGTERM, how long the graceful drain may take before the rest is cancelled "
        f"(default {DEFAULT_SHUTDOWN_TIMEOUT:g})",
        "SECONDS",
        parse=_seconds,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
    ),
    Setting(
        "log_format",
        "--log-format",
        "HAMI_TRIO_LOG_FORMAT",
        "text (one line per event) or json (one JSON object per line) (default text)",
        "FORMAT",
    ),
    Setting(
        "log_level",
        "--log-level",
        "HAMI_TRIO_LOG_LEVEL",
        "debug, info, warning, error or critical (default info)",
        "LEVEL",
    ),
)
_BY_DEST: Final = {setting.dest: setting for setting in SETTINGS}
#: Every setting by its name (:attr:`Setting.dest`).
SETTINGS_BY_NAME: Final[Mapping[str, Setting]] = MappingProxyType(_BY_DEST)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything ``hami-trio run`` runs with; build it with :func:`resolve_config`.

    Attributes:
        monitor: the monitor's settings (hook path, interval, resync interval, MIG lock).
        lock_parent_path: the shared lock parent the agent checks (read-only).
        prepare_lock_parent: prepare it once at start (``--prepare-lock-parent``).
        node_name: this node (validated when ``kubernetes`` is set; else only a label).
        kubernetes: how to reach the API server for the pod watch; None: ``--no-kubernetes``.
        metrics_bind: where ``/metrics``, ``/healthz`` and ``/readyz`` listen.
        debug_bind: where the debug view listens; None: off.
        http_limits: what one client of that port may cost (connections, deadlines).
        legacy_metrics: also export HAMi's legacy names.
        pod_labels_allowlist: pod label keys exported on ``hami_trio_pod_labels``.
        broker: the broker's settings; None when it is off (``LIBVGPU_HOSTPID_BROKER`` is not
            exactly ``1``).
        shutdown_timeout: seconds the graceful drain may take.
        log_format: ``text`` or ``json``.
        log_level: a :mod:`logging` level name, lower case.
        warnings: what the operator should hear about once logging is set up.
        sources: where each setting came from: a flag, a variable or ``default``.
        broker_clamp: ``(max_exchanges asked for, hard descriptor limit)`` when the broker's
            slots were clamped to that limit (:func:`~hami_trio.broker.server.exchanges_within`);
            None otherwise.
    """

    monitor: MonitorConfig
    node_name: str
    kubernetes: KubeAccess | None
    lock_parent_path: Path = Path(LOCK_PARENT)
    prepare_lock_parent: bool = False
    metrics_bind: BindAddress = field(
        default_factory=lambda: parse_bind_address(DEFAULT_METRICS_BIND_ADDRESS)
    )
    debug_bind: BindAddress | None = field(
        default_factory=lambda: parse_bind_address(DEFAULT_DEBUG_BIND_ADDRESS)
    )
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    legacy_metrics: bool = False
    pod_labels_allowlist: tuple[str, ...] = ()
    broker: BrokerConfig | None = None
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    log_format: LogFormat = "text"
    log_level: str = "info"
    warnings: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    broker_clamp: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """The resolved configuration as ``hami-trio run --print-config`` prints it.

        Holds no secret: the Kubernetes access is described by the kubeconfig path or the
        in-cluster address, never a token.
        """
        kubernetes: dict[str, str] | None = None
        if self.kubernetes is not None:
            if self.kubernetes.kubeconfig is not None:
                kubernetes = {"kubeconfig": self.kubernetes.kubeconfig}
            else:
                kubernetes = {
                    "in_cluster": f"https://{self.kubernetes.service_host}:"
                    f"{self.kubernetes.service_port}",
                    "token_path": self.kubernetes.token_path,
                    "ca_path": self.kubernetes.ca_path,
                }
        broker: dict[str, Any] = {"enabled": self.broker is not None}
        if self.broker is not None:
            broker |= {
                "socket_path": str(self.broker.socket_path),
                "lock_path": str(self.broker.resolved_lock_path),
                "max_exchanges": self.broker.max_exchanges,
                "exchange_deadline_seconds": self.broker.exchange_deadline,
            }
            if self.broker_clamp is not None:
                requested, limit = self.broker_clamp
                broker["max_exchanges_clamped"] = {"requested": requested, "fd_limit": limit}
        return {
            "hook_path": str(self.monitor.hook_path),
            "node_name": self.node_name,
            "kubernetes": kubernetes,
            "resync_interval_seconds": self.monitor.resync_interval,
            "interval_seconds": self.monitor.interval,
            "mig_lock_path": str(self.monitor.mig_lock_path),
            "exclude_exited_processes": self.monitor.exclude_exited_processes,
            "lock_parent_path": str(self.lock_parent_path),
            "prepare_lock_parent": self.prepare_lock_parent,
            "metrics_bind_address": str(self.metrics_bind),
            "debug_bind_address": None if self.debug_bind is None else str(self.debug_bind),
            "metrics_max_connections": self.http_limits.max_connections,
            "metrics_request_timeout_seconds": self.http_limits.request_timeout,
            "legacy_metrics": self.legacy_metrics,
            "pod_labels_allowlist": list(self.pod_labels_allowlist),
            "broker": broker,
            "shutdown_timeout_seconds": self.shutdown_timeout,
            "log_format": self.log_format,
            "log_level": self.log_level,
            "sources": dict(self.sources),
            "warnings": list(self.warnings),
        }


def add_agent_arguments(parser: argparse.ArgumentParser, *, broker: bool = True) -> None:
    """Add every setting's flag to ``parser`` (defaults ``None``: "not given").

    Args:
        parser: the subcommand's parser.
        broker: include the ``--broker-*`` flags (``run`` does, ``monitor`` does not).
    """
    for setting in SETTINGS:
        if setting.broker and not broker:
            continue
        help_text = f"{setting.help} [env {setting.env}]"
        if setting.metavar is None:
            parser.add_argument(
                setting.flag, dest=setting.dest, action="store_true", default=None, help=help_text
            )
        else:
            parser.add_argument(
                setting.flag, dest=setting.dest, metavar=setting.metavar, help=help_text
            )


class _Reader:
    """Looks a setting up: the flag, else its variable, else nothing (and remembers which)."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str]) -> None:
        self._args = args
        self._env = env
        self.sources: dict[str, str] = {}

    def text(self, dest: str) -> tuple[str | None, str]:
        """The raw text and where it came from (the flag, the variable, or ``default``)."""
        setting = _BY_DEST[dest]
        value = getattr(self._args, dest, None)
        if value is not None:
            origin = setting.flag
            text: str | None = value if isinstance(value, str) else str(value)
        elif self._env.get(setting.env):
            origin, text = setting.env, self._env[setting.env]
        else:
            origin, text = "default", None
        self.sources[dest] = origin
        return text, origin

    def value(self, dest: str) -> Any:
        """A setting with a parser: its value (:meth:`Setting.value`)."""
        text, origin = self.text(dest)
        return _BY_DEST[dest].value(text, origin)

    def flag(self, dest: str) -> bool:
        """An on/off setting: the flag, else the variable as Go's ParseBool reads it."""
        setting = _BY_DEST[dest]
        if getattr(self._args, dest, None):
            self.sources[dest] = setting.flag
            return True
        text = self._env.get(setting.env)
        if not text:
            self.sources[dest] = "default"
            return False
        self.sources[dest] = setting.env
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{setting.env}: {text!r} is not a boolean (use true or false)")


def _resync_interval(reader: _Reader, warnings: list[str]) -> float:
    text, origin = reader.text("resync_interval")
    if text is None:
        return DEFAULT_RESYNC_INTERVAL
    try:
        value = parse_go_duration(text, name=origin)
        if value < 0:
            raise ConfigError(f"{origin}: negative duration {text!r}")
    except ConfigError as exc:
        if origin == "--resync-interval":
            raise  # a new flag: no compatibility to keep, an error like every other flag
        # HAMi's rule for its variable: warn and use the default.
        warnings.append(f"{exc}; using the default {DEFAULT_RESYNC_INTERVAL:g}s")
        reader.sources["resync_interval"] = "default"
        return DEFAULT_RESYNC_INTERVAL
    return value


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" (every interface) or a host name


def _debug_bind(reader: _Reader, warnings: list[str]) -> BindAddress | None:
    text, origin = reader.text("debug_bind_address")
    if text is None:
        return parse_bind_address(DEFAULT_DEBUG_BIND_ADDRESS)
    if text in ("", DEBUG_OFF):
        return None
    bind = parse_bind_address(text, name=origin)
    if not _loopback(bind.host):
        warnings.append(
            f"{origin}={text!r} is not a loopback address: whoever reaches it reads every "
            "container's host PIDs and file paths (keep it on 127.0.0.1 unless a firewall "
            "guards it)"
        )
    return bind


def _hard_fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def _broker(
    reader: _Reader, env: Mapping[str, str], warnings: list[str], fd_limit: Callable[[], int]
) -> tuple[BrokerConfig | None, tuple[int, int] | None]:
    switch = env.get(BROKER_SWITCH_ENV)
    reader.sources["broker"] = BROKER_SWITCH_ENV if switch else "default"
    socket_text, socket_origin = reader.text("broker_socket_path")
    lock_text, lock_origin = reader.text("broker_lock_path")
    # Parsed even when the broker is off, so a typo does not wait for the day it is enabled.
    max_exchanges: int = reader.value("broker_max_exchanges")
    max_origin = reader.sources["broker_max_exchanges"]
    deadline: float = reader.value("broker_exchange_deadline")
    if not broker_switch_on(switch):
        if switch:  # set, but not to exactly "1"
            warnings.append(
                f"{BROKER_SWITCH_ENV}={switch!r} is not exactly '1': the host PID broker is off"
            )
        return None, None
    if socket_text == "":
        raise ConfigError(f"{socket_origin}: empty path")
    if lock_text == "":
        raise ConfigError(f"{lock_origin}: empty path")
    # Every slot holds a descriptor: more slots than the limit leaves room for would let a
    # connection flood take the monitor's and the metrics port's descriptors.
    clamp = None
    limit = fd_limit()
    slots = exchanges_within(max_exchanges, limit)
    if slots < max_exchanges:
        clamp = (max_exchanges, limit)
        warnings.append(
            f"the broker's max_exchanges ({max_origin}) is clamped from {max_exchanges} to "
            f"{slots}: the hard descriptor limit {limit} (RLIMIT_NOFILE) "
            f"keeps {FD_RESERVE} for the monitor, the metrics port and the rest of the agent; "
            f"raise it to at least {max_exchanges + FD_RESERVE} for every slot"
        )
    broker = BrokerConfig(
        socket_path=DEFAULT_SOCKET_PATH if socket_text is None else Path(socket_text),
        lock_path=None if lock_text is None else Path(lock_text),
        max_exchanges=slots,
        exchange_deadline=deadline,
    )
    return broker, clamp


def resolve_config(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    with_broker: bool = True,
    hostname: Callable[[], str] = socket.gethostname,
    fd_limit: Callable[[], int] = _hard_fd_limit,
) -> AgentConfig:
    """Resolve flags, environment and defaults into an :class:`AgentConfig` (pure).

    Args:
        args: the parsed flags (:func:`add_agent_arguments`); missing attributes count as
            not given.
        env: the environment (``os.environ``).
        with_broker: False for ``hami-trio monitor``: the broker stays off whatever
            ``LIBVGPU_HOSTPID_BROKER`` says.
        hostname: the host name, the node label when ``NODE_NAME`` is unset without Kubernetes.
        fd_limit: the hard ``RLIMIT_NOFILE`` (``resource.RLIM_INFINITY``: unlimited), which
            the broker's slots are clamped to (asked only with the broker on).

    Returns:
        The configuration, with :attr:`AgentConfig.warnings` to log.

    Raises:
        ConfigError: a value that cannot be used; the message names the flag or variable and
            the value (the CLI exits 2).
        PodSourceError: Kubernetes is on but no API configuration is available (no
            kubeconfig, no in-cluster service account); the CLI exits 1.
    """
    reader = _Reader(args, env)
    warnings: list[str] = []

    hook_text, _ = reader.text("hook_path")
    if not hook_text:
        raise ConfigError(
            "HOOK_PATH is not set: set it (or --hook-path) to the HAMi hook directory, e.g. "
            "/usr/local/vgpu, whose containers/ holds the .cache files"
        )
    interval: float = reader.value("interval")
    lock_text, lock_origin = reader.text("mig_lock_path")
    if lock_text == "":
        raise ConfigError(f"{lock_origin}: empty path")
    exclude_exited = reader.flag("exclude_exited_processes")
    monitor = MonitorConfig(
        hook_path=Path(hook_text),
        exclude_exited_processes=exclude_exited,
        interval=interval,
        resync_interval=_resync_interval(reader, warnings),
        mig_lock_path=DEFAULT_MIG_LOCK_PATH if lock_text is None else Path(lock_text),
    )

    parent_text, parent_origin = reader.text("lock_parent_path")
    if parent_text == "":
        raise ConfigError(f"{parent_origin}: empty path")
    if parent_text is not None and not parent_text.startswith("/"):
        raise ConfigError(f"{parent_origin}: {parent_text!r} is not an absolute path")
    prepare_parent = reader.flag("prepare_lock_parent")

    bind_text, bind_origin = reader.text("metrics_bind_address")
    bind = parse_bind_address(
        DEFAULT_METRICS_BIND_ADDRESS if bind_text is None else bind_text, name=bind_origin
    )
    debug_bind = _debug_bind(reader, warnings)
    http_limits = HttpLimits(
        max_connections=reader.value("metrics_max_connections"),
        request_timeout=reader.value("metrics_request_timeout"),
    )
    legacy = reader.flag("legacy_metrics")
    allowlist_text, allowlist_origin = reader.text("pod_labels_allowlist")
    try:
        allowlist = parse_label_allowlist(allowlist_text or "", name=allowlist_origin)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    broker, clamp = _broker(reader, env, warnings, fd_limit) if with_broker else (None, None)

    shutdown_timeout: float = reader.value("shutdown_timeout")
    format_text, format_origin = reader.text("log_format")
    log_format: Literal["text", "json"] = "text"
    if format_text is not None:
        if format_text not in ("text", "json"):
            raise ConfigError(f"{format_origin}: {format_text!r} is not text or json")
        log_format = "json" if format_text == "json" else "text"
    level_text, level_origin = reader.text("log_level")
    log_level = "info" if level_text is None else level_text.lower()
    if log_level not in _LOG_LEVELS:
        raise ConfigError(
            f"{level_origin}: unknown log level {level_text!r} (use {', '.join(_LOG_LEVELS)})"
        )
    # Last: every value error (exit 2) is reported before a missing API configuration
    # (PodSourceError, exit 1), whatever the order of the flags.
    kubernetes_off = reader.flag("no_kubernetes")
    node_text, node_origin = reader.text("node_name")
    kubeconfig, _ = reader.text("kubeconfig")
    access: KubeAccess | None = None
    if kubernetes_off:
        node_name = node_text or hostname()
        if not node_text:
            reader.sources["node_name"] = "host name"
    else:
        node_name = validate_node_name(
            node_text or "", source="NODE_NAME" if node_origin == "default" else node_origin
        )
        # The flag wins; KubeAccess reads $KUBECONFIG, then the in-cluster variables.
        access = KubeAccess.from_env(env, kubeconfig=kubeconfig)
    return AgentConfig(
        monitor=monitor,
        node_name=node_name,
        kubernetes=access,
        lock_parent_path=Path(LOCK_PARENT if parent_text is None else parent_text),
        prepare_lock_parent=prepare_parent,
        metrics_bind=bind,
        debug_bind=debug_bind,
        http_limits=http_limits,
        legacy_metrics=legacy,
        pod_labels_allowlist=allowlist,
        broker=broker,
        shutdown_timeout=shutdown_timeout,
        log_format=log_format,
        log_level=log_level,
        warnings=tuple(warnings),
        sources=MappingProxyType(dict(reader.sources)),
        broker_clamp=clamp,
    )


def config_from_flags(
    flags: Mapping[str, str | bool],
    env: Mapping[str, str],
    *,
    with_broker: bool = True,
    hostname: Callable[[], str] = socket.gethostname,
) -> AgentConfig:
    """:func:`resolve_config` for callers without a command line (the demo).

    ``flags`` maps a setting's name (``hook_path``, ``no_kubernetes``, ...) to the value its
    flag would carry (text, or True for an on/off flag); the rules are exactly those of the
    command line, and :func:`flag_argv` gives the equivalent arguments.

    Raises:
        ConfigError: a name that is not a setting, or what :func:`resolve_config` raises.
    """
    unknown = sorted(set(flags) - set(_BY_DEST))
    if unknown:
        raise ConfigError(f"not a setting: {', '.join(unknown)}")
    return resolve_config(
        argparse.Namespace(**flags), env, with_broker=with_broker, hostname=hostname
    )


def flag_argv(flags: Mapping[str, str | bool]) -> list[str]:
    """The command-line arguments that :func:`config_from_flags` ``flags`` stand for."""
    argv: list[str] = []
    for dest, value in flags.items():
        setting = _BY_DEST[dest]
        if value is True:
            argv.append(setting.flag)
        elif value is not False:
            argv += [setting.flag, str(value)]
    return argv


def check_host(config: AgentConfig) -> None:
    """Check what :func:`resolve_config` cannot without the filesystem.

    Raises:
        ConfigError: the hook directory does not exist or is not a directory (named by the
            flag or variable it came from).
    """
    hook = config.monitor.hook_path
    if not os.path.isdir(hook):
        origin = config.sources.get("hook_path", "HOOK_PATH")
        raise ConfigError(f"{origin}={str(hook)!r} does not exist or is not a directory")
