"""deploy/Dockerfile built with podman and run exactly as the Helm chart runs it.

How this works, once per session (module fixtures):

1. **Base image.** No container registry is reachable, so ``deploy/base-image.sh`` makes the
   Dockerfile's base with mmdebstrap (Debian bookworm minbase with python3 and pip) and
   ``podman import``s it.  The tag is a hash of that script, so a machine that already has it
   reuses it (a cache only: a fresh machine builds it).
2. **Build.** ``podman build`` of ``deploy/Dockerfile`` with that base as ``PYTHON_IMAGE``
   (``--network host`` and the host's CA bundle for pip, ``--runtime runc``).  The image is
   removed at the end of the module; the base is kept.
3. **Run.** The chart is rendered by real Helm (helm-python-sdk, like tests/deploy/
   test_chart.py) with the broker on and ``--no-kubernetes``, and its DaemonSet pod is turned
   into ``podman run`` flags by :func:`podman_run_argv`: host PID namespace, run as 0:0,
   read-only root filesystem, every capability dropped but the chart's, no-new-privileges,
   the default seccomp profile, the memory limit, the chart's command, args and environment,
   and every hostPath volume as a host directory under a temporary "node".  Anything in the
   pod spec the translation does not know fails the test, so a chart change cannot slip past.
   The container gets its own network namespace (as a pod does, without touching the host's
   firewall); the checks reach the metrics port from inside it with ``nsenter --net``.

Then the checks: ``/readyz`` 200; the process has exactly the chart's capabilities, no new
privileges, a seccomp filter, a read-only root and the host's PID namespace; the broker made
its directory 0711 and the socket 0666, both root's; 1000 C clients (clients/c), each in its
own PID and mount namespace with the broker directory bind-mounted read-only at
``.../vgpulock/hostpid`` and running as uid 65534, released at once, each get their own host
PID; a ``.cache`` file written as a tenant (uid 1000, mode 0600) shows up with its exact
values on ``/metrics``; SIGTERM -> exit status 0 and the socket removed.

Needs root, podman, runc and mmdebstrap (``.ci/run`` installs them) and a Debian mirror and
PyPI (the same network the venv install needs).  Without podman or root the tests skip with
the reason; in CI (``CI`` set) they fail instead.  The step times (base, build, start, storm)
are printed to the terminal.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.allocation.immutable import clear_immutable, is_immutable
from tests.clients.harness import Sandbox, build_c_client, make_sandbox, sandbox_command
from tests.sandbox import world_readable_dir

try:  # the region builder's home; it may move to hami_trio.testing
    from hami_trio.testing.regions import (
        MemoryUse,
        ProcSlot,
        RegionSpec,
        UtilUse,
        write_region,
    )
except ImportError:
    from hami_trio.testing.regions import MemoryUse, ProcSlot, RegionSpec, UtilUse, write_region

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hami-trio"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
BASE_SCRIPT = ROOT / "deploy" / "base-image.sh"
#: What the image test builds with (deploy/Dockerfile's VERSION, REVISION, SOURCE).
IMAGE_LABELS = {
    "version": "0.0.0-image-test",
    "revision": "0123456789abcdef0123456789abcdef01234567",
    "source": "https://example.org/hami-trio.git",
}
TOOLS = ("podman", "runc", "mmdebstrap", "nsenter", "unshare", "setpriv", "gcc")
NODE_NAME = "image-test-node"
STORM = 1000
# Capability numbers (linux/capability.h) of those the chart keeps with the broker on.
CAPS = {"DAC_OVERRIDE": 1, "FOWNER": 3, "LINUX_IMMUTABLE": 9}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the image test must run in CI: {reason}")
    pytest.skip(reason)


def _podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return result.stdout


def _ulimits() -> list[str]:
    # Root here has no CAP_SYS_RESOURCE: the runtime's default rlimits (above the hard limit)
    # cannot be set, so pass what the current limits allow.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return ["--ulimit", f"nofile={hard}:{hard}", "--ulimit", "nproc=4096:4096"]


class Steps:
    """Wall time of each step, written to the terminal as it ends (past pytest's capture, so
    CI's log has them on success too)."""

    def __init__(self, config: pytest.Config) -> None:
        self._capture = config.pluginmanager.get_plugin("capturemanager")
        self.seconds: dict[str, float] = {}

    def done(self, name: str, started: float, note: str = "") -> None:
        self.seconds[name] = time.monotonic() - started
        line = f"image test step: {name} {self.seconds[name]:.1f} s{note}"
        if self._capture is None:
            print(line)
            return
        with self._capture.global_and_fixture_disabled():
            sys.stderr.write(f"\n{line}\n")
            sys.stderr.flush()


# --- base image and build ------------------------------------------------------------------


@pytest.fixture(scope="module")
def steps(request: pytest.FixtureRequest) -> Steps:
    return Steps(request.config)


@pytest.fixture(scope="module")
def podman() -> None:
    if os.geteuid() != 0:
        _unavailable("needs root (euid 0) for podman, namespaces and bind mounts")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        _unavailable(f"not installed: {', '.join(missing)} (.ci/run installs them with apt)")
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        _unavailable(f"podman cannot run here: {info.stderr.strip()[-500:]}")


@pytest.fixture(scope="module")
def base_image(podman: None, steps: Steps) -> str:
    """The mmdebstrap base, tagged by a hash of its recipe (kept between runs)."""
    recipe = hashlib.sha256(BASE_SCRIPT.read_bytes()).hexdigest()[:16]
    tag = f"localhost/hami-trio-base:{recipe}"
    started = time.monotonic()
    cached = subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0
    if not cached:
        result = subprocess.run(
            ["sh", str(BASE_SCRIPT), "podman", tag],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, f"{BASE_SCRIPT.name} failed:\n{result.stderr[-4000:]}"
    steps.done("base", started, " (cached image reused)" if cached else " (mmdebstrap + import)")
    return tag


@pytest.fixture(scope="module")
def image(base_image: str, steps: Steps) -> Iterator[str]:
    """deploy/Dockerfile built on the base; removed at the end of the module."""
    tag = f"localhost/hami-trio:image-test-{os.getpid()}"
    started = time.monotonic()
    # The base pinned as a release pins it: the tag with its digest beside it.
    digest = _podman("image", "inspect", "--format", "{{.Digest}}", base_image).strip()
    _podman(
        "build",
        "--quiet",
        "--layers=false",  # no intermediate images left behind
        "--runtime",
        "runc",
        "--network",
        "host",
        "-v",
        "/etc/ssl/certs:/etc/ssl/certs:ro",
        *_ulimits(),
        "--build-arg",
        f"PYTHON_IMAGE={base_image}@{digest}",
        *(f"--build-arg={k.upper()}={v}" for k, v in IMAGE_LABELS.items()),
        "-f",
        str(DOCKERFILE),
        "-t",
        tag,
        str(ROOT),
        timeout=600,
    )
    steps.done("build", started)
    try:
        yield tag
    finally:
        _podman("rmi", "--force", tag, check=False)


# --- the chart's pod as podman flags --------------------------------------------------------


def chart_daemonset() -> dict[str, Any]:
    """The chart's DaemonSet with the broker on and no Kubernetes (no API server here)."""
    try:
        import helm_python as helm
        import yaml
    except ImportError as exc:
        _unavailable(f"needs the 'chart' extra (pip install -e '.[test,chart]'): {exc}")
    values = {
        "devicePlugin": {"hostPIDBroker": {"enabled": True}},
        "extraArgs": ["--no-kubernetes"],
        # No NVIDIA container runtime on this machine: leave NVIDIA_VISIBLE_DEVICES unset.
        "nvidiaVisibleDevices": "",
    }
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=values, name="hami-trio", namespace="hami-system")
    (daemonset,) = [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] == "DaemonSet"
    ]
    return dict(daemonset)


# Pod and container fields that only the Kubernetes control plane acts on: scheduling,
# identity, probes' timing, rollout.  Everything else must be translated below.
_POD_IGNORED = {
    "serviceAccountName",
    "automountServiceAccountToken",
    "priorityClassName",
    "terminationGracePeriodSeconds",
    "nodeSelector",
    "tolerations",
    "affinity",
}
_CONTAINER_IGNORED = {"name", "image", "imagePullPolicy", "ports", "livenessProbe"}


@dataclass
class PodRun:
    """The ``podman run`` arguments of the chart's pod, and what the checks need to know."""

    argv: list[str]
    host_dirs: dict[str, Path]  # hostPath -> the directory standing in for it
    mounts: dict[str, Path] = field(default_factory=dict)  # mountPath -> host directory
    read_only: dict[str, bool] = field(default_factory=dict)  # mountPath -> readOnly
    ready_path: str = ""
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


def _memory_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def podman_run_argv(daemonset: dict[str, Any], node: Path, broker_dir: Path) -> PodRun:
    """Translate the DaemonSet's pod into ``podman run`` flags (image and args not included).

    Every hostPath volume becomes ``node/<hostPath>`` (created 0755, as the kubelet's
    DirectoryOrCreate does), except the broker's socket directory, which is ``broker_dir``
    (the sandbox's, which the C clients mount).

    Raises:
        AssertionError: the pod spec has a field this translation does not know.
    """
    pod = daemonset["spec"]["template"]["spec"]
    unknown = set(pod) - _POD_IGNORED - {"hostPID", "securityContext", "containers", "volumes"}
    assert not unknown, f"pod fields the image test does not translate: {sorted(unknown)}"
    (container,) = pod["containers"]
    argv = ["--runtime", "runc", "--network", "none", *_ulimits()]
    if pod.get("hostPID"):
        argv += ["--pid", "host"]

    pod_sc = dict(pod["securityContext"])
    assert pod_sc.pop("seccompProfile") == {"type": "RuntimeDefault"}  # podman's default
    assert pod_sc.pop("runAsNonRoot") is False
    argv += ["--user", f"{pod_sc.pop('runAsUser')}:{pod_sc.pop('runAsGroup')}"]
    assert not pod_sc, f"pod securityContext fields not translated: {sorted(pod_sc)}"

    sc = dict(container["securityContext"])
    assert sc.pop("privileged") is False
    if sc.pop("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    if sc.pop("readOnlyRootFilesystem"):
        # Kubernetes mounts no tmpfs of its own on /tmp, /run, /var/tmp; podman would.
        argv += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.pop("capabilities")
    argv += [f"--cap-drop={name}" for name in caps.pop("drop")]
    argv += [f"--cap-add={name}" for name in caps.pop("add")]
    assert not caps, f"capabilities fields not translated: {sorted(caps)}"
    assert not sc, f"container securityContext fields not translated: {sorted(sc)}"

    unknown = set(container) - _CONTAINER_IGNORED
    unknown -= {"command", "args", "env", "readinessProbe", "resources", "securityContext"}
    unknown -= {"volumeMounts"}
    assert not unknown, f"container fields the image test does not translate: {sorted(unknown)}"
    run = PodRun(argv=argv, host_dirs={})
    run.args = list(container["args"])
    argv += ["--entrypoint", json.dumps(container["command"])]
    for var in container["env"]:
        if "value" in var:
            value = var["value"]
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, var
            value = NODE_NAME
        run.env[var["name"]] = value
        argv += ["--env", f"{var['name']}={value}"]
    limits = container["resources"].get("limits", {})
    assert set(limits) <= {"memory"}, limits
    if "memory" in limits:
        argv += ["--memory", str(_memory_bytes(limits["memory"]))]

    (port,) = [
        p for p in container["ports"] if p["name"] == container["readinessProbe"]["httpGet"]["port"]
    ]
    run.port = int(port["containerPort"])
    run.ready_path = container["readinessProbe"]["httpGet"]["path"]

    socket_flag = next(a for a in run.args if a.startswith("--broker-socket-path="))
    socket_dir = os.path.dirname(socket_flag.split("=", 1)[1])
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        assert set(volume) == {"name", "hostPath"}, volume
        assert volume["hostPath"]["type"] == "DirectoryOrCreate", volume
        host_path = volume["hostPath"]["path"]
        if mount["mountPath"] == socket_dir:
            host = broker_dir
        else:
            host = node / host_path.lstrip("/")
            host.mkdir(mode=0o755, parents=True, exist_ok=True)
        run.host_dirs[host_path] = host
        run.mounts[mount["mountPath"]] = host
        run.read_only[mount["mountPath"]] = bool(mount.get("readOnly"))
        ro = ",ro=true" if mount.get("readOnly") else ""
        argv += ["--mount", f"type=bind,src={host},dst={mount['mountPath']}{ro}"]
    return run


# --- the running container ------------------------------------------------------------------


_HTTP_GET = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        status, body = r.status, r.read()
except urllib.error.HTTPError as e:
    status, body = e.code, e.read()
sys.stdout.write(f"{status}\\n")
sys.stdout.flush()
sys.stdout.buffer.write(body)
"""


@dataclass
class Agent:
    """The running container and the host directories behind its volumes."""

    name: str
    pid: int  # the agent's PID (host PID namespace: the host's PID)
    box: Sandbox
    run: PodRun

    @property
    def socket(self) -> Path:
        return self.box.host_socket

    def http_get(self, path: str) -> tuple[int, str]:
        """GET ``path`` on the container's metrics port, from inside its network namespace."""
        result = subprocess.run(
            [
                "nsenter",
                f"--net=/proc/{self.pid}/ns/net",
                sys.executable,
                "-c",
                _HTTP_GET,
                f"http://127.0.0.1:{self.run.port}{path}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode != 0:
            raise OSError(f"GET {path} failed: {result.stderr.strip()[-1000:]}")
        status, _, body = result.stdout.partition("\n")
        return int(status), body

    def logs(self) -> str:
        result = subprocess.run(
            ["podman", "logs", self.name], capture_output=True, text=True, check=False
        )
        return result.stdout + result.stderr

    def running(self) -> bool:
        state = _podman("inspect", "-f", "{{.State.Running}}", self.name, check=False)
        return state.strip() == "true"


def _container_pid(name: str) -> int:
    return int(_podman("inspect", "-f", "{{.State.Pid}}", name).strip())


@pytest.fixture(scope="module")
def agent(image: str, steps: Steps, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    daemonset = chart_daemonset()
    name = f"hami-trio-image-test-{os.getpid()}"
    node = tmp_path_factory.mktemp("node")
    with make_sandbox() as box:
        # The kubelet's DirectoryOrCreate makes 0755: the agent must tighten it itself.
        box.broker_dir.chmod(0o755)
        run = podman_run_argv(daemonset, node, box.broker_dir)
        # A prepared node's shared lock parent (the allocation path makes it root 01777).
        run.host_dirs["/tmp/vgpulock"].chmod(0o1777)
        started = time.monotonic()
        _podman("run", "--detach", "--name", name, *run.argv, image, *run.args)
        pid = 0
        try:
            pid = _container_pid(name)
            agent = Agent(name, pid, box, run)
            deadline = time.monotonic() + 60
            while True:
                try:
                    if agent.http_get(run.ready_path)[0] == 200:
                        break
                except OSError:
                    pass
                assert agent.running(), f"the container exited:\n{agent.logs()}"
                assert time.monotonic() < deadline, f"never ready:\n{agent.logs()}"
                time.sleep(0.2)
            steps.done("start to /readyz 200", started)
            yield agent
        finally:
            _podman("rm", "--force", "--time", "5", name, check=False)
            clear_immutable(node)  # the agent made vgpulock/hostpid immutable
            # Nothing of the container is left running (conmon reaps the agent).
            assert pid == 0 or not Path(f"/proc/{pid}").exists() or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _metrics(agent: Agent) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, text = agent.http_get("/metrics")
    assert status == 200
    return {
        (sample.name, frozenset(sample.labels.items())): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# --- checks ---------------------------------------------------------------------------------


def test_ready_and_confined_as_the_chart_says(agent: Agent) -> None:
    assert agent.http_get(agent.run.ready_path) == (
        200,
        "[+]broker ok\n[+]monitor ok\n[+]mig-lock-dir ok\n[+]lock-mount-point ok\n"
        "readyz check passed\n",
    )
    assert agent.http_get("/healthz") == (200, "ok\n")
    # Prepared at start, through the chart's writable mount and LINUX_IMMUTABLE.
    assert is_immutable(agent.run.host_dirs["/tmp/vgpulock"] / "hostpid")

    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines()
    )
    kept = sum(1 << bit for bit in CAPS.values())
    for field_name in ("CapEff", "CapPrm", "CapBnd"):
        assert int(status[field_name], 16) == kept, (field_name, status[field_name])
    assert int(status["CapInh"], 16) == 0
    assert int(status["CapAmb"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # a filter (podman's default profile)
    assert status["Uid"].split()[:2] == ["0", "0"]
    # The host's PID namespace (the broker's answers are host PIDs), not the host's network.
    assert os.readlink(f"/proc/{agent.pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    assert os.readlink(f"/proc/{agent.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    # The root filesystem is read-only, and each volume is read-only exactly where the chart
    # says so (/var/run is the base's symlink to /run: the kernel shows the resolved path).
    options = {
        line.split()[4]: set(line.split()[5].split(","))
        for line in Path(f"/proc/{agent.pid}/mountinfo").read_text().splitlines()
    }
    assert "ro" in options["/"], options["/"]
    assert agent.run.read_only, "the chart mounts nothing read-only?"
    for mount_path, read_only in agent.run.read_only.items():
        seen = (
            "/run/" + mount_path.removeprefix("/var/run/")
            if mount_path.startswith("/var/run/")
            else mount_path
        )
        assert ("ro" in options[seen]) is read_only, (mount_path, options[seen])
        assert ("rw" in options[seen]) is not read_only, (mount_path, options[seen])


def test_broker_directory_0711_and_socket_0666_both_roots(agent: Agent) -> None:
    directory = os.lstat(agent.box.broker_dir)
    assert stat.S_ISDIR(directory.st_mode)
    assert stat.S_IMODE(directory.st_mode) == 0o711  # was 0755, as the kubelet makes it
    assert (directory.st_uid, directory.st_gid) == (0, 0)
    sock = os.lstat(agent.socket)
    assert stat.S_ISSOCK(sock.st_mode)
    assert stat.S_IMODE(sock.st_mode) == 0o666
    assert (sock.st_uid, sock.st_gid) == (0, 0)
    assert sorted(os.listdir(agent.box.broker_dir)) == ["broker.sock"]


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _ns_pids(pid: int) -> tuple[int, ...]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(part) for part in line.split()[1:])
    raise AssertionError(f"/proc/{pid}/status has no NSpid line")


def test_storm_of_c_clients_each_in_own_namespaces_gets_its_host_pid(
    agent: Agent, steps: Steps
) -> None:
    """1000 C clients, each its own container: own PID and mount namespace, uid 65534.

    Each runs in the client tests' sandbox (tests/clients/harness.py): ``unshare`` makes the
    namespaces, the broker directory is bind-mounted read-only at ``.../vgpulock/hostpid``,
    ``setpriv`` drops to 65534 and execs the client, which is PID 1 there.  All sandboxes read
    their "go" line from one pipe, so one write releases them together.  Before the release
    the test reads each client's host PID from /proc; each must be told exactly that PID.
    """
    with world_readable_dir("ht-image-storm-") as work:
        client = build_c_client(work)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LIBVGPU_HOSTPID_BROKER": "1"}
        argv = sandbox_command(agent.box, [str(client), str(agent.box.client_socket)])
        gate_read, gate_write = os.pipe()
        procs: list[subprocess.Popen[bytes]] = []
        outputs: list[Path] = []
        started = time.monotonic()
        try:
            for number in range(STORM):
                out = work / f"{number}.out"
                outputs.append(out)
                with open(out, "wb") as stdout, open(work / f"{number}.err", "wb") as stderr:
                    procs.append(
                        subprocess.Popen(
                            argv, stdin=gate_read, stdout=stdout, stderr=stderr, env=env
                        )
                    )
            os.close(gate_read)
            gate_read = -1
            deadline = time.monotonic() + 120
            waiting = set(range(STORM))
            while waiting:
                waiting = {n for n in waiting if outputs[n].read_bytes() != b"ready\n"}
                for n in waiting:
                    assert procs[n].poll() is None, (work / f"{n}.err").read_text()
                assert time.monotonic() < deadline, f"{len(waiting)} sandboxes not ready"
                time.sleep(0.05)
            expected: list[int] = []
            mount_namespaces: set[str] = set()
            for proc in procs:
                (child,) = _children(proc.pid)
                assert _ns_pids(child) == (child, 1)  # PID 1 of its own namespace
                mount_namespaces.add(os.readlink(f"/proc/{child}/ns/mnt"))
                expected.append(child)
            assert len(mount_namespaces) == STORM
            assert os.readlink("/proc/self/ns/mnt") not in mount_namespaces
            steps.done(f"storm: {STORM} sandboxes ready", started)
            released = time.monotonic()
            # One line per sandbox; each shell's `read` takes bytes up to its first newline.
            os.write(gate_write, b"go\n" * STORM)
            codes = [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
            steps.done(f"storm: {STORM} clients answered", released)
        finally:
            if gate_read >= 0:
                os.close(gate_read)
            os.close(gate_write)
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        answers = [out.read_text().removeprefix("ready\n").strip() for out in outputs]
        failures = [
            f"client {n}: rc={codes[n]} out={answers[n]!r} "
            f"err={(work / f'{n}.err').read_text().strip()!r}"
            for n in range(STORM)
            if codes[n] != 0 or answers[n] != str(expected[n])
        ]
        assert not failures, f"{len(failures)} of {STORM} wrong:\n" + "\n".join(failures[:10])
    metrics = _metrics(agent)
    ok = metrics[("hami_trio_broker_exchanges_total", frozenset({("outcome", "ok")}))]
    assert ok >= STORM


def test_cache_file_of_a_tenant_shows_up_with_its_exact_values(agent: Agent) -> None:
    """A region written like a tenant's (uid 1000, 0700 directory, 0600 file): DAC_OVERRIDE
    is what lets the agent read it."""
    hook = agent.run.env["HOOK_PATH"].rstrip("/") + "/containers"
    containers = agent.run.mounts[hook]
    pod, name, gpu = "4f1c2e3a-0000-4000-8000-image0test01", "trainer", "GPU-image-test-0001"
    directory = containers / f"{pod}_{name}"
    directory.mkdir()
    region = directory / "1234.cache"
    limit = 6 * (1 << 30) + 12345
    used = MemoryUse(
        context_size=7 << 20, module_size=3 << 20, data_size=501 << 20, total=511 << 20
    )
    write_region(
        region,
        RegionSpec(
            uuids=[gpu],
            limits=[limit],
            sm_limits=[40],
            procs=[ProcSlot(pid=7, hostpid=4242, used=[used], util=[UtilUse(sm_util=37)])],
        ),
    )
    os.chown(region, 1000, 1000)
    region.chmod(0o600)
    os.chown(directory, 1000, 1000)
    directory.chmod(0o700)
    labels = frozenset(
        {
            ("namespace", ""),
            ("pod", pod),
            ("container", name),
            ("vdevice_index", "0"),
            ("device_uuid", gpu),
            ("zone", "vGPU"),
        }
    )
    expected = {
        "hami_vgpu_memory_limit_bytes": limit,
        "hami_vgpu_memory_used_bytes": used.total,
        "hami_container_device_memory_bytes": used.total,
        "hami_vgpu_memory_context_bytes": used.context_size,
        "hami_vgpu_memory_module_bytes": used.module_size,
        "hami_vgpu_memory_buffer_bytes": used.data_size,
        "hami_container_device_utilization_ratio": 37,
    }
    deadline = time.monotonic() + 30  # the monitor's tick is 5 s
    while True:
        metrics = _metrics(agent)
        found = {name: metrics.get((name, labels)) for name in expected}
        if found == expected:
            break
        assert time.monotonic() < deadline, f"on /metrics: {found}, expected {expected}"
        time.sleep(0.5)
    assert metrics[("hami_trio_monitor_containers", frozenset({("state", "exported")}))] == 1
    assert metrics[("hami_trio_lock_parent_ok", frozenset())] == 1
    assert metrics[("hami_trio_lock_mount_point_immutable", frozenset())] == 1


def test_sigterm_exits_0_and_removes_the_socket(agent: Agent) -> None:
    assert agent.running()
    _podman("kill", "--signal", "TERM", agent.name)
    code = _podman("wait", agent.name, timeout=60).strip()
    assert code == "0", f"exit status {code}:\n{agent.logs()}"
    assert not os.path.lexists(agent.socket)
    assert "agent stopped" in agent.logs()


def test_labels_say_what_it_is_built_from_and_version_prints_them(
    image: str, base_image: str
) -> None:
    labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", image))
    for key, value in IMAGE_LABELS.items():
        assert labels[f"org.opencontainers.image.{key}"] == value
    base = labels["org.opencontainers.image.base.name"]
    assert base.startswith(f"{base_image}@sha256:")  # pinned: tag and digest
    out = _podman(
        "run", "--rm", "--runtime", "runc", "--network", "none", *_ulimits(),
        "--entrypoint", "hami-trio", image, "version",
    )  # fmt: skip
    lines = out.splitlines()
    assert lines[1:5] == [f"image {k} {v}" for k, v in IMAGE_LABELS.items()] + [
        f"image base {base}"
    ]
    # No wheel file stayed in a layer: the build stage's wheels were mounted, not copied.
    history = _podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", image)
    assert "COPY --from=build" not in history
    assert "/wheels" not in _podman(
        "run", "--rm", "--runtime", "runc", "--network", "none", *_ulimits(),
        "--entrypoint", "sh", image, "-c", "ls -d /wheels 2>/dev/null; true",
    )  # fmt: skip
