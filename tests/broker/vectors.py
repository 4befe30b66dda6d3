"""The example exchanges of docs/protocol.md, read from the page itself.

Both the codec tests and the server tests use them, so the documentation, the codec and the
bytes on the wire are checked against each other.
"""

from __future__ import annotations

from pathlib import Path

from hami_trio.broker.protocol import ProtocolError, Response, encode_response, parse_request

__all__ = ["DOC", "DOC_VECTORS", "doc_vectors", "expected_answer"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def doc_vectors() -> list[tuple[str, bytes, int, bytes | None]]:
    """Rows of the Examples table: (case, request, pid, response or None).

    Every table row must parse: a row this function cannot read fails the test run instead
    of being skipped silently.
    """
    text = DOC.read_text()
    section = text.split("## Examples", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith(("| case", "| ---")):
            continue
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        case, request, pid, response = cells
        rows.append(
            (
                case,
                bytes.fromhex(request),
                int(pid),
                None if response == "-" else bytes.fromhex(response),
            )
        )
    return rows


DOC_VECTORS = doc_vectors()


def expected_answer(request: bytes, pid: int) -> bytes | None:
    """What the codec says the server answers to ``request`` from a caller with ``pid``."""
    try:
        parse_request(request)
    except ProtocolError as exc:
        return None if exc.status is None else Response(exc.status).encode()
    return encode_response(pid)
