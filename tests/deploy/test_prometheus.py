"""The dashboard's queries and the alert rules against a real Prometheus scraping a real agent.

A module fixture starts, all as real processes on 127.0.0.1 and temp paths:

- the fake Kubernetes API server of tests/pods/fake_kube.py (in a thread of its own) with
  three pods of node ``node-a``;
- ``hami-trio run`` (tests/agent/agent.py) with the broker on, the pod watch on that server,
  ``.cache`` files for those pods (one at 95 % of its vGPU memory limit, one v1 region with a
  kernel launched, one file the lister rejects), a shared lock parent of mode 0755 (refused:
  it must be 1777) and threads making broker exchanges and connections that send nothing
  (``timeout``s);
- Debian's ``prometheus`` server, scraping the agent every second with the chart's
  ServiceMonitor semantics - ``honorLabels`` and the ``relabelings`` are read from the
  ServiceMonitor the chart renders, and the target carries the labels prometheus-operator
  gives an endpoint (``namespace``, ``pod``, ``container``, ``service``, ``endpoint``, the job
  named after the Service, and ``__meta_kubernetes_pod_node_name``) - and evaluating the
  rules of the chart's rendered PrometheusRule every second.

Then every PromQL expression of deploy/grafana/hami-trio.json (panel targets and template
variable queries) is evaluated through ``/api/v1/query`` with the template variables filled
in, both as Grafana's "All" (``.*``) and as the values the variable queries really return:
each must parse and return data, except those in :data:`NO_DATA_HERE` (metrics this test
cannot produce, each with its reason), which must parse and return nothing - so the list
cannot go stale.  Every rule must be healthy after evaluation, every rule expression must
evaluate, and the alerts whose conditions the fixture creates must be active with the
tenant's labels, those whose conditions it does not create must not.

The binary comes from Debian's ``prometheus`` package (.ci/run puts it on ``PATH``); without
it the tests skip with the reason, in CI they fail.  ``promtool check metrics`` on a scrape
is tests/metrics/test_collector.py's job.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from hami_trio.broker.protocol import VALID_REQUEST, encode_response
from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, write_region
from tests.agent.agent import AgentProcess, agent_env, http_get, wait_until
from tests.deploy.test_rules import prometheus_binary
from tests.pods.fake_kube import FakeKubeApi
from tests.pods.test_watch import write_kubeconfig

try:
    import helm_python as helm
    import yaml
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    if os.environ.get("CI"):
        raise ImportError(
            f"these tests need the 'chart' extra and CI must install it: {exc}"
        ) from exc
    pytest.skip(
        f"these tests need the 'chart' extra (pip install -e '.[test,chart]'): {exc}",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hami-trio"
DASHBOARD = ROOT / "deploy" / "grafana" / "hami-trio.json"
NODE = "node-a"
AGENT_NAMESPACE = "hami-system"
AGENT_POD = "hami-trio-x7k2p"
GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
SCRAPE_SECONDS = 1
# Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval).
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS}s"
GIB = 1 << 30

# Metrics the dashboard uses that this test cannot make the agent export; an expression that
# selects one of them must parse and return nothing (if it returned data, the entry is stale).
NO_DATA_HERE = {
    "hami_host_gpu_memory_used_bytes": "host GPU metrics come from NVML: no GPU and driver here",
    "hami_host_gpu_utilization_ratio": "host GPU metrics come from NVML: no GPU and driver here",
    "hami_host_gpu_memory_controller_utilization_ratio": "from NVML: no GPU and driver here",
}

# Alerts whose condition the fixture creates (pending or firing), with labels they must carry.
ACTIVE = {
    "HamiTrioContainerNearMemoryLimit": {"namespace": "team-a", "pod": "train-0", "node": NODE},
    "HamiTrioLockParentRefused": {"node": NODE, "namespace": AGENT_NAMESPACE},
    "HamiTrioBrokerPressure": {"node": NODE, "outcome": "timeout"},
    # infer-0's process slot has host PID 0; train-0's is known
    "HamiTrioContainerHostPidUnknown": {"namespace": "team-b", "pod": "infer-0", "node": NODE},
}
# Alerts whose condition is absent here: the agent is up, synced and ticking, nothing failed.
INACTIVE = frozenset(
    {
        "HamiTrioAgentDown",
        "HamiTrioPodWatchNotSynced",
        "HamiTrioMonitorNotTicking",
        "HamiTrioBrokerPeerErrors",
        "HamiTrioMigLockDirUnsafe",
        "HamiTrioRemovalsFailing",
        "HamiTrioRemovalsBacklogged",
        "HamiTrioCollectorErrors",
        "HamiTrioForeignMonitor",
        "HamiTrioForeignBroker",
    }
)


# --- the dashboard's expressions ------------------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # collapsed rows nest their panels


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query")
    if isinstance(query, dict):  # newer Grafana: {"query": "...", "refId": ...}
        query = query.get("query")
    assert isinstance(query, str), f"variable {variable['name']}: no query"
    return query


_LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)", re.DOTALL)


def dashboard_targets() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets") or []:
            if target.get("expr", "").strip():
                found.append((f"{panel['title']} [{target.get('refId', '?')}]", target["expr"]))
    assert found, "the dashboard has no PromQL targets"
    return found


def dashboard_variables() -> list[tuple[str, str, str]]:
    """(name, PromQL, label) for every ``label_values(expr, label)`` query variable, in order."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.fullmatch(_variable_query(variable).strip())
        assert match, f"variable {variable['name']}: expected label_values(expr, label)"
        found.append((variable["name"], match.group(1), match.group(2)))
    return found


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def fill(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's ``$name``/``${name}`` replaced; every variable must be known."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"unknown variable ${name} in {expr}"
        return values[name]

    return _VARIABLE.sub(one, expr)


def grafana_regex_escape(value: str) -> str:
    """A variable value as Grafana's Prometheus data source puts it into ``=~"..."``: regex
    metacharacters escaped, the backslash doubled for the PromQL string."""
    return re.sub(r"([\\^$*+?.()|\[\]{}])", r"\\\\\1", value)


def _selects(expr: str, name: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) is not None


def exempt_reason(expr: str) -> str | None:
    for name, reason in NO_DATA_HERE.items():
        if _selects(expr, name):
            return reason
    return None


def test_fill_replaces_every_form() -> None:
    values = {"node": "a", "__rate_interval": "4s"}
    assert fill('x{node=~"$node"}[$__rate_interval] ${node} ${node:regex}', values) == (
        'x{node=~"a"}[4s] a a'
    )
    with pytest.raises(AssertionError, match=r"unknown variable \$pod"):
        fill('x{pod=~"$pod"}', values)


def test_grafana_regex_escape() -> None:
    assert grafana_regex_escape("node-a") == "node-a"
    assert grafana_regex_escape("a.b+c") == "a\\\\.b\\\\+c"


def test_exemptions_match_whole_names() -> None:
    assert exempt_reason('hami_host_gpu_utilization_ratio{node=~"$node"}') is not None
    assert exempt_reason("hami_host_gpu_utilization_ratio_x") is None


# --- the running stack ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class KubeThread:
    """The fake API server, served by trio in a thread of its own."""

    def __init__(self) -> None:
        self.fake = FakeKubeApi()
        self.uids: dict[str, str] = {}
        self._started = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(20), "the fake API server did not start"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._token = trio.lowlevel.current_trio_token()
                self._scope = nursery.cancel_scope
                await nursery.start(self.fake.serve)
                for name, namespace, allocated in (
                    ("train-0", "team-a", f"{GPU},NVIDIA,8192,40:;"),
                    ("infer-0", "team-b", f"{GPU},NVIDIA,4096,10:;"),
                ):
                    self.uids[name] = self.fake.add_pod(
                        name,
                        namespace=namespace,
                        labels={"hami.io/vgpu-node": NODE},
                        annotations={"hami.io/vgpu-devices-allocated": allocated},
                    )
                self._started.set()

        try:
            trio.run(main)
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc
            self._started.set()

    def stop(self) -> None:
        if self._token is not None and self._scope is not None:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(timeout=20)
        assert not self._thread.is_alive()
        if self._error is not None:
            raise self._error


class BrokerTraffic:
    """Until stopped: a broker exchange every 50 ms, and every second a connection that sends
    nothing (closed at the exchange deadline: a ``timeout``).  Both go on while Prometheus
    scrapes, so the counters rise between samples (an ``increase`` sees nothing that happened
    before the first scrape)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.answers = 0
        self.timeouts = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._exchanges,), daemon=True),
            threading.Thread(target=self._guarded, args=(self._silent,), daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _guarded(self, loop: Any) -> None:
        try:
            loop()
        except BaseException as exc:  # re-raised by stop()
            self.errors.append(exc)

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(self.path))
        return sock

    def _exchanges(self) -> None:
        while not self._stop.wait(0.05):
            with self._connect() as sock:
                sock.sendall(VALID_REQUEST)
                answer = sock.recv(64)
                assert answer == encode_response(os.getpid()), answer  # this caller's own PID
                self.answers += 1

    def _silent(self) -> None:
        while not self._stop.wait(1):
            with self._connect() as sock:
                if sock.recv(64) == b"":  # closed at the deadline without an answer
                    self.timeouts += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=20)
        if self.errors:
            raise self.errors[0]


@dataclass
class Stack:
    prometheus_port: int
    agent_port: int
    job: str
    rules: list[dict[str, Any]]
    traffic: BrokerTraffic

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=20) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as error:
            with error:
                raw = error.read()
            try:
                body = json.loads(raw)
            except ValueError:  # e.g. 503 "Service Unavailable" while the TSDB starts
                raise AssertionError(f"{path}: HTTP {error.code}: {raw[:200]!r}") from None
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar", "matrix"), data
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)


def render_chart() -> dict[str, dict[str, Any]]:
    """The chart's ServiceMonitor, PrometheusRule and Service, rendered like ``helm template``."""
    values = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=values, name="hami-trio", namespace=AGENT_NAMESPACE)
    docs = {}
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            for doc in yaml.safe_load_all(text):
                if doc and doc["kind"] in ("ServiceMonitor", "PrometheusRule", "Service"):
                    docs[doc["kind"]] = doc
    return docs


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def scrape_config(monitor: dict[str, Any], job: str, agent_port: int) -> dict[str, Any]:
    """The scrape job prometheus-operator makes of the ServiceMonitor's one endpoint, for one
    agent pod on ``NODE`` (its target labels as the operator sets them)."""
    (endpoint,) = monitor["spec"]["endpoints"]
    return {
        "job_name": job,
        "honor_labels": endpoint["honorLabels"],
        "metrics_path": endpoint["path"],
        "scrape_interval": f"{SCRAPE_SECONDS}s",
        "scrape_timeout": f"{SCRAPE_SECONDS}s",
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{agent_port}"],
                "labels": {
                    "__meta_kubernetes_pod_node_name": NODE,
                    "namespace": AGENT_NAMESPACE,
                    "pod": AGENT_POD,
                    "container": "agent",
                    "service": job,
                    "endpoint": endpoint["port"],
                },
            }
        ],
        "relabel_configs": [
            {_snake(key): value for key, value in relabeling.items()}
            for relabeling in endpoint["relabelings"]
        ],
    }


def write_hook(hook: Path, uids: dict[str, str]) -> None:
    for name in (f"{uids['train-0']}_main", f"{uids['infer-0']}_main", f"{uids['infer-0']}_side"):
        (hook / "containers" / name).mkdir(parents=True)
    # train-0: 95 % of its limit, a v1 region with a kernel launched 10 s ago, its process's
    # host PID known (this test's own: alive), a core limit.
    write_region(
        hook / "containers" / f"{uids['train-0']}_main" / "a.cache",
        RegionSpec(
            uuids=[GPU],
            limits=[8 * GIB],
            sm_limits=[40],
            procs=[
                ProcSlot(
                    pid=11,
                    hostpid=os.getpid(),
                    used=[MemoryUse(total=int(7.6 * GIB))],
                    util=[UtilUse(sm_util=40)],
                )
            ],
            last_kernel_time=int(time.time()) - 10,
        ),
    )
    # infer-0: a quarter of its limit; HAMi-core never learned its process's host PID.
    write_region(
        hook / "containers" / f"{uids['infer-0']}_main" / "b.cache",
        RegionSpec(
            uuids=[GPU],
            limits=[4 * GIB],
            procs=[
                ProcSlot(pid=12, hostpid=0, used=[MemoryUse(total=GIB)], util=[UtilUse(sm_util=10)])
            ],
        ),
    )
    # A file too small to be a region: rejected by the lister (a rejection reason series).
    (hook / "containers" / f"{uids['infer-0']}_side" / "c.cache").write_bytes(b"\x01" * 16)


def wait_for(what: str, check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (AssertionError, OSError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {last}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = prometheus_binary("prometheus")
    chart = render_chart()
    job = chart["Service"]["metadata"]["name"]
    base = tmp_path_factory.mktemp("prom")
    kube = KubeThread()
    kube.start()
    try:
        hook = base / "hook"
        write_hook(hook, kube.uids)
        lock_parent = base / "vgpulock"
        lock_parent.mkdir(mode=0o755)  # must be 1777: refused, hami_trio_lock_parent_ok 0
        lock_parent.chmod(0o755)
        socket_path = base / "hostpid" / "broker.sock"
        flags = [
            f"--hook-path={hook}",
            f"--mig-lock-path={base / 'mig' / 'mig.lock'}",
            f"--lock-parent-path={lock_parent}",
            f"--broker-socket-path={socket_path}",
            f"--broker-lock-path={base / 'hostpid-lock' / 'broker.lock'}",
            "--broker-exchange-deadline=0.2",
            "--metrics-bind-address=127.0.0.1:0",
            "--interval=0.2",
        ]
        env = agent_env(
            {
                "NODE_NAME": NODE,
                "KUBECONFIG": write_kubeconfig(base / "kc", f"http://127.0.0.1:{kube.fake.port}"),
                "LIBVGPU_HOSTPID_BROKER": "1",
            }
        )
        with AgentProcess(flags, env) as agent:
            agent_port = agent.wait_ready()
            wait_until(lambda: http_get(agent_port, "/readyz")[0] == 200, what="agent readiness")
            traffic = BrokerTraffic(socket_path)
            traffic.start()
            rules_file = base / "rules.yaml"
            rules_file.write_text(yaml.safe_dump(chart["PrometheusRule"]["spec"]))
            config = {
                "global": {
                    "scrape_interval": f"{SCRAPE_SECONDS}s",
                    "evaluation_interval": f"{SCRAPE_SECONDS}s",
                },
                "rule_files": [str(rules_file)],
                "scrape_configs": [scrape_config(chart["ServiceMonitor"], job, agent_port)],
            }
            (base / "prometheus.yml").write_text(yaml.safe_dump(config))
            port = free_port()
            log = (base / "prometheus.log").open("w")
            server = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={base / 'prometheus.yml'}",
                    f"--storage.tsdb.path={base / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=agent_env(),
            )
            rules = [r for g in chart["PrometheusRule"]["spec"]["groups"] for r in g["rules"]]
            running = Stack(port, agent_port, job, rules, traffic)
            try:

                def has_data() -> bool:
                    assert server.poll() is None, (base / "prometheus.log").read_text()
                    # Enough samples for every rate over RATE_INTERVAL, and rules evaluated.
                    samples = running.query(
                        f"count_over_time(hami_trio_broker_exchanges_total[{RATE_INTERVAL}])"
                    )
                    groups = running.api("rules")["groups"]
                    return (
                        bool(samples)
                        and min(float(s["value"][1]) for s in samples) >= 3
                        and bool(running.query("hami_vgpu_memory_used_bytes"))
                        and all(
                            not r["lastEvaluation"].startswith("0001")
                            for g in groups
                            for r in g["rules"]
                        )
                    )

                wait_for("prometheus to scrape the agent and evaluate the rules", has_data)
                yield running
            finally:
                traffic.stop()
                server.terminate()
                try:
                    server.wait(timeout=20)
                finally:
                    if server.poll() is None:
                        server.kill()
                        server.wait()
                    log.close()
            assert agent.stop() == 0
    finally:
        kube.stop()


# --- the target ---------------------------------------------------------------------------


def test_the_target_is_up_with_the_chart_labels(stack: Stack) -> None:
    (target,) = stack.api("targets")["activeTargets"]
    assert target["health"] == "up", target
    assert target["labels"]["job"] == stack.job
    assert target["labels"]["node"] == NODE  # the ServiceMonitor's relabeling
    assert stack.query(f'up{{job="{stack.job}", node="{NODE}"}} == 1')


def test_honor_labels_keeps_the_tenants_labels(stack: Stack) -> None:
    containers = stack.query("hami_vgpu_memory_limit_bytes")
    assert {(s["metric"]["namespace"], s["metric"]["pod"]) for s in containers} == {
        ("team-a", "train-0"),
        ("team-b", "infer-0"),
    }
    for sample in containers:
        assert sample["metric"]["node"] == NODE
        assert not any(label.startswith("exported_") for label in sample["metric"])
    # The agent's own series keep the target's labels (the agent pod's namespace and name).
    (build,) = stack.query("hami_build_info")
    assert build["metric"]["namespace"] == AGENT_NAMESPACE
    assert build["metric"]["pod"] == AGENT_POD
    # Every series has the node.
    assert stack.query('count({__name__=~"hami_.+", node!~".+"})') == []


# --- every dashboard expression ------------------------------------------------------------


def variable_values(stack: Stack) -> dict[str, dict[str, str]]:
    """Variable assignments to try: Grafana's "All" and the values the queries return."""
    every = {"__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE_SECONDS}s"}
    chosen = dict(every)
    for name, expr, label in dashboard_variables():
        every[name] = ".*"
        result = stack.query(fill(expr, chosen))
        values = sorted({s["metric"][label] for s in result if label in s["metric"]})
        assert values, f"variable {name}: {expr} returns no {label!r} values"
        chosen[name] = grafana_regex_escape(values[0])
    return {"all": every, "chosen": chosen}


@pytest.mark.parametrize(("where", "expr"), dashboard_targets(), ids=lambda x: str(x)[:60])
def test_every_dashboard_expression_returns_data(stack: Stack, where: str, expr: str) -> None:
    for selection, values in variable_values(stack).items():
        query = fill(expr, values)
        result = stack.query(query)  # status success: it parsed and evaluated
        reason = exempt_reason(expr)
        if reason is not None:
            assert result == [], f"{where}: data although exempt ({reason}); drop the exemption"
        else:
            assert result, f"{where} ({selection}): no data for {query}"


def test_every_variable_query_returns_values(stack: Stack) -> None:
    chosen = variable_values(stack)["chosen"]
    assert {"node", "namespace", "pod"} <= chosen.keys()
    assert chosen["node"] == NODE
    assert chosen["namespace"] in {"team-a", "team-b"}


# --- the alert rules -----------------------------------------------------------------------


def test_every_rule_is_healthy_and_evaluates(stack: Stack) -> None:
    groups = stack.api("rules")["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in stack.rules}
    for name, rule in loaded.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        assert not rule.get("lastError"), name
    for rule in stack.rules:
        stack.query(rule["expr"])  # parses and evaluates against the live agent's series


def test_the_alerts_this_node_earns_are_active(stack: Stack) -> None:
    def active() -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for alert in stack.api("alerts")["alerts"]:
            assert alert["state"] in ("pending", "firing")
            found.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return found

    def all_active() -> bool:
        missing = ACTIVE.keys() - active().keys()
        assert not missing, f"not active: {sorted(missing)}; active: {active()}"
        return True

    wait_for("the alerts to become active", all_active, timeout=15)
    alerts = active()
    assert not INACTIVE & alerts.keys(), alerts
    for name, labels in ACTIVE.items():
        assert any(labels.items() <= got.items() for got in alerts[name]), (name, alerts[name])
    assert {a["pod"] for a in alerts["HamiTrioContainerHostPidUnknown"]} == {"infer-0"}
    # Only the container over 90 % of its limit.
    assert {a["pod"] for a in alerts["HamiTrioContainerNearMemoryLimit"]} == {"train-0"}
    # Only the container whose process has no host PID (train-0's is this test's own PID).
    assert {a["pod"] for a in alerts.get("HamiTrioContainerHostPidUnknown", [])} <= {"infer-0"}
    assert stack.traffic.answers > 0
    assert stack.traffic.timeouts > 0
    assert stack.traffic.errors == []
