"""Target ``remover``: the gone-pod directory remover over random hostile trees.

Each input is a tree from ``tests/strategies/trees.py`` (directories, files, chains deeper
than the descriptor stack, symlinks to the host, FIFOs, sockets, hard links to a host file)
built for real on a tmpfs beside a host directory, and a random descriptor stack depth and
budget.  Invariants: the removal ends within a bounded number of steps, the tree is gone,
nothing of the host directory changed, and the descriptors open after every step stay
within two per stack level plus the containers directory's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from fuzz.campaign import Property, Target
from hami_trio.monitor.remover import Budget, TreeRemover
from tests.strategies import trees as st_trees

__all__ = ["TARGET"]


def _snapshot(path: Path) -> dict[str, tuple[int, int, bytes]]:
    seen = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            data = Path(full).read_bytes() if os.path.isfile(full) else b""
            seen[os.path.relpath(full, path)] = (st.st_mode, st.st_ino, data)
    return seen


def _base() -> Path:
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="hami-trio-fuzz-remover-", dir=where))


def check_removal(spec: st_trees.TreeSpec, max_depth: int, ops: int) -> None:
    """Ends, removes everything, touches nothing outside, bounded descriptors."""
    base = _base()
    try:
        containers = base / "containers"
        containers.mkdir()
        outside = base / "host"
        st_trees.build_outside(outside)
        top = containers / "gone_c"
        top.mkdir()
        st_trees.build_tree(spec, top, outside)
        before = _snapshot(outside)
        entries = sum(1 + node.depth for node in spec.nodes)
        baseline = len(os.listdir("/proc/self/fd"))
        remover = TreeRemover(containers, "gone_c", max_depth=max_depth)
        try:
            steps = 0
            while not remover.step(Budget(ops=ops)):
                steps += 1
                assert steps <= 4 * entries + 8, f"no end after {steps} steps"
                fds = len(os.listdir("/proc/self/fd")) - baseline
                assert fds <= 2 * max_depth + 1, f"{fds} descriptors open"
                assert remover.open_directories <= max_depth
        finally:
            remover.close()
        assert remover.outcome == "removed", remover.drain_failures()
        assert not os.path.lexists(top)
        assert _snapshot(outside) == before
        assert len(os.listdir("/proc/self/fd")) == baseline
    finally:
        shutil.rmtree(base)  # what is left is shallow: the remover removed the deep part


TARGET = Target(
    name="remover",
    description="gone-pod directory removal over random hostile trees: ends, nothing outside",
    ci_seconds=10,
    weight=0.5,
    properties=(
        Property(
            "removal",
            (st_trees.trees(), st.integers(2, 5), st.integers(1, 64)),
            check_removal,
        ),
    ),
)
