"""resolve_config: flags, environment fallbacks and defaults -> AgentConfig, without processes."""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path
from typing import Any

import pytest

from hami_trio.agent.config import (
    SETTINGS,
    AgentConfig,
    add_agent_arguments,
    check_host,
    resolve_config,
)
from hami_trio.broker.boundary import DEFAULT_LOCK_PATH, DEFAULT_SOCKET_PATH
from hami_trio.broker.server import FD_RESERVE, BrokerConfig
from hami_trio.cli.main import build_parser, main
from hami_trio.errors import ConfigError, PodSourceError
from hami_trio.goparse import BindAddress

HOOK = {"HOOK_PATH": "/hook"}


def parse(*argv: str, broker: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser, broker=broker)
    return parser.parse_args(argv)


def resolve(*argv: str, env: dict[str, str] | None = None, **kwargs: Any) -> AgentConfig:
    return resolve_config(parse(*argv), HOOK | (env or {}), hostname=lambda: "host-a", **kwargs)


def test_defaults_without_kubernetes() -> None:
    config = resolve("--no-kubernetes")
    assert config.monitor.hook_path == Path("/hook")
    assert config.monitor.interval == 5.0
    assert config.monitor.resync_interval == 300.0
    assert config.monitor.mig_lock_path == Path("/tmp/hami/hami-mig-apply.lock")
    assert config.node_name == "host-a"
    assert config.kubernetes is None
    assert config.metrics_bind == BindAddress("", 9394)
    assert config.http_limits.max_connections == 64
    assert config.http_limits.request_timeout == 10.0
    assert config.legacy_metrics is False
    assert config.prepare_lock_parent is False
    assert config.broker is None
    assert config.shutdown_timeout == 10.0
    assert (config.log_format, config.log_level) == ("text", "info")
    assert config.warnings == ()
    assert config.sources["hook_path"] == "HOOK_PATH"
    assert config.sources["node_name"] == "host name"
    assert config.sources["interval"] == "default"


def test_every_setting_reads_its_flag_then_its_variable() -> None:
    values = {
        "hook_path": "/h",
        "node_name": "node-b",
        "kubeconfig": "/kc",
        "resync_interval": "90s",
        "interval": "250ms",
        "mig_lock_path": "/m/lock",
        "lock_parent_path": "/l/vgpulock",
        "prepare_lock_parent": "true",
        "metrics_bind_address": "127.0.0.1:0",
        "debug_bind_address": "[::1]:9500",
        "metrics_max_connections": "16",
        "metrics_request_timeout": "1500ms",
        "broker_socket_path": "/b/broker.sock",
        "broker_lock_path": "/l/broker.lock",
        "broker_max_exchanges": "64",
        "broker_exchange_deadline": "2",
        "shutdown_timeout": "3s",
        "log_format": "json",
        "log_level": "DEBUG",
        "no_kubernetes": "true",
        "legacy_metrics": "true",
        "pod_labels_allowlist": "team, app.kubernetes.io/name,team",
        "exclude_exited_processes": "true",
    }

    def check(config: AgentConfig) -> None:
        assert config.monitor.hook_path == Path("/h")
        assert config.node_name == "node-b"
        assert config.kubernetes is None  # --no-kubernetes wins over the kubeconfig
        assert config.monitor.resync_interval == 90.0
        assert config.monitor.interval == 0.25
        assert config.monitor.mig_lock_path == Path("/m/lock")
        assert config.lock_parent_path == Path("/l/vgpulock")
        assert config.prepare_lock_parent is True
        assert config.metrics_bind == BindAddress("127.0.0.1", 0)
        assert config.debug_bind == BindAddress("::1", 9500)
        assert config.http_limits.max_connections == 16
        assert config.http_limits.request_timeout == 1.5
        assert config.broker is not None
        assert config.broker.socket_path == Path("/b/broker.sock")
        assert config.broker.lock_path == Path("/l/broker.lock")
        assert config.broker.max_exchanges == 64
        assert config.broker.exchange_deadline == 2.0
        assert config.shutdown_timeout == 3.0
        assert (config.log_format, config.log_level) == ("json", "debug")
        assert config.legacy_metrics is True
        assert config.pod_labels_allowlist == ("team", "app.kubernetes.io/name")
        assert config.monitor.exclude_exited_processes is True

    switch = {"LIBVGPU_HOSTPID_BROKER": "1"}
    argv = []
    for setting in SETTINGS:
        value = values[setting.dest]
        argv.append(setting.flag if setting.metavar is None else f"{setting.flag}={value}")
    from_flags = resolve_config(parse(*argv), switch)
    check(from_flags)
    assert all(from_flags.sources[s.dest] == s.flag for s in SETTINGS)

    env = switch | {setting.env: values[setting.dest] for setting in SETTINGS}
    from_env = resolve_config(parse(), env)
    check(from_env)
    assert all(from_env.sources[s.dest] == s.env for s in SETTINGS)


def test_a_flag_wins_over_its_variable() -> None:
    config = resolve(
        "--no-kubernetes",
        "--hook-path=/flag",
        "--interval=2",
        env={"HAMI_TRIO_INTERVAL": "9", "HAMI_TRIO_LOG_LEVEL": "error"},
    )
    assert config.monitor.hook_path == Path("/flag")
    assert config.monitor.interval == 2.0
    assert config.log_level == "error"
    assert config.sources["interval"] == "--interval"
    assert config.sources["log_level"] == "HAMI_TRIO_LOG_LEVEL"


def test_hami_names_are_honoured() -> None:
    config = resolve(
        env={
            "NODE_NAME": "gpu-node-1",
            "KUBECONFIG": "/etc/kubeconfig",
            "HAMI_RESYNC_INTERVAL": "1h30m",
            "LIBVGPU_HOSTPID_BROKER": "1",
        }
    )
    assert config.node_name == "gpu-node-1"
    assert config.kubernetes is not None
    assert config.kubernetes.kubeconfig == "/etc/kubeconfig"
    assert config.monitor.resync_interval == 5400.0
    assert config.broker is not None
    assert config.broker.socket_path == DEFAULT_SOCKET_PATH
    assert config.broker.lock_path is None  # derived: beside the socket's directory
    assert config.broker.resolved_lock_path == DEFAULT_LOCK_PATH


def test_in_cluster_access_when_no_kubeconfig() -> None:
    config = resolve(
        env={
            "NODE_NAME": "n1",
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
        }
    )
    assert config.kubernetes is not None
    assert config.kubernetes.describe() == "in-cluster https://10.0.0.1:443"
    assert config.to_json()["kubernetes"]["in_cluster"] == "https://10.0.0.1:443"


@pytest.mark.parametrize("switch", ["true", " 1", "01", "yes", "0", ""])
def test_the_broker_is_on_only_for_exactly_1(switch: str) -> None:
    config = resolve("--no-kubernetes", env={"LIBVGPU_HOSTPID_BROKER": switch})
    assert config.broker is None
    if switch:
        assert config.warnings == (
            f"LIBVGPU_HOSTPID_BROKER={switch!r} is not exactly '1': the host PID broker is off",
        )
    else:
        assert config.warnings == ()


def test_broker_slots_are_clamped_to_the_descriptor_limit() -> None:
    on = {"LIBVGPU_HOSTPID_BROKER": "1"}
    config = resolve("--no-kubernetes", env=on, fd_limit=lambda: 512)
    assert config.broker is not None
    assert config.broker.max_exchanges == 512 - FD_RESERVE
    (warning,) = config.warnings
    assert warning == (
        "the broker's max_exchanges (default) is clamped from 4096 to 256: the hard descriptor "
        "limit 512 (RLIMIT_NOFILE) keeps 256 for the monitor, the metrics port and the rest of "
        "the agent; raise it to at least 4352 for every slot"
    )
    doc = config.to_json()
    assert doc["broker"]["max_exchanges"] == 256
    assert doc["broker"]["max_exchanges_clamped"] == {"requested": 4096, "fd_limit": 512}
    assert doc["warnings"] == [warning]
    # What fits is left alone; so is an unlimited hard limit.
    fits = resolve("--no-kubernetes", "--broker-max-exchanges=200", env=on, fd_limit=lambda: 512)
    assert fits.broker is not None
    assert fits.broker.max_exchanges == 200
    assert (fits.warnings, fits.broker_clamp) == ((), None)
    assert "max_exchanges_clamped" not in fits.to_json()["broker"]
    unlimited = resolve("--no-kubernetes", env=on, fd_limit=lambda: resource.RLIM_INFINITY)
    assert unlimited.broker is not None
    assert unlimited.broker.max_exchanges == 4096
    # A limit below the reserve still leaves the broker one slot.
    assert resolve("--no-kubernetes", env=on, fd_limit=lambda: 100).broker == BrokerConfig(
        max_exchanges=1
    )

    def never() -> int:
        raise AssertionError("the limit is asked only with the broker on")

    assert resolve("--no-kubernetes", fd_limit=never).broker is None


def test_monitor_command_never_runs_the_broker() -> None:
    args = parse("--no-kubernetes", broker=False)
    assert not hasattr(args, "broker_socket_path")
    config = resolve_config(args, HOOK | {"LIBVGPU_HOSTPID_BROKER": "1"}, with_broker=False)
    assert config.broker is None
    assert config.warnings == ()


@pytest.mark.parametrize("value", ["bogus", "-5m", "5"])
def test_invalid_hami_resync_interval_warns_and_uses_5m(value: str) -> None:
    config = resolve("--no-kubernetes", env={"HAMI_RESYNC_INTERVAL": value})
    assert config.monitor.resync_interval == 300.0
    (warning,) = config.warnings
    assert warning.startswith("HAMI_RESYNC_INTERVAL: ")
    assert repr(value) in warning
    assert warning.endswith("using the default 300s")
    assert config.sources["resync_interval"] == "default"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--resync-interval=5 minutes"], {}, "--resync-interval: invalid duration '5 minutes'"),
        (["--resync-interval=-1m"], {}, "--resync-interval: negative duration '-1m'"),
        (["--interval=0"], {}, "--interval must be a positive duration, got '0'"),
        ([], {"HAMI_TRIO_INTERVAL": "soon"}, "HAMI_TRIO_INTERVAL: invalid duration 'soon'"),
        (["--interval=inf"], {}, "--interval must be a positive duration, got 'inf'"),
        (["--metrics-bind-address=9394"], {}, "--metrics-bind-address: '9394' has no port"),
        (
            [],
            {"HAMI_TRIO_METRICS_BIND_ADDRESS": ":99999"},
            "HAMI_TRIO_METRICS_BIND_ADDRESS: ':99999' has an invalid port",
        ),
        (["--broker-max-exchanges=many"], {}, "--broker-max-exchanges: 'many' is not an integer"),
        (["--broker-max-exchanges=0"], {}, "--broker-max-exchanges: must be at least 1, got '0'"),
        (
            [],
            {"HAMI_TRIO_BROKER_EXCHANGE_DEADLINE": "-1s"},
            "HAMI_TRIO_BROKER_EXCHANGE_DEADLINE must be a positive duration, got '-1s'",
        ),
        (["--broker-socket-path="], {"LIBVGPU_HOSTPID_BROKER": "1"}, "--broker-socket-path: empty"),
        (["--broker-lock-path="], {"LIBVGPU_HOSTPID_BROKER": "1"}, "--broker-lock-path: empty"),
        (["--shutdown-timeout=0s"], {}, "--shutdown-timeout must be a positive duration"),
        (["--log-format=xml"], {}, "--log-format: 'xml' is not text or json"),
        ([], {"HAMI_TRIO_LOG_LEVEL": "chatty"}, "HAMI_TRIO_LOG_LEVEL: unknown log level 'chatty'"),
        ([], {"HAMI_TRIO_LEGACY_METRICS": "yes"}, "HAMI_TRIO_LEGACY_METRICS: 'yes' is not a bool"),
        (["--mig-lock-path="], {}, "--mig-lock-path: empty path"),
    ],
)
def test_invalid_values_name_the_flag_or_variable(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve("--no-kubernetes", *argv, env=env)
    assert str(info.value).startswith(message)


def test_broker_values_are_checked_even_when_it_is_off() -> None:
    with pytest.raises(ConfigError, match="--broker-max-exchanges"):
        resolve("--no-kubernetes", "--broker-max-exchanges=x")


def test_hook_path_is_required() -> None:
    with pytest.raises(ConfigError, match=r"^HOOK_PATH is not set: set it \(or --hook-path\)"):
        resolve_config(parse("--no-kubernetes"), {"HOOK_PATH": ""})


def test_kubernetes_needs_a_node_name_and_an_api() -> None:
    with pytest.raises(ConfigError, match=r"NODE_NAME is empty.*--no-kubernetes"):
        resolve()
    with pytest.raises(ConfigError, match="--node-name: 'Bad_Name' is not a valid"):
        resolve("--node-name=Bad_Name")
    with pytest.raises(PodSourceError, match="no Kubernetes API configuration"):
        resolve(env={"NODE_NAME": "n1"})
    config = resolve("--node-name=n1", "--kubeconfig=/kc")
    assert config.kubernetes is not None
    assert config.kubernetes.kubeconfig == "/kc"


def test_to_json_shows_values_sources_and_warnings_but_no_secret() -> None:
    config = resolve(
        "--broker-socket-path=/b/broker.sock",
        env={
            "NODE_NAME": "n1",
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
            "LIBVGPU_HOSTPID_BROKER": "1",
            "HAMI_RESYNC_INTERVAL": "x",
        },
    )
    doc = config.to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["broker"] == {
        "enabled": True,
        "socket_path": "/b/broker.sock",
        "lock_path": "/b-lock/broker.lock",
        "max_exchanges": 4096,
        "exchange_deadline_seconds": 0.5,
    }
    assert doc["kubernetes"] == {
        "in_cluster": "https://10.0.0.1:443",
        "token_path": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "ca_path": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    }
    assert doc["sources"]["broker"] == "LIBVGPU_HOSTPID_BROKER"
    assert doc["sources"]["broker_socket_path"] == "--broker-socket-path"
    assert len(doc["warnings"]) == 1
    assert doc["metrics_bind_address"] == ":9394"
    assert doc["metrics_max_connections"] == 64
    assert doc["metrics_request_timeout_seconds"] == 10.0
    assert doc["debug_bind_address"] == "127.0.0.1:9395"


def test_debug_view_is_on_the_loopback_by_default_and_can_be_turned_off() -> None:
    assert resolve("--no-kubernetes").debug_bind == BindAddress("127.0.0.1", 9395)
    assert resolve("--no-kubernetes", "--debug-bind-address=").debug_bind is None
    assert resolve("--no-kubernetes", "--debug-bind-address=off").debug_bind is None
    off = resolve("--no-kubernetes", env={"HAMI_TRIO_DEBUG_BIND_ADDRESS": "off"})
    assert (off.debug_bind, off.to_json()["debug_bind_address"]) == (None, None)
    # An empty variable is unset, as for every variable: the default, not off.
    empty = resolve("--no-kubernetes", env={"HAMI_TRIO_DEBUG_BIND_ADDRESS": ""})
    assert empty.debug_bind == BindAddress("127.0.0.1", 9395)
    for loopback in ("127.0.0.1:1", "127.8.0.1:1", "[::1]:1", "localhost:1"):
        assert resolve("--no-kubernetes", f"--debug-bind-address={loopback}").warnings == ()
    wide = resolve("--no-kubernetes", "--debug-bind-address=:9395")
    assert wide.debug_bind == BindAddress("", 9395)
    assert wide.warnings == (
        "--debug-bind-address=':9395' is not a loopback address: whoever reaches it reads every "
        "container's host PIDs and file paths (keep it on 127.0.0.1 unless a firewall guards it)",
    )
    assert len(resolve("--no-kubernetes", "--debug-bind-address=10.0.0.1:1").warnings) == 1
    with pytest.raises(ConfigError, match=r"^HAMI_TRIO_DEBUG_BIND_ADDRESS: '9395' has no port"):
        resolve("--no-kubernetes", env={"HAMI_TRIO_DEBUG_BIND_ADDRESS": "9395"})


def test_metrics_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"^--metrics-max-connections: must be at least 1"):
        resolve("--no-kubernetes", "--metrics-max-connections=0")
    with pytest.raises(ConfigError, match="HAMI_TRIO_METRICS_REQUEST_TIMEOUT"):
        resolve("--no-kubernetes", env={"HAMI_TRIO_METRICS_REQUEST_TIMEOUT": "0"})


def test_check_host_names_the_setting(tmp_path: Path) -> None:
    check_host(resolve_config(parse("--no-kubernetes"), {"HOOK_PATH": str(tmp_path)}))
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match=f"^--hook-path='{missing}' does not exist"):
        check_host(resolve_config(parse("--no-kubernetes", f"--hook-path={missing}"), {}))
    with pytest.raises(ConfigError, match=r"^HOOK_PATH="):
        check_host(resolve_config(parse("--no-kubernetes"), {"HOOK_PATH": str(missing)}))


# -- through the command line ----------------------------------------------------------------


def test_print_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOOK_PATH", str(tmp_path / "does-not-matter"))
    monkeypatch.setenv("LIBVGPU_HOSTPID_BROKER", "1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["run", "--no-kubernetes", "--legacy-metrics", "--print-config"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["legacy_metrics"] is True
    assert doc["broker"]["enabled"] is True
    assert doc["broker"]["socket_path"] == str(DEFAULT_SOCKET_PATH)
    assert doc["broker"]["lock_path"] == str(DEFAULT_LOCK_PATH)
    assert doc["sources"]["legacy_metrics"] == "--legacy-metrics"
    assert doc["exclude_exited_processes"] is False  # off by default: upstream's sums


def test_invalid_value_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOOK_PATH", str(tmp_path))
    assert main(["run", "--no-kubernetes", "--interval=fast"]) == 2
    assert capsys.readouterr().err == (
        "hami-trio run: --interval: invalid duration 'fast' (expected e.g. 5m, 90s, 1h30m)\n"
    )
    assert main(["run", "--no-kubernetes", f"--hook-path={tmp_path / 'nope'}"]) == 2
    assert capsys.readouterr().err == (
        f"hami-trio run: --hook-path='{tmp_path / 'nope'}' does not exist or is not a directory\n"
    )


def test_run_and_monitor_take_the_same_flags_but_the_broker_ones() -> None:
    parser = build_parser()
    run = parser.parse_args(["run"])
    monitor = parser.parse_args(["monitor"])
    broker_dests = {s.dest for s in SETTINGS if s.broker}
    assert set(vars(run)) - set(vars(monitor)) == broker_dests
    assert monitor.print_config is False  # both print their resolved configuration
