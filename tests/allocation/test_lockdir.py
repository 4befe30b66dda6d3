"""prepare_lock_parent on real directories under tmp_path.

The trusted owner is this process's UID (root in CI), so the tree pytest creates counts as
trusted; tests that need a foreign owner chown to 65534 and are marked ``root``.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_trio.allocation.lockdir import LOCK_PARENT_MODE, Step, prepare_lock_parent
from hami_trio.errors import LockDirError

NOBODY = 65534
ME = os.geteuid()


@dataclass
class Tree:
    parent: Path
    lock: Path
    outside: Path  # a sibling of the parent, for intruders' targets

    @property
    def path(self) -> str:
        return str(self.lock)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)  # like the real /tmp
    outside = tmp_path / "outside"
    outside.mkdir()
    return Tree(parent=parent, lock=parent / "vgpulock", outside=outside)


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def snapshot(path: Path) -> tuple[int, int, int, int, bytes | None]:
    """What an intruder's object looks like: type+mode, owner, group, inode, content."""
    st = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
    return (st.st_mode, st.st_uid, st.st_gid, st.st_ino, content)


def refused(tree: Tree, match: str, **kwargs: object) -> LockDirError:
    with pytest.raises(LockDirError, match=match) as info:
        prepare_lock_parent(tree.path, ME, **kwargs)  # type: ignore[arg-type]
    assert str(tree.lock) in str(info.value)  # every refusal names the path
    return info.value


# --- success ---------------------------------------------------------------------------------


def test_fresh_create_under_umask_077_gives_01777(tree: Tree, umask_077: None) -> None:
    assert prepare_lock_parent(tree.path, ME) == tree.path
    st = os.lstat(tree.lock)
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o1777
    assert st.st_uid == ME


def test_existing_0777_directory_is_upgraded_in_place(tree: Tree) -> None:
    tree.lock.mkdir()
    tree.lock.chmod(0o777)
    (tree.lock / "legacy.lock").write_text("held")
    inode = tree.lock.stat().st_ino
    prepare_lock_parent(tree.path, ME)
    assert mode_of(tree.lock) == 0o1777
    assert tree.lock.stat().st_ino == inode
    assert (tree.lock / "legacy.lock").read_text() == "held"


@pytest.mark.parametrize("old_mode", [0o700, 0o2755, 0o4777, 0o3777])
def test_any_owned_directory_ends_exactly_01777(tree: Tree, old_mode: int) -> None:
    tree.lock.mkdir()
    os.chmod(tree.lock, old_mode)
    prepare_lock_parent(tree.path, ME)
    assert mode_of(tree.lock) == LOCK_PARENT_MODE


def test_existing_01777_directory_is_idempotent(tree: Tree) -> None:
    prepare_lock_parent(tree.path, ME)
    before = os.lstat(tree.lock)
    (tree.lock / "a.lock").touch()
    prepare_lock_parent(tree.path, ME)
    prepare_lock_parent(tree.path, ME)
    after = os.lstat(tree.lock)
    assert (after.st_ino, after.st_mode, after.st_uid) == (before.st_ino, before.st_mode, ME)
    assert os.listdir(tree.lock) == ["a.lock"]


def test_sticky_world_writable_parent_is_allowed(tree: Tree) -> None:
    assert mode_of(tree.parent) == 0o1777
    prepare_lock_parent(tree.path, ME)
    assert mode_of(tree.lock) == 0o1777


@pytest.mark.parametrize("parent_mode", [0o755, 0o700, 0o1775])
def test_parent_not_writable_by_others_or_sticky_is_allowed(tree: Tree, parent_mode: int) -> None:
    tree.parent.chmod(parent_mode)
    prepare_lock_parent(tree.path, ME)
    assert mode_of(tree.lock) == 0o1777


def test_unclean_spelling_is_cleaned(tree: Tree) -> None:
    spelled = str(tree.parent) + "//./vgpulock/"
    assert prepare_lock_parent(spelled, ME) == tree.path
    assert mode_of(tree.lock) == 0o1777


# --- refusals: the object at the name --------------------------------------------------------


def test_symlink_to_a_directory_is_refused_and_target_untouched(tree: Tree) -> None:
    target = tree.outside / "dir"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    before = snapshot(target)
    tree.lock.symlink_to(target)
    refused(tree, "is a symlink")
    assert snapshot(target) == before
    assert os.listdir(target) == []
    assert tree.lock.is_symlink()


@pytest.mark.root
def test_symlink_to_a_shadow_copy_is_refused_and_target_untouched(tree: Tree) -> None:
    shadow = tree.outside / "shadow"
    shutil.copy2("/etc/shadow", shadow)  # content, mode (0640) and, as root, owner/group
    os.chown(shadow, 0, os.stat("/etc/shadow").st_gid)
    before = snapshot(shadow)
    tree.lock.symlink_to(shadow)
    refused(tree, "is a symlink")
    assert snapshot(shadow) == before
    assert shadow.read_bytes() == Path("/etc/shadow").read_bytes()


def test_dangling_symlink_is_refused_and_nothing_created_at_its_target(tree: Tree) -> None:
    target = tree.outside / "not-yet"
    tree.lock.symlink_to(target)
    refused(tree, "is a symlink")
    assert not target.exists()


def test_regular_file_is_refused_and_untouched(tree: Tree) -> None:
    tree.lock.write_text("not a dir")
    tree.lock.chmod(0o600)
    before = snapshot(tree.lock)
    refused(tree, "is a regular file")
    assert snapshot(tree.lock) == before


def test_fifo_is_refused_without_blocking(tree: Tree) -> None:
    os.mkfifo(tree.lock, 0o600)
    refused(tree, "is a FIFO")
    assert mode_of(tree.lock) == 0o600


@pytest.mark.root
def test_directory_owned_by_another_uid_is_refused_and_untouched(tree: Tree) -> None:
    tree.lock.mkdir()
    tree.lock.chmod(0o755)
    os.chown(tree.lock, NOBODY, NOBODY)
    before = snapshot(tree.lock)
    refused(tree, f"owned by UID {NOBODY}")
    assert snapshot(tree.lock) == before


def test_parent_not_owned_by_the_trusted_uid_is_refused_without_root(tmp_path: Path) -> None:
    # Runs without root: trust a UID that is not ours, so our own directory is foreign.
    parent = tmp_path / "p"
    parent.mkdir(mode=0o755)
    with pytest.raises(LockDirError, match=f"parent {parent} is owned by UID {ME}"):
        prepare_lock_parent(str(parent / "vgpulock"), ME + 1)
    assert not (parent / "vgpulock").exists()


# --- refusals: the parent --------------------------------------------------------------------


def test_parent_that_is_a_symlink_is_refused(tree: Tree) -> None:
    link = tree.outside / "tmp-link"
    link.symlink_to(tree.parent)
    with pytest.raises(LockDirError, match="it is a symlink"):
        prepare_lock_parent(str(link / "vgpulock"), ME)
    assert not tree.lock.exists()


@pytest.mark.root
def test_parent_not_owned_by_root_is_refused(tree: Tree) -> None:
    os.chown(tree.parent, NOBODY, NOBODY)
    refused(tree, f"owned by UID {NOBODY}, not the trusted UID {ME}")
    assert not tree.lock.exists()


@pytest.mark.parametrize("parent_mode", [0o777, 0o775, 0o757, 0o722])
def test_writable_non_sticky_parent_is_refused(tree: Tree, parent_mode: int) -> None:
    tree.parent.chmod(parent_mode)
    refused(tree, "writable by group or others .* but not sticky")
    assert not tree.lock.exists()


def test_missing_parent_is_refused(tree: Tree) -> None:
    with pytest.raises(LockDirError, match="it is missing"):
        prepare_lock_parent(str(tree.outside / "nope" / "vgpulock"), ME)


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("tmp/vgpulock", "must be an absolute path"),
        ("", "must be an absolute path"),
        ("/", "cannot be the root directory"),
        ("//.", "cannot be the root directory"),
        ("/tmp/../tmp/vgpulock", "must not contain '..'"),
        ("/tmp/vgpulock/..", "must not contain '..'"),
    ],
)
def test_unusable_paths_are_refused(path: str, match: str) -> None:
    with pytest.raises(LockDirError, match=match):
        prepare_lock_parent(path, ME)


# --- the swap race, injected between the steps ------------------------------------------------


def swap_hook(at: Step, action: Callable[[], None]) -> Callable[[Step], None]:
    seen: list[Step] = []

    def hook(step: Step) -> None:
        seen.append(step)
        if step == at:
            action()

    hook.seen = seen  # type: ignore[attr-defined]
    return hook


def test_hook_sees_every_step_in_order(tree: Tree) -> None:
    hook = swap_hook("chmodded", lambda: None)
    prepare_lock_parent(tree.path, ME, step_hook=hook)
    assert hook.seen == ["parent-checked", "created", "opened", "chmodded"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("at", ["parent-checked", "created", "opened", "chmodded"])
def test_swap_to_symlink_is_refused_and_target_untouched(tree: Tree, at: Step) -> None:
    intruder = tree.outside / "intruder"
    intruder.mkdir()
    intruder.chmod(0o700)
    before = snapshot(intruder)

    def swap() -> None:
        if tree.lock.exists():
            tree.lock.rename(tree.outside / "ours")  # ours: whatever we created so far
        tree.lock.symlink_to(intruder)

    refused(tree, "symlink", step_hook=swap_hook(at, swap))
    assert snapshot(intruder) == before
    assert os.listdir(intruder) == []


@pytest.mark.parametrize("at", ["created", "opened", "chmodded"])
def test_swap_to_another_directory_is_refused_and_it_is_untouched(tree: Tree, at: Step) -> None:
    intruder = tree.outside / "intruder"
    intruder.mkdir()
    # Made to look right at the end (01777, our owner) - only the inode gives it away -
    # except when swapped in before the open, where it is simply chmodded nowhere: 0700 stays.
    intruder.chmod(0o1777 if at == "chmodded" else 0o700)
    before = snapshot(intruder)

    def swap() -> None:
        tree.lock.rename(tree.outside / "ours")
        intruder.rename(tree.lock)

    if at == "created":
        # Swapped before the open: the intruder (owned by the trusted UID) is what we open and
        # prepare; this is indistinguishable from a correct pre-existing directory.  What
        # matters is that the result is safe: owner-owned, exactly 01777.
        prepare_lock_parent(tree.path, ME, step_hook=swap_hook(at, swap))
        assert mode_of(tree.lock) == 0o1777
        return
    refused(tree, "replaced while it was prepared", step_hook=swap_hook(at, swap))
    assert snapshot(tree.lock) == before  # the intruder sits at the name, unchanged


@pytest.mark.root
@pytest.mark.parametrize("at", ["parent-checked", "created"])
def test_swap_to_foreign_directory_before_open_is_refused(tree: Tree, at: Step) -> None:
    intruder = tree.outside / "intruder"
    intruder.mkdir()
    intruder.chmod(0o755)
    os.chown(intruder, NOBODY, NOBODY)
    before = snapshot(intruder)

    def swap() -> None:
        if tree.lock.exists():
            tree.lock.rename(tree.outside / "ours")
        intruder.rename(tree.lock)

    refused(tree, f"owned by UID {NOBODY}", step_hook=swap_hook(at, swap))
    assert snapshot(tree.lock) == before


def test_mode_changed_after_chmod_is_refused(tree: Tree) -> None:
    refused(
        tree,
        "final check through the descriptor failed: .* mode 0777",
        step_hook=swap_hook("chmodded", lambda: tree.lock.chmod(0o777)),
    )


def test_directory_removed_after_chmod_is_refused(tree: Tree) -> None:
    refused(
        tree,
        "disappeared while it was prepared",
        step_hook=swap_hook("chmodded", tree.lock.rmdir),
    )


def test_swap_to_regular_file_after_open_is_refused(tree: Tree) -> None:
    def swap() -> None:
        tree.lock.rename(tree.outside / "ours")
        tree.lock.write_text("x")

    refused(
        tree, "replaced while it was prepared .*a regular file", step_hook=swap_hook("opened", swap)
    )
