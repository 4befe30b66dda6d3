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
from prometheus_client import REGISTRY

from hami_trio.allocation.lockdir import (
    LOCK_PARENT_MODE,
    LockParentRefused,
    Step,
    inspect_lock_parent,
    prepare_lock_parent,
)
from hami_trio.errors import LockDirError
from tests.allocation.immutable import clear_immutable

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


# --- recovery: every refusal says what to do, is counted; --repair ----------------------------


def refusal_count(reason: str) -> float:
    value = REGISTRY.get_sample_value("hami_trio_lock_parent_refusals_total", {"reason": reason})
    return value or 0.0


@pytest.mark.parametrize(
    ("setup", "reason", "recovery"),
    [
        (lambda t: t.lock.symlink_to(t.outside), "symlink", "`unlink "),
        (lambda t: t.lock.write_text("x"), "not-directory", "`unlink "),
        (lambda t: t.parent.chmod(0o777), "parent", "hami-trio never changes the parent"),
    ],
)
def test_every_refusal_names_a_recovery_and_is_counted(
    tree: Tree, setup: Callable[[Tree], None], reason: str, recovery: str
) -> None:
    setup(tree)
    before = refusal_count(reason)
    error = refused(tree, "recovery: ")
    assert isinstance(error, LockParentRefused)
    assert error.reason == reason
    assert recovery in str(error)
    assert refusal_count(reason) == before + 1


def test_an_unusable_path_is_counted_as_path() -> None:
    before = refusal_count("path")
    with pytest.raises(LockParentRefused, match="configure an absolute path"):
        prepare_lock_parent("tmp/vgpulock", ME)
    assert refusal_count("path") == before + 1


@pytest.mark.root
def test_repair_gives_a_foreign_directory_back_through_the_descriptor(tree: Tree) -> None:
    tree.lock.mkdir()
    (tree.lock / "their.lock").write_text("held")
    os.chown(tree.lock, NOBODY, NOBODY)
    tree.lock.chmod(0o700)
    inode = tree.lock.stat().st_ino
    error = refused(tree, f"owned by UID {NOBODY}")
    assert f"hami-trio prepare-lock-dir --repair {tree.lock}" in str(error)
    assert prepare_lock_parent(tree.path, ME, repair=True) == tree.path
    st = os.lstat(tree.lock)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_ino) == (
        ME,
        os.getegid(),
        0o1777,
        inode,
    )
    assert (tree.lock / "their.lock").read_text() == "held"  # entries are not ours to judge


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        (lambda t: t.lock.symlink_to(t.outside), "is a symlink"),
        (lambda t: os.mkfifo(t.lock), "is a FIFO"),
        (lambda t: t.parent.chmod(0o777), "not sticky"),
    ],
)
def test_repair_still_refuses_what_it_cannot_fix_safely(
    tree: Tree, setup: Callable[[Tree], None], match: str
) -> None:
    setup(tree)
    before = snapshot(tree.outside)
    with pytest.raises(LockParentRefused, match=match):
        prepare_lock_parent(tree.path, ME, repair=True, broker=True)
    assert snapshot(tree.outside) == before
    assert os.listdir(tree.outside) == []


def test_the_broker_mount_point_is_made_only_with_the_broker_on(
    tree: Tree, umask_077: None
) -> None:
    prepare_lock_parent(tree.path, ME)
    assert not (tree.lock / "hostpid").exists()
    hook = swap_hook("mount-point-checked", lambda: None)
    prepare_lock_parent(tree.path, ME, broker=True, step_hook=hook)
    assert hook.seen[-1] == "mount-point-checked"  # type: ignore[attr-defined]
    st = os.lstat(tree.lock / "hostpid")
    assert stat.S_ISDIR(st.st_mode)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o755, ME)
    clear_immutable(tree.lock)  # as root the preparation made it immutable
    (tree.lock / "hostpid").chmod(0o777)  # group/other-writable: fixed like the parent's mode
    prepare_lock_parent(tree.path, ME, broker=True)
    assert stat.S_IMODE(os.lstat(tree.lock / "hostpid").st_mode) == 0o755


@pytest.mark.parametrize("planted", ["symlink", "file", "fifo"])
def test_a_planted_mount_point_is_refused_then_removed_by_repair_without_following(
    tree: Tree, planted: str
) -> None:
    prepare_lock_parent(tree.path, ME)
    target = tree.outside / "target"
    target.mkdir(mode=0o700)
    mount_point = tree.lock / "hostpid"
    if planted == "symlink":
        mount_point.symlink_to(target)
    elif planted == "file":
        mount_point.write_text("x")
    else:
        os.mkfifo(mount_point)
    before = snapshot(target)
    with pytest.raises(LockParentRefused, match="nested mount point") as info:
        prepare_lock_parent(tree.path, ME, broker=True)
    assert info.value.reason == "mount-point"
    assert f"--repair --broker {tree.lock}" in str(info.value)
    prepare_lock_parent(tree.path, ME, broker=True, repair=True)
    assert stat.S_ISDIR(os.lstat(mount_point).st_mode)
    assert snapshot(target) == before
    assert os.listdir(target) == []


@pytest.mark.root
def test_a_foreign_mount_point_directory_is_refused_and_repaired(tree: Tree) -> None:
    prepare_lock_parent(tree.path, ME)
    (tree.lock / "hostpid").mkdir()
    os.chown(tree.lock / "hostpid", NOBODY, NOBODY)
    with pytest.raises(LockParentRefused, match=f"hostpid is owned by UID {NOBODY}"):
        prepare_lock_parent(tree.path, ME, broker=True)
    prepare_lock_parent(tree.path, ME, broker=True, repair=True)
    assert os.lstat(tree.lock / "hostpid").st_uid == ME


# --- inspect_lock_parent: the agent's read-only check -----------------------------------------


def test_inspect_is_read_only_and_reports_each_state(tree: Tree) -> None:
    assert inspect_lock_parent(tree.path, ME).state == "missing"
    assert inspect_lock_parent(str(tree.outside / "no" / "vgpulock"), ME).state == "missing"
    assert not tree.lock.exists()  # nothing created
    prepare_lock_parent(tree.path, ME)
    assert inspect_lock_parent(tree.path, ME, broker=True).state == "ok"  # hostpid may be missing
    tree.lock.chmod(0o777)
    state = inspect_lock_parent(tree.path, ME)
    assert (state.state, state.reason) == ("unsafe", "mode")
    assert mode_of(tree.lock) == 0o777  # not restored by a check
    tree.lock.chmod(0o1777)
    (tree.lock / "hostpid").symlink_to(tree.outside)
    assert inspect_lock_parent(tree.path, ME).state == "ok"  # broker off: not used
    assert inspect_lock_parent(tree.path, ME, broker=True).reason == "mount-point"


def test_inspect_does_not_block_on_a_fifo(tree: Tree) -> None:
    os.mkfifo(tree.lock)
    state = inspect_lock_parent(tree.path, ME)
    assert (state.state, state.reason) == ("unsafe", "not-directory")
    assert "is a FIFO" in state.message


def test_inspect_reports_an_unsafe_parent_and_a_bad_path(tree: Tree) -> None:
    tree.parent.chmod(0o777)
    assert inspect_lock_parent(tree.path, ME).reason == "parent"
    assert inspect_lock_parent("relative", ME).reason == "path"
