"""A second monitor on the same regions, as HAMi's vGPUmonitor is during a cut-over.

It applies upstream's Observe rules (the project's :func:`observe`, which a table test holds
identical to upstream's on honest files) to every ``.cache`` file under a containers
directory and writes the control words back with plain ``pwrite`` - a monitor that does not
know hami-trio exists.  :func:`upstream_tick` is one tick, for in-process tests;
``python -m tests.monitor.upstream_writer DIR INTERVAL`` ticks until killed.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from pathlib import Path

from hami_trio.errors import CacheFileRejected
from hami_trio.monitor.feedback import observe
from hami_trio.monitor.layout import ControlField, classify
from hami_trio.monitor.snapshot import UsageSnapshot
from tests.monitor.reference import reference_region

_I32 = struct.Struct("<i")


def upstream_tick(containers_dir: Path) -> int:
    """Read every region under ``containers_dir``, run Observe, write back; the number of
    control words written.  Files that do not parse are skipped (upstream would crash)."""
    snapshots: dict[str, UsageSnapshot] = {}
    offsets: dict[str, tuple[int, dict[ControlField, int]]] = {}
    for path in sorted(containers_dir.glob("*/*.cache")):
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            layout = classify(len(data), data[:12])
            snapshots[str(path)] = reference_region(data)
        except (OSError, ValueError, CacheFileRejected):
            os.close(fd)
            continue
        fields = {
            ControlField.RECENT_KERNEL: layout.recent_kernel,
            ControlField.UTILIZATION_SWITCH: layout.utilization_switch,
        }
        offsets[str(path)] = (fd, fields)
    try:
        writes = observe(snapshots)
        for write in writes:
            fd, fields = offsets[write.key]
            os.pwrite(fd, _I32.pack(write.value), fields[write.field])
        return len(writes)
    finally:
        for fd, _ in offsets.values():
            os.close(fd)


def main(argv: list[str]) -> int:
    directory, interval = Path(argv[0]), float(argv[1])
    while True:
        upstream_tick(directory)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
