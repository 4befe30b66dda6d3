"""The builder's HAMi-core-style initialisation: the magic is the last word written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hami_trio.monitor.layout import MAGIC
from hami_trio.testing.regions import RegionSpec, build_region, write_region


@pytest.mark.parametrize("sparse", [True, False])
def test_magic_last_writes_the_magic_in_a_final_four_byte_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sparse: bool
) -> None:
    path = tmp_path / "x.cache"
    writes: list[tuple[int, bytes, bytes]] = []
    real_pwrite = os.pwrite

    def spy(fd: int, data: bytes, offset: int) -> int:
        # What a concurrent reader would see in the header right before this write.
        writes.append((offset, bytes(data[:4]), os.pread(fd, 4, 0)))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", spy)
    spec = RegionSpec(uuids=["GPU-0"], priority=0)
    write_region(path, spec, sparse=sparse, magic_last=True)

    assert writes[-1][:2] == (0, MAGIC.to_bytes(4, "little"))
    # Every earlier write put a zero magic at offset 0, and the file never had the magic.
    assert all(data == bytes(4) for offset, data, _ in writes[:-1] if offset == 0)
    assert all(before in (b"", bytes(4)) for _, _, before in writes)
    monkeypatch.undo()
    assert path.read_bytes() == bytes(build_region(spec))
    assert path.stat().st_size == spec.layout.sizeof + 1


def test_default_write_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "x.cache"
    spec = RegionSpec(uuids=["GPU-0"])
    write_region(path, spec)
    assert path.read_bytes() == bytes(build_region(spec))
