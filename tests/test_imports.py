"""What each process of hami-trio imports: the memory floor, kept by structure, not by timing.

Importing is most of what an idle agent costs: kubernetes-asyncio (its model package alone is
some 850 modules), aiohttp and trio-asyncio add about 50 MiB of RSS to a process whose own
floor is about 32 MiB.  These tests run the real command in a fresh interpreter and read its
``sys.modules`` when it exits, so a top-level import added anywhere on the path shows up here
as a named module, whatever the machine's memory figures do (those are in
bench/agent_lifecycle.py and bench/monitor_scale.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.agent.agent import AgentProcess, agent_env

#: Never in a process that does not use them: the Kubernetes client stack (only the pod watch
#: of a Kubernetes-configured agent), NVML (only a scrape that samples the host's GPUs), the
#: test and demo-only libraries and rooms (never in the agent at all).
HEAVY: tuple[str, ...] = (
    "kubernetes_asyncio",
    "aiohttp",
    "trio_asyncio",
    "asyncio",
    "yaml",
    "pynvml",
    "hypothesis",
    "hypercorn",
    "hami_trio.pods.watch",
    "hami_trio.demo",
    "hami_trio.testing",
)

# Runs the hami-trio command line in this interpreter and writes its modules on exit.
_PROBE = """
import atexit, json, sys
def _dump(path=sys.argv.pop(1)):
    with open(path, "w") as out:
        json.dump(sorted(sys.modules), out)
atexit.register(_dump)
from hami_trio.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def heavy_modules(modules: Iterable[str], heavy: Iterable[str] = HEAVY) -> list[str]:
    """The top packages of ``heavy`` that ``modules`` holds (a package or any submodule)."""
    loaded = set(modules)
    return [
        name
        for name in heavy
        if name in loaded or any(module.startswith(name + ".") for module in loaded)
    ]


def imported_by(code: str) -> list[str]:
    """``sys.modules`` of a fresh interpreter after it ran ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=agent_env()
    ).stdout
    modules: list[str] = json.loads(out.splitlines()[-1])
    return modules


def test_the_idle_agent_without_kubernetes_imports_nothing_heavy(tmp_path: Path) -> None:
    """``hami-trio run --no-kubernetes``, broker on, from start through ready to SIGTERM."""
    (tmp_path / "hook" / "containers").mkdir(parents=True)
    dump = tmp_path / "modules.json"
    args = [
        "--no-kubernetes",
        f"--hook-path={tmp_path / 'hook'}",
        f"--broker-socket-path={tmp_path / 'broker' / 'broker.sock'}",
        f"--mig-lock-path={tmp_path / 'mig' / 'hami-mig-apply.lock'}",
        "--metrics-bind-address=127.0.0.1:0",
        "--interval=0.05",
    ]
    env = agent_env({"LIBVGPU_HOSTPID_BROKER": "1"})
    with AgentProcess(args, env=env, python_args=("-c", _PROBE, str(dump))) as agent:
        agent.wait_ready()
        assert agent.stop() == 0, agent.output()
    modules = json.loads(dump.read_text())
    assert "hami_trio.agent.service" in modules  # the probe saw the agent run
    assert "hami_trio.broker.server" in modules
    assert heavy_modules(modules) == []


def test_the_command_line_and_the_package_import_nothing_heavy() -> None:
    modules = imported_by("import hami_trio, hami_trio.cli.main\nhami_trio.cli.main.build_parser()")
    assert "hami_trio.cli.run" in modules
    assert heavy_modules(modules) == []


def test_the_package_namespace_loads_its_re_exports_on_first_use() -> None:
    modules = imported_by("import hami_trio")
    assert heavy_modules(modules, ("trio", "prometheus_client", "hami_trio.agent", *HEAVY)) == []
    assert "hami_trio.broker.server" in imported_by("import hami_trio\nhami_trio.serve_broker")


def test_the_monitor_alone_imports_no_kubernetes_and_no_nvml() -> None:
    modules = imported_by("import hami_trio.monitor.loop, hami_trio.metrics.collector")
    assert heavy_modules(modules) == []


def test_the_check_names_what_the_pod_watch_pulls_in() -> None:
    """The pod watch is where the Kubernetes stack lives: the check sees it there."""
    found = heavy_modules(imported_by("import hami_trio.pods.watch"))
    assert {"kubernetes_asyncio", "aiohttp", "trio_asyncio", "hami_trio.pods.watch"} <= set(found)
    assert heavy_modules(["aiohttpx", "kubernetes_asyncio_extra"]) == []


def test_a_client_command_loads_neither_trio_nor_the_agent(tmp_path: Path) -> None:
    """``hami-trio hostpid`` (run inside pods) imports only the broker's client side."""
    dump = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", _PROBE, str(dump), "hostpid", "--socket-path", "/nonexistent"],
        capture_output=True,
        env=agent_env({"LIBVGPU_HOSTPID_BROKER": "1"}),
        check=False,
    )
    modules = json.loads(dump.read_text())
    assert "hami_trio.broker.client" in modules
    assert heavy_modules(modules, ("trio", "prometheus_client", "hami_trio.agent", *HEAVY)) == []
