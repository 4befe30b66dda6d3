"""The Helm chart, rendered by real Helm and checked as Kubernetes would receive it.

helm-python-sdk binds Helm's Go SDK (``libhelm_c``) with ctypes, so ``Chart.render`` is the
engine ``helm template`` runs (values coalesced with the defaults, ``values.schema.json``
enforced, ``fail`` honoured) and ``helm_python.lint`` is ``helm lint``; no helm binary and no
cluster are involved.  Every rendered manifest is validated with kubernetes-validate in strict
mode (unknown fields are errors) against the oldest Kubernetes the chart declares and the
newest schema the package ships.  The ServiceMonitor is a CRD with no schema there, so its
shape is checked by hand.

These tests need the ``chart`` extra.  Without it they skip locally with the reason, and fail
in CI (``CI`` set), where a silently skipped chart test would be a gap.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import hami_trio
from hami_trio.agent.config import resolve_config
from hami_trio.cli.main import build_parser
from hami_trio.goparse import BindAddress
from hami_trio.metrics.pods import parse_label_allowlist
from hami_trio.pods.access import KubeAccess
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import start_watch, wait_until, write_kubeconfig

try:
    import helm_python as helm
    import kubernetes_validate
    import yaml
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    if os.environ.get("CI"):
        raise ImportError(
            f"the chart tests need the 'chart' extra and CI must install it: {exc}"
        ) from exc
    pytest.skip(
        f"chart tests need the 'chart' extra (pip install -e '.[test,chart]'): {exc}",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hami-trio"
NAMESPACE = "hami-system"
RELEASE = "hami-trio"

BROKER_DIR = "/var/run/hami/hostpid"
BROKER_LOCK_DIR = "/var/run/hami/hostpid-lock"
BROKER_ON = {"devicePlugin": {"hostPIDBroker": {"enabled": True}}}
BROKER_ON_HOSTPID_OFF = {"devicePlugin": {"hostPID": False, "hostPIDBroker": {"enabled": True}}}
NO_SCRAPER = "networkPolicy.enabled=true needs networkPolicy.scraper.namespaceSelector or"
NETWORK_POLICY_ON = {
    "networkPolicy": {
        "enabled": True,
        "scraper": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}},
    }
}
HOSTPID_REFUSAL = "devicePlugin.hostPIDBroker.enabled=true requires devicePlugin.hostPID=true"


def run_flags() -> frozenset[str]:
    """Every flag ``hami-trio run``'s real parser accepts (long options only)."""
    (run,) = [
        parser
        for action in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        for name, parser in getattr(action, "choices", {}).items()
        if name == "run"
    ]
    return frozenset(
        option
        for action in run._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    )


AGENT_ENV = frozenset(
    {
        "NODE_NAME",
        "HOOK_PATH",
        "HAMI_RESYNC_INTERVAL",
        "LIBVGPU_HOSTPID_BROKER",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "HAMI_TRIO_DEBUG_BIND_ADDRESS",
    }
)

# Scenarios the issue names, plus everything at once; each must render to valid manifests.
SCENARIOS: dict[str, dict[str, Any]] = {
    "broker-off-default": {},
    "broker-on": BROKER_ON,
    "legacy-metrics": {"metrics": {"legacy": True}},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "hostpid-off-broker-off": {"devicePlugin": {"hostPID": False}},
    "network-policy": NETWORK_POLICY_ON,
    "network-policy-off": {"networkPolicy": {"enabled": False}},
    "hostpid-on-broker-off": {"devicePlugin": {"hostPID": True}},
    "everything": {
        **BROKER_ON,
        "networkPolicy": {
            "enabled": True,
            "scraper": {"namespaceSelector": {"matchLabels": {"team": "obs"}}, "podSelector": {}},
        },
        "metrics": {
            "legacy": True,
            "port": 9500,
            "podLabelsAllowlist": ["team", "app"],
            "excludeExitedProcesses": True,
        },
        "serviceMonitor": {"enabled": True},
        "log": {"format": "json", "level": "debug"},
        "image": {"digest": "sha256:" + "a" * 64, "pullSecrets": ["regcred"]},
        "runtimeClassName": "nvidia",
        "podAnnotations": {"example.com/a": "b"},
        "extraArgs": ["--broker-max-exchanges=256"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
}


def _min_kube_version() -> str:
    chart_yaml = yaml.safe_load((CHART / "Chart.yaml").read_text())
    match = re.fullmatch(r">=\s*(\d+\.\d+)\.\d+(-0)?", chart_yaml["kubeVersion"])
    assert match, f"unexpected kubeVersion {chart_yaml['kubeVersion']!r}"
    return match.group(1)


KUBE_VERSIONS = (_min_kube_version(), kubernetes_validate.utils.latest_version())


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: Any, values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Render like ``helm template`` and return the manifests grouped by kind."""
    rendered = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for path, text in rendered.items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def notes(chart: Any, values: dict[str, Any] | None = None) -> str:
    rendered = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE)
    return str(rendered[f"{CHART.name}/templates/NOTES.txt"])


def only(by_kind: dict[str, list[dict[str, Any]]], kind: str) -> dict[str, Any]:
    docs = by_kind.get(kind, [])
    assert len(docs) == 1, f"expected one {kind}, got {len(docs)}"
    return docs[0]


def agent(by_kind: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    containers = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return dict(containers[0])


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {e["name"]: e for e in container["env"]}


def broker_bits(by_kind: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    """Each trace the broker switch leaves in the rendering."""
    pod = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]
    container = agent(by_kind)
    paths = {BROKER_DIR, BROKER_LOCK_DIR}
    mounts = {m["mountPath"] for m in container["volumeMounts"]} & paths
    volumes = {v.get("hostPath", {}).get("path") for v in pod["volumes"]} & paths
    flags = {a.split("=", 1)[0] for a in container["args"]}
    flags &= {"--broker-socket-path", "--broker-lock-path"}
    for found in (mounts, volumes, flags):
        assert len(found) in (0, 2), found  # socket and lock go together
    return {
        "env": "LIBVGPU_HOSTPID_BROKER" in env_of(container),
        "mount": bool(mounts),
        "volume": bool(volumes),
        "flag": bool(flags),
    }


# --- every scenario renders to manifests Kubernetes accepts ---------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_is_valid_kubernetes(chart: Any, scenario: str) -> None:
    by_kind = render(chart, SCENARIOS[scenario])
    expected = {"DaemonSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    if SCENARIOS[scenario].get("serviceMonitor", {}).get("enabled"):
        expected.add("ServiceMonitor")
    if SCENARIOS[scenario].get("networkPolicy", {}).get("enabled", True):
        expected.add("NetworkPolicy")
    assert set(by_kind) == expected
    for kind, docs in by_kind.items():
        if kind == "ServiceMonitor":
            continue  # a CRD: no schema in kubernetes-validate; see test_service_monitor_shape
        for doc in docs:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_is_not_vacuous() -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"prts": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSIONS[-1], strict=True)


# --- the broker switch ------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [{}, {"metrics": {"legacy": True}}, {"devicePlugin": {"hostPID": False}}],
    ids=["default", "legacy", "hostpid-off"],
)
def test_broker_off_leaves_no_trace(chart: Any, values: dict[str, Any]) -> None:
    by_kind = render(chart, values)
    assert broker_bits(by_kind) == dict.fromkeys(("env", "mount", "volume", "flag"), False)
    annotations = only(by_kind, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["hami-trio.io/host-pid-broker"] == "disabled"


@pytest.mark.parametrize(
    "values",
    [BROKER_ON, {**BROKER_ON, "metrics": {"legacy": True}, "serviceMonitor": {"enabled": True}}],
    ids=["broker-on", "broker-on-everything"],
)
def test_broker_on_sets_switch_mount_and_socket_path(chart: Any, values: dict[str, Any]) -> None:
    by_kind = render(chart, values)
    assert broker_bits(by_kind) == dict.fromkeys(("env", "mount", "volume", "flag"), True)
    pod = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]
    container = agent(by_kind)
    # Exactly "1": the only value that turns the broker on.
    assert env_of(container)["LIBVGPU_HOSTPID_BROKER"] == {
        "name": "LIBVGPU_HOSTPID_BROKER",
        "value": "1",
    }
    assert f"--broker-socket-path={BROKER_DIR}/broker.sock" in container["args"]
    # The lock lives beside the socket's directory, which workloads mount, never in it.
    assert f"--broker-lock-path={BROKER_LOCK_DIR}/broker.lock" in container["args"]
    for path in (BROKER_DIR, BROKER_LOCK_DIR):
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
        assert not mount.get("readOnly", False)  # the agent creates the socket / lock there
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}
    assert pod["hostPID"] is True  # derived from the broker switch
    annotations = only(by_kind, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["hami-trio.io/host-pid-broker"] == "enabled"


def test_broker_on_with_host_pid_off_fails_with_a_clear_message(chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(HOSTPID_REFUSAL)):
        chart.render(values=BROKER_ON_HOSTPID_OFF, name=RELEASE, namespace=NAMESPACE)


def test_host_pid_off_alone_is_allowed(chart: Any) -> None:
    pod = only(render(chart, {"devicePlugin": {"hostPID": False}}), "DaemonSet")
    assert pod["spec"]["template"]["spec"]["hostPID"] is False


@pytest.mark.parametrize(
    ("values", "host_pid"),
    [
        ({}, False),  # broker off by default: no host PID namespace either
        (BROKER_ON, True),
        ({"devicePlugin": {"hostPID": True}}, True),  # an explicit value wins
        ({"devicePlugin": {"hostPID": True, "hostPIDBroker": {"enabled": True}}}, True),
        ({"devicePlugin": {"hostPID": None, "hostPIDBroker": {"enabled": True}}}, True),
        ({"metrics": {"excludeExitedProcesses": True}}, True),  # telling exited PIDs needs it
        ({"metrics": {"excludeExitedProcesses": True}, "devicePlugin": {"hostPID": False}}, False),
    ],
    ids=[
        "default",
        "broker-on",
        "explicit-true",
        "explicit-true-broker-on",
        "null-broker-on",
        "exclude-exited",
        "exclude-exited-explicit-false",
    ],
)
def test_host_pid_follows_the_broker_unless_set(
    chart: Any, values: dict[str, Any], host_pid: bool
) -> None:
    pod = only(render(chart, values), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is host_pid


# --- the DaemonSet ------------------------------------------------------------------------


def test_daemonset_runs_as_root_with_only_the_capabilities_it_needs(chart: Any) -> None:
    by_kind = render(chart)
    pod = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is False  # the broker is off by default
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = agent(by_kind)["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert sorted(security["capabilities"]["add"]) == ["DAC_OVERRIDE", "FOWNER"]
    # With the broker on, one more: the immutable flag on the broker's mount point.
    broker_security = agent(render(chart, BROKER_ON))["securityContext"]
    assert sorted(broker_security["capabilities"]["add"]) == [
        "DAC_OVERRIDE",
        "FOWNER",
        "LINUX_IMMUTABLE",
    ]


def test_daemonset_scheduling_and_rollout(chart: Any) -> None:
    ds = only(render(chart), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"gpu": "on"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_agent_command_flags_and_environment(chart: Any) -> None:
    container = agent(render(chart))
    assert container["command"] == ["hami-trio", "run"]
    assert container["args"] == [
        "--metrics-bind-address=:9394",
        "--log-format=text",
        "--log-level=info",
        "--mig-lock-path=/tmp/hami/hami-mig-apply.lock",
    ]
    env = env_of(container)
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["HOOK_PATH"]["value"] == "/usr/local/vgpu"
    assert env["HAMI_RESYNC_INTERVAL"]["value"] == "5m"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["HAMI_TRIO_DEBUG_BIND_ADDRESS"]["value"] == "127.0.0.1:9395"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_only_flags_and_env_the_agent_knows(chart: Any, scenario: str) -> None:
    container = agent(render(chart, SCENARIOS[scenario]))
    assert container["command"] == ["hami-trio", "run"]
    flags = run_flags()
    for arg in container["args"]:
        # Spelled out in full: argparse would also take an abbreviation.
        assert arg.split("=", 1)[0] in flags, arg
    extra = {e["name"] for e in SCENARIOS[scenario].get("extraEnv", [])}
    assert set(env_of(container)) - extra <= AGENT_ENV

    # What the agent makes of it: the real parser and resolve_config, with the pod's
    # environment (NODE_NAME from the downward API, the in-cluster API variables).
    args = build_parser().parse_args(["run", *container["args"]])
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    for name, entry in env_of(container).items():
        env[name] = entry.get("value", "node-a")
    config = resolve_config(args, env)
    assert config.warnings == ()
    assert config.node_name == "node-a"
    assert config.debug_bind == BindAddress("127.0.0.1", 9395)
    assert config.kubernetes is not None
    broker_on = SCENARIOS[scenario].get("devicePlugin", {}).get("hostPIDBroker", {})
    if broker_on.get("enabled"):
        assert config.broker is not None
        assert config.broker.socket_path == Path(BROKER_DIR) / "broker.sock"
        assert config.broker.resolved_lock_path == Path(BROKER_LOCK_DIR) / "broker.lock"
    else:
        assert config.broker is None


def test_host_paths_follow_the_values(chart: Any) -> None:
    values = {"hookPath": "/opt/hami/vgpu", "resyncInterval": "90s"}
    by_kind = render(chart, values)
    pod = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]
    container = agent(by_kind)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]]["hostPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "/opt/hami/vgpu/containers": {
            "path": "/opt/hami/vgpu/containers",
            "type": "DirectoryOrCreate",
        },
        "/tmp/hami": {"path": "/tmp/hami", "type": "DirectoryOrCreate"},
        "/tmp/vgpulock": {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"},
    }
    env = env_of(container)
    assert env["HOOK_PATH"]["value"] == "/opt/hami/vgpu"
    assert env["HAMI_RESYNC_INTERVAL"]["value"] == "90s"


def test_no_host_tmp_only_the_two_directories_read_only(chart: Any) -> None:
    cases: tuple[dict[str, Any], ...] = (
        {},
        BROKER_ON,
        {"migLockPath": "/var/lib/hami-mig/apply.lock"},
    )
    for values in cases:
        by_kind = render(chart, values)
        pod = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]
        mounts = {m["mountPath"]: m for m in agent(by_kind)["volumeMounts"]}
        host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        assert "/tmp" not in mounts
        assert "/tmp" not in host_paths
        mig_dir = str(Path(values.get("migLockPath", "/tmp/hami/hami-mig-apply.lock")).parent)
        # The MIG lock's directory: the agent only looks at it.  The lock parent too, but
        # with the broker on it prepares it at start (the immutable mount point hostpid).
        assert mounts[mig_dir]["readOnly"] is True
        assert mounts["/tmp/vgpulock"]["readOnly"] is (values is not BROKER_ON)
        assert ("--prepare-lock-parent" in agent(by_kind)["args"]) is (values is BROKER_ON)
        assert (
            f"--mig-lock-path={values.get('migLockPath', '/tmp/hami/hami-mig-apply.lock')}"
            in (agent(by_kind)["args"])
        )
        writable = {path for path, m in mounts.items() if not m.get("readOnly", False)}
        expected = {"/usr/local/vgpu/containers"}
        if values is BROKER_ON:
            expected |= {BROKER_DIR, BROKER_LOCK_DIR, "/tmp/vgpulock"}
        assert writable == expected


def test_probes_and_ports_follow_the_metrics_port(chart: Any) -> None:
    by_kind = render(chart, {"metrics": {"port": 9500}})
    container = agent(by_kind)
    assert container["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    assert "--metrics-bind-address=:9500" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = only(by_kind, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = only(by_kind, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("legacy", [False, True])
def test_legacy_metrics_flag_exactly_when_on(chart: Any, legacy: bool) -> None:
    container = agent(render(chart, {"metrics": {"legacy": legacy}}))
    assert ("--legacy-metrics" in container["args"]) is legacy


def test_pod_labels_allowlist_becomes_one_flag_the_agent_accepts(chart: Any) -> None:
    assert not any(
        arg.startswith("--pod-labels-allowlist") for arg in agent(render(chart, {}))["args"]
    )
    keys = ["team", "app.kubernetes.io/name"]
    container = agent(render(chart, {"metrics": {"podLabelsAllowlist": keys}}))
    (flag,) = [arg for arg in container["args"] if arg.startswith("--pod-labels-allowlist")]
    assert flag == "--pod-labels-allowlist=team,app.kubernetes.io/name"
    assert parse_label_allowlist(flag.partition("=")[2]) == tuple(keys)


@pytest.mark.parametrize("exclude", [False, True])
def test_exclude_exited_processes_flag_exactly_when_on(chart: Any, exclude: bool) -> None:
    container = agent(render(chart, {"metrics": {"excludeExitedProcesses": exclude}}))
    assert ("--exclude-exited-processes" in container["args"]) is exclude


def test_log_values_become_flags(chart: Any) -> None:
    container = agent(render(chart, {"log": {"format": "json", "level": "debug"}}))
    assert {"--log-format=json", "--log-level=debug"} <= set(container["args"])


# --- RBAC and the ServiceMonitor ----------------------------------------------------------


def test_rbac_is_list_watch_pods_only(chart: Any) -> None:
    by_kind = render(chart)
    role = only(by_kind, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = only(by_kind, "ClusterRoleBinding")
    account = only(by_kind, "ServiceAccount")
    pod = only(by_kind, "DaemonSet")["spec"]["template"]["spec"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


async def test_rbac_verbs_are_exactly_what_the_pod_watch_uses(
    chart: Any, nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The real pod watch against the fake API server, through a list, events, a watch that
    # ends and an expired one (relist): every request must be a collection GET of pods, a
    # list or a watch - never a single pod (the verb "get").
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    access = KubeAccess(
        kubeconfig=write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    )
    uid = fake.add_pod("a")
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    fake.modify_pod(uid, labels={"v": "2"})
    fake.add_pod("b")
    await wait_until(lambda: len(source.pods()) == 2)
    fake.end_watches()
    await wait_until(lambda: len(fake.requests) >= 3 and fake.open_watches == 1)
    fake.delete_pod(uid)  # history the watch misses: compacted away, only a relist tells
    fake.compact()
    fake.end_watches()
    await wait_until(lambda: source.relists == 1 and fake.open_watches == 1)
    assert {r.path for r in fake.requests} == {"/api/v1/pods"}
    used = {"watch" if r.watch else "list" for r in fake.requests}
    (rule,) = only(render(chart), "ClusterRole")["rules"]
    assert used == set(rule["verbs"]) == {"list", "watch"}


def test_service_monitor_is_off_by_default(chart: Any) -> None:
    assert "ServiceMonitor" not in render(chart)


def test_service_monitor_shape(chart: Any) -> None:
    by_kind = render(chart, {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
    monitor = only(by_kind, "ServiceMonitor")
    service = only(by_kind, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    assert endpoint["scrapeTimeout"] == "10s"
    # Tenant namespace/pod/container labels must survive the scrape unrenamed.
    assert endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint[
        "relabelings"
    ]


# --- values checking ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"log": {"format": "xml"}}, "/log/format"),
        ({"log": {"level": "verbose"}}, "/log/level"),
        ({"metrics": {"port": "9394"}}, "/metrics/port"),
        ({"metrics": {"port": 80}}, "/metrics/port"),
        ({"devicePlugin": {"hostPID": "yes"}}, "/devicePlugin/hostPID"),
        (
            {"devicePlugin": {"hostPIDBroker": {"enabled": 1}}},
            "/devicePlugin/hostPIDBroker/enabled",
        ),
        ({"resyncInterval": "5 minutes"}, "/resyncInterval"),
        ({"hookPath": "usr/local/vgpu"}, "/hookPath"),
        ({"hookPath": "/usr/local/vgpu/"}, "/hookPath"),
        ({"migLockPath": "/tmp/mig.lock"}, "/migLockPath"),  # its directory would be /tmp
        ({"migLockPath": "tmp/hami/x.lock"}, "/migLockPath"),
        ({"migLockPath": "/tmp/hami/"}, "/migLockPath"),
        ({"devicePlugin": {"hostPID": "auto"}}, "/devicePlugin/hostPID"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        (
            {"networkPolicy": {"scraper": {"namespace": "Mon_1"}}},
            "/networkPolicy/scraper/namespace",
        ),
        (
            {"networkPolicy": {"scraper": {"podLabels": {"a": 1}}}},
            "/networkPolicy/scraper/podLabels",
        ),
        ({"networkPolicy": {"enabled": False, "scraper": {"pods": {}}}}, "pods"),
        ({"extraArgs": ["run"]}, "/extraArgs/0"),
        # The debug view shows host PIDs and file paths: the pod's loopback only.
        ({"debug": {"bindAddress": "0.0.0.0:9395"}}, "/debug/bindAddress"),
        ({"debug": {"bindAddress": ":9395"}}, "/debug/bindAddress"),
        ({"debug": {"bindAddress": "10.0.0.7:9395"}}, "/debug/bindAddress"),
        ({"debug": {"bindAddress": "127.0.0.1:80"}}, "/debug/bindAddress"),
        ({"debug": {"bindAddress": "127.0.0.1:9395 "}}, "/debug/bindAddress"),
        ({"devicePlugn": {}}, "devicePlugn"),
    ],
)
def test_schema_rejects_bad_values(chart: Any, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)


SMUGGLED: list[tuple[dict[str, Any], str]] = [
    (
        {"extraEnv": [{"name": "LIBVGPU_HOSTPID_BROKER", "value": "1"}]},
        "set LIBVGPU_HOSTPID_BROKER",
    ),
    ({"extraEnv": [{"name": "HOOK_PATH", "value": "/x"}]}, "set HOOK_PATH"),
    ({"extraArgs": ["--log-level=debug"]}, "pass --log-level"),
    ({"extraArgs": ["--broker-socket-path=/x.sock"]}, "pass --broker-socket-path"),
    ({"extraArgs": ["--broker-lock-path=/x.lock"]}, "pass --broker-lock-path"),
    ({"extraArgs": ["--prepare-lock-parent"]}, "pass --prepare-lock-parent"),
    # Flags that would override what the chart sets through the environment (and mounts).
    ({"extraArgs": ["--hook-path=/x"]}, "pass --hook-path"),
    ({"extraArgs": ["--node-name=other"]}, "pass --node-name"),
    ({"extraArgs": ["--resync-interval=1m"]}, "pass --resync-interval"),
    ({"extraArgs": ["--debug-bind-address=:9395"]}, "pass --debug-bind-address"),
    (
        {"extraEnv": [{"name": "HAMI_TRIO_DEBUG_BIND_ADDRESS", "value": ":9395"}]},
        "set HAMI_TRIO_DEBUG_BIND_ADDRESS",
    ),
]


@pytest.mark.parametrize(("values", "message"), SMUGGLED)
def test_chart_managed_settings_cannot_be_smuggled_in(
    chart: Any, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=f"must not {re.escape(message)}: the chart"):
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)


def test_mig_lock_path_with_dot_dot_is_refused(chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"must not contain \. or \.\. components"):
        chart.render(
            values={"migLockPath": "/tmp/hami/../x.lock"}, name=RELEASE, namespace=NAMESPACE
        )


# --- the NetworkPolicy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9500", BindAddress("127.0.0.1", 9500)),
        ("[::1]:9395", BindAddress("::1", 9395)),
        ("", None),
    ],
)
def test_debug_view_stays_in_the_pod(
    chart: Any, address: str, expected: BindAddress | None
) -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}
    by_kind = render(
        chart,
        {"debug": {"bindAddress": address}, "networkPolicy": {"enabled": True, "scraper": scraper}},
    )
    container = agent(by_kind)
    value = env_of(container)["HAMI_TRIO_DEBUG_BIND_ADDRESS"]["value"]
    assert value == (address or "off")
    env = {"HOOK_PATH": "/h", "HAMI_TRIO_DEBUG_BIND_ADDRESS": value}
    assert resolve_config(
        build_parser().parse_args(["run", "--no-kubernetes"]), env
    ).debug_bind == (expected)
    assert ("-- hami-trio status" in notes(chart, {"debug": {"bindAddress": address}})) == bool(
        address
    )
    # Only the metrics port leaves the pod: no container port, Service port or policy rule.
    assert [port["name"] for port in container["ports"]] == ["metrics"]
    assert [port["name"] for port in only(by_kind, "Service")["spec"]["ports"]] == ["metrics"]
    rules = only(by_kind, "NetworkPolicy")["spec"]["ingress"]
    assert [port["port"] for rule in rules for port in rule["ports"]] == ["metrics"]
    assert only(by_kind, "DaemonSet")["spec"]["template"]["spec"].get("hostNetwork") in (
        None,
        False,
    )  # with the host's network, 127.0.0.1 would be the node's loopback


KUBE_PROMETHEUS_STACK = {
    # What the Prometheus operator labels a Prometheus pod with (kube-prometheus-stack's too),
    # in the namespace its install guide uses.
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def test_network_policy_is_on_by_default_and_admits_kube_prometheus_stack(chart: Any) -> None:
    """Without it every pod reads every tenant's pod names and GPU UUIDs off the port and
    can flood it; the default names the usual Prometheus, and NOTES say how to change it."""
    policy = only(render(chart), "NetworkPolicy")
    assert policy["spec"]["ingress"] == [
        {"from": [KUBE_PROMETHEUS_STACK], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    ]
    text = notes(chart)
    assert '{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}' in text
    assert '{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}' in text
    assert "--set networkPolicy.scraper.namespace=<its namespace>" in text
    assert "--set networkPolicy.enabled=false" in text


def test_network_policy_short_forms_name_the_scraper(chart: Any) -> None:
    scraper = {"namespace": "obs", "podLabels": {"app.kubernetes.io/name": None, "prom": "k8s"}}
    policy = only(render(chart, {"networkPolicy": {"scraper": scraper}}), "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
            "podSelector": {"matchLabels": {"prom": "k8s"}},
        }
    ]
    # A full selector replaces the short form; no namespace at all: the release namespace.
    scraper = {"namespace": "", "podSelector": {"matchLabels": {"app": "p"}}}
    by_kind = render(chart, {"networkPolicy": {"scraper": scraper}})
    assert only(by_kind, "NetworkPolicy")["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"app": "p"}}}
    ]
    assert f'{{"namespace":"{NAMESPACE}"}}' in notes(chart, {"networkPolicy": {"scraper": scraper}})


def test_network_policy_can_be_turned_off_and_notes_say_what_that_opens(chart: Any) -> None:
    values = {"networkPolicy": {"enabled": False}}
    assert "NetworkPolicy" not in render(chart, values)
    assert "every pod can reach port 9394" in notes(chart, values)


def test_network_policy_admits_only_the_scraper_to_the_metrics_port(chart: Any) -> None:
    scraper = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
        "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["p"]}]},
    }
    by_kind = render(
        chart, {"networkPolicy": {"enabled": True, "scraper": scraper}, "metrics": {"port": 9500}}
    )
    policy = only(by_kind, "NetworkPolicy")
    pod_labels = only(by_kind, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # the agent's egress is untouched
    # One rule, one peer carrying both selectors (both must match), one port.
    assert policy["spec"]["ingress"] == [
        {"from": [scraper], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    ]
    assert {"name": "metrics", "containerPort": 9500, "protocol": "TCP"} in agent(by_kind)["ports"]


@pytest.mark.parametrize(
    "scraper",
    [
        {"namespace": "", "podLabels": None},
        {"namespace": "", "podLabels": None, "namespaceSelector": {}, "podSelector": {}},
    ],
    ids=["no-defaults", "both-empty"],
)
def test_network_policy_without_a_scraper_selector_is_refused(
    chart: Any, scraper: dict[str, Any] | None
) -> None:
    # Both selectors empty would admit every pod of every namespace: say who scrapes.
    policy: dict[str, Any] = {"enabled": True}
    if scraper is not None:
        policy["scraper"] = scraper
    with pytest.raises(helm.HelmRenderError, match=re.escape(NO_SCRAPER)):
        chart.render(values={"networkPolicy": policy}, name=RELEASE, namespace=NAMESPACE)


# --- helm lint, NOTES, docs -----------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_is_clean(scenario: str) -> None:
    report = helm.lint(CHART, SCENARIOS[scenario], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    # Severity 1 (info) is only "icon is recommended"; warnings (2) and errors (3) fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_helm_lint_reports_bad_values() -> None:
    # Lint is not vacuous: a schema violation is an error.  (Helm lints templates in "lint
    # mode", where `fail` only logs, so the broker/hostPID refusal shows up when rendering -
    # install, upgrade, template - not in lint; test_broker_on_with_host_pid_off_fails_...)
    report = helm.lint(CHART, {"metrics": {"port": "9394"}}, strict=True, namespace=NAMESPACE)
    assert any("/metrics/port" in error for error in report["errors"])


def test_notes_say_whether_the_broker_is_on(chart: Any) -> None:
    assert "Host PID broker: disabled." in notes(chart)
    on = notes(chart, BROKER_ON)
    assert "Host PID broker: ENABLED." in on
    assert "recreate" in on


def _value_paths(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of the chart's settings: leaves of the schema's closed objects."""
    for key, sub in schema["properties"].items():
        path = f"{prefix}{key}"
        if sub.get("type") == "object" and sub.get("additionalProperties") is False:
            yield from _value_paths(sub, f"{path}.")
        elif key != "global":
            yield path


def test_every_value_has_a_schema_entry_and_is_documented(chart: Any) -> None:
    schema = chart.schema
    paths = sorted(_value_paths(schema))
    defaults = chart.values
    for path in paths:
        node: Any = defaults
        for part in path.split("."):
            assert part in node, f"{path} is in values.schema.json but not in values.yaml"
            node = node[part]
    readme = (CHART / "README.md").read_text()
    guide = (ROOT / "docs" / "deployment.md").read_text()
    for path in paths:
        assert f"`{path}`" in readme, f"{path} missing from the chart README"
        assert f"`{path}`" in guide, f"{path} missing from docs/deployment.md"


def test_app_version_is_the_package_version(chart: Any) -> None:
    version = hami_trio.__version__
    assert chart.metadata["appVersion"] == version
    image = agent(render(chart))["image"]
    assert image == f"hami-trio:{version}"


# --- the PrometheusRule (alert rules) -------------------------------------------------------

RULES_FILE = CHART / "files" / "hami-trio-rules.yaml"
_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_RULE_KEYS = frozenset({"alert", "expr", "for", "labels", "annotations"})


def check_prometheus_rule_shape(rule: dict[str, Any]) -> None:
    """The monitoring.coreos.com/v1 PrometheusRule structure (a CRD: not in kubernetes-validate)."""
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert _DNS_LABEL.fullmatch(rule["metadata"]["name"])
    assert _DNS_LABEL.fullmatch(rule["metadata"]["namespace"])
    assert all(isinstance(v, str) for v in rule["metadata"]["labels"].values())
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"]
    for group in rule["spec"]["groups"]:
        assert set(group) == {"name", "rules"}
        assert isinstance(group["name"], str)
        for entry in group["rules"]:
            assert set(entry) <= _RULE_KEYS, entry
            assert isinstance(entry["alert"], str)
            assert isinstance(entry["expr"], str)
            assert entry["expr"].strip()
            assert _DURATION.fullmatch(entry.get("for", "0s")), entry
            for key in ("labels", "annotations"):
                assert all(
                    isinstance(k, str) and isinstance(v, str) for k, v in entry[key].items()
                ), entry


def test_prometheus_rule_is_off_by_default(chart: Any) -> None:
    assert "PrometheusRule" not in render(chart)
    assert "PrometheusRule" not in render(chart, {"serviceMonitor": {"enabled": True}})


def test_prometheus_rule_shape_is_the_rules_file(chart: Any) -> None:
    values = {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}
    by_kind = render(chart, values)
    rule = only(by_kind, "PrometheusRule")
    check_prometheus_rule_shape(rule)
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    service = only(by_kind, "Service")
    assert rule["metadata"]["labels"].items() >= service["metadata"]["labels"].items()
    # Exactly the rules file, with the agent-down rule's job set to the Service's name (the
    # job label the ServiceMonitor's scrape gets).
    source = yaml.safe_load(
        RULES_FILE.read_text().replace('job="hami-trio"', f'job="{service["metadata"]["name"]}"')
    )
    assert rule["spec"] == source
    (down,) = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "HamiTrioAgentDown"
    ]
    assert down["expr"] == f'up{{job="{service["metadata"]["name"]}"}} == 0'
    # Everything else still renders to valid Kubernetes with the rule on.
    for kind, docs in by_kind.items():
        if kind != "PrometheusRule":
            for doc in docs:
                kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("release", "values", "job"),
    [
        ("prod", {}, "prod-hami-trio"),
        ("x", {"fullnameOverride": "gpu-agent"}, "gpu-agent"),
    ],
)
def test_prometheus_rule_job_follows_the_service_name(
    chart: Any, release: str, values: dict[str, Any], job: str
) -> None:
    rendered = chart.render(
        values={**values, "prometheusRule": {"enabled": True}}, name=release, namespace=NAMESPACE
    )
    docs = [
        d
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for d in yaml.safe_load_all(text)
        if d
    ]
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert service["metadata"]["name"] == job
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert f'up{{job="{job}"}} == 0' in exprs
    assert not any('job="hami-trio"' in e for e in exprs)


def test_prometheus_rule_namespace_can_be_set(chart: Any) -> None:
    values = {"prometheusRule": {"enabled": True, "namespace": "monitoring"}}
    rule = only(render(chart, values), "PrometheusRule")
    check_prometheus_rule_shape(rule)
    assert rule["metadata"]["namespace"] == "monitoring"


def test_prometheus_rule_shape_check_is_not_vacuous(chart: Any) -> None:
    rule = only(render(chart, {"prometheusRule": {"enabled": True}}), "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["fro"] = "5m"
    with pytest.raises(AssertionError):
        check_prometheus_rule_shape(rule)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"prometheusRule": {"enabled": "yes"}}, "/prometheusRule/enabled"),
        ({"prometheusRule": {"enabled": True, "namespace": "Bad_NS"}}, "/prometheusRule/namespace"),
        ({"prometheusRule": {"enabled": True, "labels": {"a": 1}}}, "/prometheusRule/labels/a"),
        ({"prometheusRule": {"enabled": True, "rules": []}}, "rules"),
    ],
)
def test_schema_rejects_bad_prometheus_rule_values(
    chart: Any, values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)


# -- found by the clients HAMi operators already run --------------------------------------

# The ServiceMonitors as those charts render them with their defaults (facts recorded from
# HAMi-WebUI's charts/hami-webui templates/hamiservicemonitor.yaml and HAMi's
# charts/hami templates/device-plugin/servicemonitor.yaml; neither chart is vendored here).
WEBUI_SERVICE_MONITOR: dict[str, Any] = {
    "selector": {"matchLabels": {"app.kubernetes.io/component": "hami-device-plugin"}},
    "namespaceSelector": {"matchNames": ["kube-system"]},
    "endpoints": [{"path": "/metrics", "port": "monitorport", "honorLabels": False}],
}
HAMI_SERVICE_MONITOR: dict[str, Any] = {  # release "hami" in kube-system, the install docs' name
    "namespace": "kube-system",
    "selector": {
        "matchLabels": {
            "app.kubernetes.io/component": "hami-device-plugin",
            "app.kubernetes.io/name": "hami",
            "app.kubernetes.io/instance": "hami",
        }
    },
    "endpoints": [{"path": "/metrics", "port": "monitorport"}],
}


def selects(monitor: dict[str, Any], service: dict[str, Any]) -> bool:
    """Whether a ServiceMonitor scrapes a Service (prometheus-operator's rules: the namespace,
    every matchLabels pair, an endpoint port by name)."""
    spec = monitor.get("spec", monitor)
    names = spec.get("namespaceSelector", {}).get("matchNames") or [
        monitor.get("namespace") or monitor.get("metadata", {}).get("namespace")
    ]
    if service["metadata"]["namespace"] not in names:
        return False
    labels = service["metadata"].get("labels", {})
    wanted = spec["selector"]["matchLabels"]
    if any(labels.get(k) != v for k, v in wanted.items()):
        return False
    ports = {p["name"] for p in service["spec"]["ports"]}
    return any(e["port"] in ports for e in spec["endpoints"])


def render_in(
    chart: Any, namespace: str, values: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    rendered = chart.render(values=values, name=RELEASE, namespace=namespace)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            for doc in yaml.safe_load_all(text):
                if doc:
                    by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def test_hami_compatible_service_is_found_by_webui_and_hamis_service_monitors(chart: Any) -> None:
    values = {
        "metrics": {
            "service": {
                "hamiCompatible": {
                    "enabled": True,
                    "labels": {
                        "app.kubernetes.io/name": "hami",
                        "app.kubernetes.io/instance": "hami",
                    },
                }
            }
        },
        "serviceMonitor": {"enabled": True},
    }
    by_kind = render_in(chart, "kube-system", values)
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    compat, ours = services[f"{RELEASE}-hami"], services[RELEASE]
    assert selects(WEBUI_SERVICE_MONITOR, compat)
    assert selects(HAMI_SERVICE_MONITOR, compat)
    assert not selects(WEBUI_SERVICE_MONITOR, ours)
    # This chart's ServiceMonitor scrapes each agent once: through its own Service only.
    (own,) = by_kind["ServiceMonitor"]
    assert selects(own, ours)
    assert not selects(own, compat)
    # The compatible Service reaches the agent pods' metrics port.
    pod_labels = only(by_kind, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert compat["spec"]["selector"].items() <= pod_labels.items()
    (port,) = compat["spec"]["ports"]
    assert (port["name"], port["targetPort"], port["port"]) == ("monitorport", "metrics", 9394)


def test_by_default_no_hami_service_monitor_selects_the_agent(chart: Any) -> None:
    by_kind = render_in(chart, "kube-system", {})
    (service,) = by_kind["Service"]
    assert not selects(WEBUI_SERVICE_MONITOR, service)
    assert not selects(HAMI_SERVICE_MONITOR, service)


def test_webui_needs_the_hami_compatible_service_in_its_namespace(chart: Any) -> None:
    values = {"metrics": {"service": {"hamiCompatible": {"enabled": True}}}}
    by_kind = render_in(chart, NAMESPACE, values)
    compat = next(s for s in by_kind["Service"] if s["metadata"]["name"].endswith("-hami"))
    assert not selects(WEBUI_SERVICE_MONITOR, compat)  # docs: install into kube-system, or
    moved = {**WEBUI_SERVICE_MONITOR, "namespaceSelector": {"matchNames": [NAMESPACE]}}
    assert selects(moved, compat)  # set WebUI's hamiServiceMonitor.svcNamespace


@pytest.mark.parametrize("on", [False, True])
def test_hami_node_labels_relabel_node_name_and_ip(chart: Any, on: bool) -> None:
    values = {"serviceMonitor": {"enabled": True, "hamiNodeLabels": on}}
    (monitor,) = render(chart, values)["ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets["node"] == ["__meta_kubernetes_pod_node_name"]
    if on:
        assert targets["node_name"] == ["__meta_kubernetes_pod_node_name"]
        assert targets["ip"] == ["__meta_kubernetes_pod_host_ip"]
    else:
        assert set(targets) == {"node"}


def test_the_migration_runbook_names_only_values_metrics_and_alerts_that_exist(
    chart: Any,
) -> None:
    text = (ROOT / "docs" / "migration.md").read_text()
    paths = set(_value_paths(chart.schema))
    named = set(
        re.findall(r"`((?:metrics|serviceMonitor|devicePlugin)\.[A-Za-z.]+)(?:=[^`]*)?`", text)
    )
    assert named, "the runbook names chart values"
    assert named <= paths, named - paths
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    for metric in set(re.findall(r"`(hami_trio_[a-z_]+)`", text)):
        assert f"`{metric}`" in metrics_doc, metric
    rules = (CHART / "files" / "hami-trio-rules.yaml").read_text()
    for alert in set(re.findall(r"`(HamiTrio[A-Za-z]+)`", text)):
        assert f"alert: {alert}\n" in rules, alert
