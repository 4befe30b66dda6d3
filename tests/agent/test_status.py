"""``format_status`` (pure) over documents of the real builder, and ``status_address``.

The command against a real agent: tests/cli/test_status.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hami_trio._text import MAX_QUOTED, quote, unsafe_char
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
from hami_trio.monitor.lister import ContainerLister
from hami_trio.monitor.scope import Claim
from hami_trio.monitor.state import ContainerKey
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
from tests.strategies.text import cache_file_names


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
        monitor=dataclasses.replace(MONITOR, usage_read_at=-2.5),
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
        "usage (memory, utilisation, processes) read 2.5s before this answer",
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


# -- names made to fool the reader: a tenant's .cache files through the real lister ---------


def _status_of_files(root: Path, names: Sequence[str]) -> str:
    """The status table of one container directory holding ``names`` (garbage content: a
    single file is refused for its content, three for their number), as the real lister
    reports it."""
    directory = os.path.join(os.fsencode(root), b"uid-1_main")
    os.makedirs(directory)
    for name in names:
        with open(os.path.join(directory, os.fsencode(name)), "wb") as file:
            file.write(b"\xff" * 64)  # not magic 0: that is a file still initialising
    lister = ContainerLister(root, StaticPodSource())
    try:
        view = trio.run(lister.update)
    finally:
        lister.close()
    # no file loads here: the tick's states are what a usage read would show
    states: dict[ContainerKey, Any] = dict(view)
    doc = debug_state(
        states,
        StaticPodSource([]),
        now=0.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("static", True, False),
        broker=None,
    )
    return format_status(doc)


def _rejection_note(text: str) -> str:
    (note,) = [line for line in text.splitlines() if line.startswith("    rejected (")]
    return note


def test_format_characters_in_cache_file_names_are_escaped_and_quoted(tmp_path: Path) -> None:
    # Right-to-left override: the reader sees "...cache.exe"-style reversed text; an isolate,
    # a zero-width space and a BOM hide where the name ends; 150 spaces push the rest of the
    # note past the terminal's width, where it wraps to look like a row of its own.
    names = [
        "\u202eehcac.evil.cache",
        "a\u2066team-a/victim/main\u2069.cache".replace("/", "\u2215"),
        "\u200b\ufeff" + " " * 150 + "team-a\u2215trainer-0  v1  0  1\u22158192  exported.cache",
    ]
    text = _status_of_files(tmp_path / "containers", names)
    for char in ("\u202e", "\u2066", "\u2069", "\u200b", "\ufeff", "\u2215"):
        assert char not in text, text
    note = _rejection_note(text)
    assert "too_many_files" in note
    for name in names:
        assert quote(name) in note  # each name quoted, escaped, cut
    assert " " * (MAX_QUOTED + 1) not in note  # no name pads a line with a row's width


def test_a_refused_file_is_named_quoted(tmp_path: Path) -> None:
    name = "\u202e" + " " * 150 + "x.cache"
    note = _rejection_note(_status_of_files(tmp_path / "containers", [name]))
    assert f"/uid-1_main/{quote(name)}" in note, note
    assert "\u202e" not in note


@settings(max_examples=60, deadline=None)
@given(st.lists(cache_file_names(), min_size=1, max_size=3, unique=True))
def test_no_cache_file_name_can_hide_reorder_or_add_text(names: list[str]) -> None:
    assume(len({os.fsencode(name) for name in names}) == len(names))
    with tempfile.TemporaryDirectory() as scratch:
        text = _status_of_files(Path(scratch) / "containers", names)
    with tempfile.TemporaryDirectory() as scratch:
        benign = _status_of_files(
            Path(scratch) / "containers", [f"{i}.cache" for i in range(len(names))]
        )
    assert not any(unsafe_char(char) for char in text.replace("\n", ""))
    assert len(text.splitlines()) == len(benign.splitlines())  # no line added or removed
    # Three files are refused for their number (every name shown), fewer for the content of
    # the first (its name shown).
    shown = names if len(names) == 3 else sorted(names)[:1]
    note, plain = _rejection_note(text), _rejection_note(benign)
    for name in shown:
        assert quote(name) in note
    # Only the names differ, each at most MAX_QUOTED characters and its quotes.
    fixed = len(plain) - sum(len(quote(f"{i}.cache")) for i in range(len(shown)))
    assert len(note) <= fixed + len(shown) * (MAX_QUOTED + 5)


def test_the_summary_says_when_usage_was_not_read_yet() -> None:
    doc = debug_state(
        {},
        StaticPodSource([POD]),
        now=0.0,
        node_name="node-a",
        version="9.9",
        monitor=MONITOR,
        pods=PodWatchSummary("static", True, True, node_name="node-a"),
        broker=None,
    )
    assert (
        "usage not read yet (no tick, or the MIG lock holds every read back)"
        in format_status(doc).splitlines()
    )
