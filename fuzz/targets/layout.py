"""Target ``layout``: shared-region headers and whole ``.cache`` files (SPEC M-3, M-4, section 3).

A tenant writes its ``.cache`` file; whatever it writes, the monitor must end with a snapshot
or a typed rejection (:class:`~hami_trio.errors.CacheFileRejected`), never another exception,
never a read outside the file, never a write outside the two control words.

- ``classify`` and ``parse_region`` run the monitor tests' own properties (tests/monitor/
  test_layout.py) over their strategies, for longer: any size around every boundary of the
  loader rule (0, 11/12/13, v0 and v1 sizes -1/0/+1, the mis-layout sizes 2008984/2008985)
  with any header; whole regions of either format with hostile ``proc_num``, ``num``,
  ``priority``, UUID bytes and random byte flips.
- ``region_file`` goes through the real file path: the bytes of a region, cut or extended
  to a boundary size and sometimes under a random header (``tests.strategies.layout.
  region_files``), are written to a file and read with :class:`RegionHandle` (the ``pread``
  path the monitor uses).  Every ``pread`` must lie inside the file and none may be longer
  than a v1 region; the outcome must equal the in-memory parser's on the same bytes (the
  same snapshot, or a rejection with the same reason); after a successful read, writing both
  control words must change exactly those 8 bytes, and a re-read must see the new values.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fuzz.campaign import Property, Target
from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.layout import LAYOUTS, MAGIC, ControlField, Format
from hami_trio.monitor.region import RegionHandle
from hami_trio.monitor.usage import UsageSnapshot, parse_region
from tests.monitor import test_layout
from tests.strategies import layout as st_layout

__all__ = ["TARGET"]

_WORK: list[Path] = []
_I32 = struct.Struct("<i")
_V1_SIZE = LAYOUTS[Format.V1].sizeof


@contextlib.contextmanager
def _workdir() -> Iterator[None]:
    path = Path(tempfile.mkdtemp(prefix="ht-fuzz-layout-"))
    _WORK.append(path)
    try:
        yield
    finally:
        _WORK.remove(path)
        shutil.rmtree(path, ignore_errors=True)


def _parse(data: bytes) -> UsageSnapshot | CacheFileRejected:
    try:
        return parse_region(data)
    except CacheFileRejected as exc:
        return exc


def check_region_file(data: bytes, recent_kernel: int, switch: int) -> None:
    """The file path agrees with the in-memory parser, reads stay in the file, writes hit
    only the two control words."""
    path = _WORK[-1] / "region.cache"
    path.write_bytes(data)
    size = len(data)
    expected = _parse(data)

    reads: list[tuple[int, int]] = []
    real_pread = os.pread

    def traced_pread(fd: int, length: int, offset: int, /) -> bytes:
        reads.append((length, offset))
        return real_pread(fd, length, offset)

    handle = RegionHandle.open_path(path, writable=True)
    try:
        os.pread = traced_pread
        try:
            outcome: UsageSnapshot | CacheFileRejected = handle.read()
        except CacheFileRejected as exc:
            outcome = exc
        finally:
            os.pread = real_pread
        for length, offset in reads:
            assert offset >= 0, (length, offset)
            assert offset + length <= size, f"read {length} bytes at {offset} of a {size}-byte file"
            assert length <= _V1_SIZE, f"read {length} bytes at once"

        if isinstance(expected, CacheFileRejected):
            assert isinstance(outcome, CacheFileRejected), (expected, outcome)
            assert outcome.reason == expected.reason, (expected, outcome)
            assert str(path) in str(outcome), "a rejection names the file"
            return
        assert outcome == expected

        handle.write_controls(
            [(ControlField.RECENT_KERNEL, recent_kernel), (ControlField.UTILIZATION_SWITCH, switch)]
        )
        layout = LAYOUTS[expected.format]
        wanted = bytearray(data)
        _I32.pack_into(wanted, ControlField.RECENT_KERNEL.offset(layout), recent_kernel)
        _I32.pack_into(wanted, ControlField.UTILIZATION_SWITCH.offset(layout), switch)
        assert path.read_bytes() == wanted, "the write touched more than the two control words"
        again = handle.read()
        assert (again.recent_kernel, again.utilization_switch) == (recent_kernel, switch)
    finally:
        handle.close()


def _body(test: object) -> object:
    return test.hypothesis.inner_test  # type: ignore[attr-defined]


TARGET = Target(
    name="layout",
    description="shared-region headers, boundary sizes and whole .cache files",
    ci_seconds=30,
    weight=1.5,
    session=_workdir,
    properties=(
        Property(
            "classify",
            (st_layout.sizes_and_headers(),),
            _body(test_layout.test_classify_returns_a_layout_or_a_typed_rejection),  # type: ignore[arg-type]
            examples=(
                ((11, MAGIC.to_bytes(4, "little") + bytes(7)),),
                ((2008984, MAGIC.to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes(4)),),
            ),
        ),
        Property(
            "parse_region",
            (st_layout.region_bytes(),),
            _body(test_layout.test_parse_region_of_any_bytes_is_a_snapshot_or_a_typed_rejection),  # type: ignore[arg-type]
            weight=1.5,
        ),
        Property(
            "region_file",
            (st_layout.region_files(), st_layout.INT32, st_layout.INT32),
            check_region_file,
            weight=2.0,
        ),
    ),
)
