"""What the running agent knows, per container, as a table: ``hami-trio status``'s core.

How this works: :func:`fetch_state` GETs the agent's debug view (``/debug/state``,
docs/debug.md) from the address :func:`status_address` picks - ``--address``, else
``HAMI_TRIO_DEBUG_BIND_ADDRESS`` (which ``kubectl exec`` into the agent's pod inherits, so the
default finds the agent), else ``127.0.0.1:9395`` - and :func:`format_status` (pure)
turns the document into the table: the summaries of the monitor, the broker and the pod
watch, then one line per device of each container directory with the reasons under it.  The
command (:mod:`hami_trio.cli.status`) and the demo's closing table use both.  docs/debug.md.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlencode

from hami_trio.agent.config import DEBUG_OFF, DEFAULT_DEBUG_BIND_ADDRESS
from hami_trio.agent.debug import SCHEMA
from hami_trio.errors import ConfigError, HamiTrioError
from hami_trio.goparse import BindAddress, parse_bind_address
from hami_trio.logs import escape_control

__all__ = ["DEBUG_ENV", "fetch_state", "format_status", "status_address"]

#: The agent's variable for its debug address (``kubectl exec`` inherits the pod's).
DEBUG_ENV: Final = "HAMI_TRIO_DEBUG_BIND_ADDRESS"
_ENV: Final = DEBUG_ENV
_MIB: Final = 1 << 20
_MAX_ANSWER: Final = 256 << 20


def status_address(flag: str | None, env: Mapping[str, str]) -> BindAddress:
    """Where to ask: ``--address``, else the agent's own variable, else the default.

    A wildcard listen host (``:9395``, ``0.0.0.0``, ``::``) is asked on the loopback interface.

    Raises:
        ConfigError: not a ``host:port``, or the variable says the debug view is off.
    """
    if flag is not None:
        text, name = flag, "--address"
    elif env.get(_ENV):
        text, name = env[_ENV], _ENV
        if text == DEBUG_OFF:
            raise ConfigError(f"{_ENV}={DEBUG_OFF}: the agent's debug view is off")
    else:
        text, name = DEFAULT_DEBUG_BIND_ADDRESS, "the default address"
    address = parse_bind_address(text, name=name)
    if address.host in ("", "0.0.0.0"):
        return BindAddress("127.0.0.1", address.port)
    if address.host == "::":
        return BindAddress("::1", address.port)
    return address


def fetch_state(
    address: BindAddress,
    *,
    timeout: float,
    namespace: str | None = None,
    pod: str | None = None,
) -> dict[str, Any]:
    """GET ``/debug/state`` from ``address`` and decode it.

    Raises:
        HamiTrioError: nothing answers there, the answer is not 200, not JSON, or not a
            debug document of the schema this version reads.
    """
    query = {key: value for key, value in (("namespace", namespace), ("pod", pod)) if value}
    path = "/debug/state" + (f"?{urlencode(query)}" if query else "")
    connection = http.client.HTTPConnection(address.host, address.port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"accept": "application/json"})
        reply = connection.getresponse()
        body = reply.read(_MAX_ANSWER + 1)
    except (OSError, http.client.HTTPException) as exc:
        raise HamiTrioError(
            f"cannot reach the agent's debug view at {address}: {exc} (is the agent running "
            "here, with --debug-bind-address on this address?)"
        ) from exc
    finally:
        connection.close()
    if len(body) > _MAX_ANSWER:
        raise HamiTrioError(f"{address}{path}: answer larger than {_MAX_ANSWER >> 20} MiB")
    if reply.status != 200:
        first = body[:200].decode("utf-8", "replace").strip()
        raise HamiTrioError(f"{address}{path} answered {reply.status}: {first}")
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise HamiTrioError(f"{address}{path} did not answer JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise HamiTrioError(f"{address}{path}: not a {SCHEMA} document (schema {found!r})")
    return document


# -- the table ------------------------------------------------------------------------------

_COLUMNS: Final = (
    "CONTAINER",
    "FORMAT",
    "DEV",
    "USED/LIMIT MiB",
    "SM%",
    "CORE%",
    "PRIO",
    "BLOCKED",
    "PROCS run/exit/unk",
    "ALLOCATED",
    "EXPORT",
)


def _show(value: Any) -> str:
    return "?" if value is None else str(value)


def _mib(value: Any) -> str:
    return "?" if not isinstance(value, int) else str(value // _MIB)


def _name(entry: Mapping[str, Any]) -> str:
    if entry.get("namespace") is None:
        return f"? {entry.get('pod_uid')}_{entry.get('container')}"
    namespace = entry["namespace"] or "-"
    return f"{namespace}/{entry.get('pod')}/{entry.get('container')}"


def _blocked(entry: Mapping[str, Any]) -> str:
    blocked = entry.get("blocked")
    if blocked is None:
        return "?"
    if not blocked:
        return "no"
    seconds = entry.get("blocked_seconds")
    return "yes" if not isinstance(seconds, int | float) else f"yes {seconds:.0f}s"


def _processes(entry: Mapping[str, Any]) -> str:
    states = entry.get("process_states")
    if not isinstance(states, Mapping):
        return "-"
    text = "/".join(_show(states.get(state)) for state in ("running", "exited", "unknown"))
    return text + ("+" if entry.get("processes_truncated") else "")


def _allocated(entry: Mapping[str, Any], index: int) -> str:
    allocated = entry.get("allocated")
    if not isinstance(allocated, Mapping):
        return "?"
    devices = allocated.get("devices") or []
    if index >= len(devices):
        return "-"
    device = devices[index]
    return f"{device.get('memory_mib')}MiB {device.get('cores')}%"


def _export(entry: Mapping[str, Any]) -> str:
    export = entry.get("export") or {}
    state = export.get("state")
    if state is None:
        return str(entry.get("status", "?"))
    return str(state)


def _rows(entry: Mapping[str, Any]) -> list[list[str]]:
    devices = entry.get("devices") or [None]
    allocated = entry.get("allocated")
    extra = len(allocated.get("devices") or []) if isinstance(allocated, Mapping) else 0
    rows = []
    for index in range(max(len(devices), extra)):
        device = devices[index] if index < len(devices) else None
        first = index == 0
        row = [
            _name(entry) if first else "",
            _show(entry.get("format")) if first else "",
            "-" if device is None else str(device.get("index")),
            "-"
            if device is None
            else f"{_mib(device.get('used_bytes'))}/{_mib(device.get('limit_bytes'))}",
            "-" if device is None else _show(device.get("sm_util")),
            "-" if device is None else _show(device.get("core_limit")),
            _show(entry.get("priority")) if first else "",
            _blocked(entry) if first else "",
            _processes(entry) if first else "",
            _allocated(entry, index),
            _export(entry) if first else "",
        ]
        rows.append(row)
    return rows


def _why(entry: Mapping[str, Any]) -> list[str]:
    """The reasons under a container's rows: why its identity, file or export is as it is."""
    lines = []
    identity = entry.get("identity") or {}
    if identity.get("known") is False:
        lines.append(f"identity: {identity.get('reason')}")
    rejection = entry.get("rejection")
    if isinstance(rejection, Mapping):
        lines.append(f"rejected ({rejection.get('reason')}): {rejection.get('message')}")
    elif entry.get("status") == "no_cache_file":
        lines.append("no .cache file yet (HAMi-core creates it at the container's first cuInit)")
    export = entry.get("export") or {}
    # A refused file or a missing one is explained by the line above already.
    if export.get("state") not in (None, "exported", "rejected", "no_cache_file") and export.get(
        "reason"
    ):
        lines.append(f"export: {export['reason']}")
    lines += _stray_claims(entry.get("feedback"))
    unknown = (entry.get("process_states") or {}).get("unknown")
    if isinstance(unknown, int) and unknown:
        lines.append(
            f"{unknown} process(es) with host PID 0: HAMi-core never learned the host PID "
            "(broker off or unreachable in that container); SM utilisation may read 0"
        )
    exited = (entry.get("process_states") or {}).get("exited")
    if isinstance(exited, int) and exited:
        lines.append(
            f"{exited} process(es) exited but still hold their slot: upstream's sums keep "
            "their memory (see --exclude-exited-processes)"
        )
    return lines


def _stray_claims(feedback: Any) -> list[str]:
    """Why the feedback does not count a container as its file says (its pod says more)."""
    if not isinstance(feedback, Mapping):
        return []
    reasons = feedback.get("stray_reasons") or ()
    lines = []
    if "uuid" in reasons:
        claimed = ", ".join(map(str, feedback.get("strays") or ()))
        allocated = ", ".join(map(str, feedback.get("devices") or ())) or "(none)"
        lines.append(
            f"feedback: the .cache file claims GPU {claimed} that the pod's allocation does "
            f"not list; counted only on its allocated {allocated}"
        )
    if "priority" in reasons:
        lines.append(
            f"feedback: the .cache file says priority {feedback.get('file_priority')}, the pod "
            f"spec {feedback.get('priority')}; the pod's priority counts"
        )
    return lines


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def _line(row: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


def _summary(document: Mapping[str, Any]) -> list[str]:
    monitor = document.get("monitor") or {}
    pods = document.get("pods") or {}
    broker = document.get("broker")
    by_status = ", ".join(f"{k} {v}" for k, v in (monitor.get("by_status") or {}).items())
    lines = [
        f"node {document.get('node')}, hami-trio {document.get('version')}",
        f"monitor: {monitor.get('ticks')} ticks every {monitor.get('interval_seconds')}s, "
        f"{'PAUSED by the MIG lock' if monitor.get('paused') else 'running'}; "
        f"{monitor.get('containers_total')} container directories ({by_status or 'none'}) "
        f"in {monitor.get('containers_dir')}",
    ]
    read_at, generated = monitor.get("usage_read_at"), document.get("generated_at")
    if isinstance(read_at, (int, float)) and isinstance(generated, (int, float)):
        age = max(0.0, float(generated) - float(read_at))
        lines.append(f"usage (memory, utilisation, processes) read {age:.1f}s before this answer")
    elif "usage_read_at" in monitor:
        lines.append("usage not read yet (no tick, or the MIG lock holds every read back)")
    by_export = monitor.get("by_export_state")
    if isinstance(by_export, Mapping):
        lines.append("export: " + ", ".join(f"{k} {v}" for k, v in by_export.items()))
    if monitor.get("mig_lock_problem"):
        lines.append(f"MIG lock directory refused: {monitor['mig_lock_problem']}")
    if monitor.get("foreign_writer"):
        lines.append(
            "ANOTHER MONITOR is writing feedback into these regions (HAMi's vgpu-monitor?): "
            "switch it off on this node, see docs/migration.md"
        )
    if pods.get("source") == "kubernetes":
        lines.append(
            f"pods: Kubernetes watch of node {pods.get('node')}: "
            f"{'synced' if pods.get('authoritative') else 'NOT in sync'}"
            f"{'' if pods.get('ready') else ', never listed'}, {pods.get('pods')} pods known, "
            f"{pods.get('relists')} relists"
        )
    else:
        lines.append("pods: no Kubernetes (--no-kubernetes): every directory is its own pod")
    if broker is None:
        lines.append("broker: off (LIBVGPU_HOSTPID_BROKER is not 1): new processes get host PID 0")
    elif broker.get("foreign_listener"):
        lines.append(
            f"broker: WAITING: another broker serves {broker.get('socket_path')} "
            f"({broker['foreign_listener']}); switch it off, see docs/migration.md"
        )
    else:
        exchanges = broker.get("exchanges") or {}
        counted = ", ".join(f"{k} {v}" for k, v in exchanges.items() if v)
        lines.append(
            f"broker: {broker.get('socket_path')}: {broker.get('exchanges_total')} exchanges"
            f"{f' ({counted})' if counted else ''}, {broker.get('in_flight')} in flight"
        )
    return lines


def format_status(document: Mapping[str, Any]) -> str:
    """The document as ``hami-trio status`` prints it (``?``: not known to the agent).

    Names and reasons are the tenants' text: every control character is escaped (as in the
    logs), so nothing in the table can start a line of its own or drive the terminal.
    """
    return "".join(escape_control(line) + "\n" for line in _format(document))  # idempotent


def _format(document: Mapping[str, Any]) -> list[str]:
    lines = _summary(document)
    lines.append("")
    entries = document.get("containers") or []
    if not entries:
        lines.append("no container directories" + (" match" if document.get("selection") else ""))
        return lines
    # Escaped per cell, before the widths: an escaped name is wider than the raw one.
    groups = [
        ([[escape_control(cell) for cell in row] for row in _rows(entry)], _why(entry))
        for entry in entries
    ]
    widths = _widths([list(_COLUMNS), *(row for rows, _ in groups for row in rows)])
    lines.append(_line(_COLUMNS, widths))
    for rows, notes in groups:
        lines += [_line(row, widths) for row in rows]
        lines += [f"    {note}" for note in notes]  # why, under the container's rows
    if document.get("truncated"):
        lines.append(
            f"... {document.get('containers_shown')} of {document.get('containers_matched')} "
            "containers shown (the agent caps the document; use --namespace/--pod)"
        )
    return lines
