"""The rooms of the package and which way imports may run (docs/architecture.md).

Every module of ``hami_trio`` is parsed (``ast``, nothing imported) and every import it makes
- at the top, inside a function, under ``TYPE_CHECKING`` - is checked against three rules:

1. imports run downward only: cli -> demo -> agent / testing -> features -> http -> base;
2. the features (broker, monitor, pods, metrics, allocation) do not import each other, except
   through the seams the agent wires, listed in :data:`SEAMS` with the reason for each;
3. the pure cores import no trio, no asyncio, no sockets, processes, files or clocks, and
   from hami_trio only other pure cores.

The checkers take the import map as an argument, so the last tests can show each of them
failing on a map with one forbidden import in it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import hami_trio

PACKAGE = Path(hami_trio.__file__).parent

#: Layer of each room: a module may import its own room and the rooms of lower layers.
LAYERS: Mapping[str, int] = {
    # base: no hami_trio room below them
    "errors": 0,
    "logs": 0,
    "_fs": 0,
    "_version": 0,
    "goparse": 0,
    "_trio": 0,
    "_lazy": 0,
    "_text": 0,
    # the HTTP server the metrics port and the debug view run on: base rooms only
    "http": 1,
    # features
    "broker": 2,
    "monitor": 2,
    "pods": 2,
    "metrics": 2,
    "allocation": 2,
    # what composes features
    "testing": 3,
    "agent": 3,
    "demo": 4,
    "cli": 5,
    # the package namespace (re-exports) and ``python -m hami_trio``
    "(api)": 6,
}

FEATURE_LAYER = 2
FEATURES = frozenset(room for room, layer in LAYERS.items() if layer == FEATURE_LAYER)

#: The only imports from one feature into another, each with its reason.
SEAMS: Mapping[tuple[str, str], str] = {
    ("hami_trio.monitor.lister", "hami_trio.pods.source"): (
        "the lister asks the PodSource protocol which pods are live; the agent passes it in"
    ),
    ("hami_trio.monitor.loop", "hami_trio.pods.source"): (
        "the monitor's configuration and tick take the same PodSource (protocol and PodInfo)"
    ),
    ("hami_trio.monitor.scope", "hami_trio.pods.source"): (
        "the feedback's grants are looked up per pod in the same PodSource (PodInfo)"
    ),
    ("hami_trio.metrics.collector", "hami_trio.pods.source"): (
        "the collector labels rows with the pods of the PodSource the agent passes in"
    ),
    ("hami_trio.metrics.collector", "hami_trio.monitor.state"): (
        "the collector reads the monitor's containers as the pure values they are (ContainerState)"
    ),
    ("hami_trio.metrics.collector", "hami_trio.pods.migalloc"): (
        "MIG rows come from the pods' allocation annotation, decoded by the pure decoder"
    ),
    ("hami_trio.metrics.exportstate", "hami_trio.pods.source"): (
        "whether a container is exported depends on its pod (PodInfo: labels, containers, phase)"
    ),
    ("hami_trio.metrics.pods", "hami_trio.pods.source"): (
        "the pod collector renders the PodSource's pods (info, labels, allocations)"
    ),
    ("hami_trio.metrics.pods", "hami_trio.pods.allocated"): (
        "allocation rows come from HAMi's vgpu-devices-allocated annotation, decoded purely"
    ),
}

#: What the demo may import besides base rooms, the agent and testing, with the reason.
DEMO_EXTRA: Mapping[str, str] = {
    "hami_trio.broker.client": (
        "the demo's simulated workloads are the broker's clients, as HAMi-core is in a container"
    ),
}

#: Pure cores: bytes and values in, values out.
PURE_CORES = frozenset(
    {
        "hami_trio.errors",
        "hami_trio._text",
        "hami_trio.goparse",
        "hami_trio.broker.protocol",
        "hami_trio.monitor.layout",
        "hami_trio.monitor.snapshot",
        "hami_trio.monitor.feedback",
        "hami_trio.monitor.insight",
        "hami_trio.monitor.state",
        "hami_trio.allocation.constants",
        "hami_trio.allocation.response",
        "hami_trio.pods.source",
        "hami_trio.pods.access",
        "hami_trio.pods.decode",
        "hami_trio.pods.migalloc",
        "hami_trio.pods.allocated",
        "hami_trio.pods.priority",
        "hami_trio.metrics.exportstate",
        "hami_trio.agent.debug",
    }
)

#: Top-level modules a pure core must not import: event loops, I/O, processes, time, logging.
IMPURE = frozenset(
    {
        "trio",
        "trio_asyncio",
        "asyncio",
        "socket",
        "_socket",
        "ssl",
        "subprocess",
        "os",
        "io",
        "select",
        "selectors",
        "fcntl",
        "mmap",
        "shutil",
        "tempfile",
        "pathlib",
        "threading",
        "signal",
        "resource",
        "ctypes",
        "time",
        "logging",
        "urllib",
        "http",
        "aiohttp",
        "kubernetes_asyncio",
        "h11",
        "hypercorn",
        "pynvml",
        "inotify_simple",
        "prometheus_client",
    }
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_map() -> dict[str, list[str]]:
    """Every module of hami_trio -> the absolute names it imports (all of them, anywhere)."""
    result: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        imported: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: use absolute imports"
                assert node.module is not None
                if node.module == "__future__":
                    continue
                imported.append(node.module)
                # ``from hami_trio.x import y`` may import the submodule y
                imported += [
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if f"{node.module}.{alias.name}".replace(".", "/") + ".py" in _FILES_RELATIVE
                ]
        result[name] = imported
    return result


_FILES_RELATIVE = frozenset(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py"))


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "(api)"
    return parts[1]


def layering_violations(imports: Mapping[str, list[str]]) -> list[str]:
    """Rules 1 and 2 (and the demo's narrower door)."""
    problems = []
    for module, names in imports.items():
        here = room(module)
        for name in names:
            if name.split(".")[0] != "hami_trio":
                continue
            there = room(name)
            if there == here:
                continue
            if here == "(api)" or there == "(api)":
                if there == "(api)" and name == "hami_trio" and here != "(api)":
                    problems.append(f"{module} imports the package namespace {name}")
                continue
            if LAYERS[there] > LAYERS[here] or LAYERS[there] == LAYERS[here] > FEATURE_LAYER:
                problems.append(f"{module} ({here}) imports upward or sideways: {name}")
            elif here in FEATURES and there in FEATURES and (module, name) not in SEAMS:
                problems.append(f"{module} imports another feature outside the seams: {name}")
            elif there == "testing" and here != "demo":
                problems.append(f"{module} imports the test helpers: {name}")
            elif (
                here == "demo"
                and LAYERS[there] == FEATURE_LAYER
                and not any(name == allowed for allowed in DEMO_EXTRA)
            ):
                problems.append(f"{module}: the demo goes through the agent, not {name}")
    return problems


def purity_violations(imports: Mapping[str, list[str]]) -> list[str]:
    """Rule 3."""
    problems = []
    for module in sorted(PURE_CORES):
        for name in imports[module]:
            top = name.split(".")[0]
            if top in IMPURE:
                problems.append(f"pure core {module} imports {name}")
            elif top == "hami_trio" and name not in PURE_CORES:
                problems.append(f"pure core {module} imports the non-pure {name}")
    return problems


def test_every_room_is_known() -> None:
    rooms = {room(module) for module in import_map()}
    assert rooms == set(LAYERS)


def test_imports_run_downward_and_features_meet_only_at_the_seams() -> None:
    assert layering_violations(import_map()) == []


def test_every_seam_is_still_used() -> None:
    imports = import_map()
    unused: list[tuple[str, str] | str] = [
        pair for pair in SEAMS if pair[1] not in imports.get(pair[0], [])
    ]
    unused += [name for name in DEMO_EXTRA if not any(name in imports[m] for m in imports)]
    assert unused == []


def test_pure_cores_import_no_io_and_no_event_loop() -> None:
    assert purity_violations(import_map()) == []


def test_the_rules_catch_a_violation() -> None:
    imports = import_map()
    upward = {**imports, "hami_trio.monitor.region": ["hami_trio.agent.service"]}
    assert layering_violations(upward) == [
        "hami_trio.monitor.region (monitor) imports upward or sideways: hami_trio.agent.service"
    ]
    sideways = {**imports, "hami_trio.broker.server": ["hami_trio.monitor.loop"]}
    assert layering_violations(sideways) == [
        "hami_trio.broker.server imports another feature outside the seams: hami_trio.monitor.loop"
    ]
    helper = {**imports, "hami_trio.cli.run": ["hami_trio.testing.regions"]}
    assert layering_violations(helper) == [
        "hami_trio.cli.run imports the test helpers: hami_trio.testing.regions"
    ]
    server = {**imports, "hami_trio.http.server": ["hami_trio.metrics.scrapecache"]}
    assert layering_violations(server) == [
        "hami_trio.http.server (http) imports upward or sideways: hami_trio.metrics.scrapecache"
    ]
    demo = {**imports, "hami_trio.demo.runner": ["hami_trio.monitor.loop"]}
    assert layering_violations(demo) == [
        "hami_trio.demo.runner: the demo goes through the agent, not hami_trio.monitor.loop"
    ]
    impure = {**imports, "hami_trio.pods.decode": ["json", "trio"]}
    assert purity_violations(impure) == ["pure core hami_trio.pods.decode imports trio"]
    reaches_out = {**imports, "hami_trio.monitor.feedback": ["hami_trio.monitor.region"]}
    assert purity_violations(reaches_out) == [
        "pure core hami_trio.monitor.feedback imports the non-pure hami_trio.monitor.region"
    ]
