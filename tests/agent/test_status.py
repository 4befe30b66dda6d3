"""``format_status`` (pure) over documents of the real builder, and ``status_address``.

The command against a real agent: tests/cli/test_status.py.
"""

from __future__ import annotations

import json

import pytest

from hami_trio.agent.debug import (
    DebugExtras,
    DebugLimits,
    PodWatchSummary,
    debug_state,
    render,
)
from hami_trio.agent.status import format_status, status_address
from hami_trio.errors import ConfigError
from hami_trio.goparse import BindAddress
from hami_trio.monitor.scope import Claim
from hami_trio.pods.source import StaticPodSource
from tests.agent.test_debug import (
    GPU_A,
    MONITOR,
    POD,
    Blocking,
    Decision,
    Device,
    loaded,
    two_gpus,
)


def test_the_table_shows_extras_devices_and_why() -> None:
    extras = DebugExtras(
        process_state=lambda key, pid: "unknown" if pid == 0 else "exited",
        blocking=lambda key: Blocking(True, 1.0, 42.4, 2),
        allocation=lambda pod, name: [Device(GPU_A, "A100", 4096, 30)] * 3,
        export=lambda state, pod: (
            Decision("exported", "exported")
            if pod is not None
            else Decision("no_pod", "pod UID 'stray' is not known")
        ),
    )
    containers = [loaded("uid-1", "main", two_gpus()), loaded("stray", "main", two_gpus())]
    doc = debug_state(
        {state.key: state for state in containers},
        StaticPodSource([POD]),
        now=0.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("kubernetes", True, True, pods=1, relists=0, node_name="node-a"),
        broker=None,
        extras=extras,
        limits=DebugLimits(containers=1),
    )
    text = format_status(doc)
    head, _, table = text.partition("\n\n")
    assert head.splitlines()[1:] == [
        "monitor: 7 ticks every 5.0s, running; 2 container directories (loaded 2) in "
        "/hook/containers",
        "export: exported 1, no_pod 1",
        "pods: Kubernetes watch of node node-a: synced, 1 pods known, 0 relists",
        "broker: off (LIBVGPU_HOSTPID_BROKER is not 1): new processes get host PID 0",
    ]
    rows = [row.split() for row in table.splitlines()]
    # Two devices used, three allocated: one row per device, the third allocation alone.
    assert rows[1] == [
        "team-a/trainer-0/main", "v1", "0", "1026/8192", "45", "50", "0", "yes", "42s", "0/1/1",
        "4096MiB", "30%", "exported",
    ]  # fmt: skip
    assert rows[2] == ["1", "3/4096", "1", "30", "4096MiB", "30%"]
    assert rows[3] == ["-", "-", "-", "-", "4096MiB", "30%"]
    notes = table.splitlines()[4:6]
    assert notes[0].strip().startswith("1 process(es) with host PID 0")
    assert notes[1].strip().startswith("1 process(es) exited but still hold their slot")
    # The cap: the stray directory is cut, and the table says so.
    assert table.splitlines()[-1] == (
        "... 1 of 2 containers shown (the agent caps the document; use --namespace/--pod)"
    )


def test_an_unknown_pod_is_named_by_its_directory_with_the_reason() -> None:
    doc = debug_state(
        {state.key: state for state in [loaded("stray", "main", two_gpus())]},
        StaticPodSource([]),
        now=0.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("kubernetes", True, True, node_name="node-a"),
        broker=None,
    )
    lines = format_status(doc).splitlines()
    row = next(line for line in lines if line.startswith("? stray_main"))
    assert row.split()[-1] == "loaded"  # no export decision wired: the lister's status
    assert any("identity: pod UID 'stray' is not known to the pod watch" in x for x in lines)


def test_no_containers() -> None:
    doc = debug_state(
        {},
        StaticPodSource(),
        now=0.0,
        node_name="n",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("static", True, False),
        broker=None,
    )
    assert format_status(doc).endswith("\n\nno container directories\n")


def test_status_address() -> None:
    assert status_address(None, {}) == BindAddress("127.0.0.1", 9395)
    env = {"HAMI_TRIO_DEBUG_BIND_ADDRESS": "[::]:9500"}
    assert status_address(None, env) == BindAddress("::1", 9500)
    assert status_address("0.0.0.0:1", env) == BindAddress("127.0.0.1", 1)  # the flag wins
    assert status_address("10.1.2.3:9395", {}) == BindAddress("10.1.2.3", 9395)
    with pytest.raises(ConfigError, match=r"^--address: 'x' has no port"):
        status_address("x", {})
    with pytest.raises(ConfigError, match="debug view is off"):
        status_address(None, {"HAMI_TRIO_DEBUG_BIND_ADDRESS": "off"})


def test_tenant_text_cannot_drive_the_terminal_or_break_the_document() -> None:
    hostile = "evil\x1b[2J\nx\udcff"  # ESC, a newline, a byte that is not UTF-8
    doc = debug_state(
        {state.key: state for state in [loaded("stray", hostile, two_gpus())]},
        StaticPodSource([]),
        now=0.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("kubernetes", True, True, node_name="node-a"),
        broker=None,
    )
    body = render(doc)
    assert json.loads(body)["containers"][0]["container"] == "evil\x1b[2J\nx\\udcff"
    body.decode("ascii")  # and every JSON reader can take it: no unpaired surrogate escape
    assert b"\\udcff" not in body.replace(b"\\\\udcff", b"")
    text = format_status(doc)
    assert "\x1b" not in text
    header, row = text.partition("\n\n")[2].splitlines()[:2]
    assert row.startswith("? stray_evil\\x1b[2J\\nx\\udcff ")  # one line, escaped
    assert row.index(" v1 ") + 1 == header.index("FORMAT")  # aligned after escaping


def test_a_stray_claim_says_what_counted_instead() -> None:
    claim = Claim(True, ("GPU-A",), ("GPU-A",), 1, 0, ("GPU-B",), ("uuid", "priority"))
    honest = Claim(True, ("GPU-A",), ("GPU-A",), 1, 1, (), ())
    doc = debug_state(
        {state.key: state for state in [loaded("uid-1", "main", two_gpus())]},
        StaticPodSource([POD]),
        now=0.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("kubernetes", True, True, node_name="node-a"),
        broker=None,
        extras=DebugExtras(feedback=lambda key, snapshot: claim),
    )
    lines = [line.strip() for line in format_status(doc).splitlines()]
    assert (
        "feedback: the .cache file claims GPU GPU-B that the pod's allocation does not list; "
        "counted only on its allocated GPU-A"
    ) in lines
    assert (
        "feedback: the .cache file says priority 0, the pod spec 1; the pod's priority counts"
        in lines
    )
    doc["containers"][0]["feedback"] = json.loads(
        render({"f": {"stray_reasons": list(honest.stray_reasons)}})
    )["f"]
    assert not any(line.startswith("feedback:") for line in format_status(doc).splitlines())


def test_a_foreign_writer_gets_a_line_that_says_what_to_do() -> None:
    import dataclasses

    def status(foreign: bool) -> str:
        doc = debug_state(
            {},
            StaticPodSource(),
            now=0.0,
            node_name="n",
            version="9.9",
            monitor=dataclasses.replace(MONITOR, foreign_writer=foreign),
            pods=PodWatchSummary("static", True, False),
            broker=None,
        )
        assert json.loads(render(doc))["monitor"]["foreign_writer"] is foreign
        return format_status(doc)

    assert "ANOTHER MONITOR" not in status(False)
    line = next(x for x in status(True).splitlines() if x.startswith("ANOTHER MONITOR"))
    assert "docs/migration.md" in line
