from __future__ import annotations

import posixpath

import pytest
from hypothesis import given

from hami_trio.allocation.constants import (
    BROKER_CONTAINER_DIR,
    LOCK_PARENT,
    container_target,
    go_clean,
)
from tests.strategies import allocation as st_alloc

# Go's own path.Clean test table (src/path/path_test.go), as (input, expected) facts.
GO_CLEAN_CASES = [
    ("", "."),
    ("abc", "abc"),
    ("abc/def", "abc/def"),
    ("a/b/c", "a/b/c"),
    (".", "."),
    ("..", ".."),
    ("../..", "../.."),
    ("../../abc", "../../abc"),
    ("/abc", "/abc"),
    ("/", "/"),
    ("abc/", "abc"),
    ("abc/def/", "abc/def"),
    ("a/b/c/", "a/b/c"),
    ("./", "."),
    ("../", ".."),
    ("../../", "../.."),
    ("/abc/", "/abc"),
    ("abc//def//ghi", "abc/def/ghi"),
    ("//abc", "/abc"),
    ("///abc", "/abc"),
    ("//abc//", "/abc"),
    ("abc//", "abc"),
    ("abc/./def", "abc/def"),
    ("/./abc/def", "/abc/def"),
    ("abc/.", "abc"),
    ("abc/def/ghi/../jkl", "abc/def/jkl"),
    ("abc/def/../ghi/../jkl", "abc/jkl"),
    ("abc/def/..", "abc"),
    ("abc/def/../..", "."),
    ("/abc/def/../..", "/"),
    ("abc/def/../../..", ".."),
    ("/abc/def/../../..", "/"),
    ("abc/def/../../../ghi/jkl/../../../mno", "../../mno"),
    ("abc/./../def", "def"),
    ("abc//./../def", "def"),
    ("abc/../../././../def", "../../def"),
]


@pytest.mark.parametrize(("path", "expected"), GO_CLEAN_CASES)
def test_go_clean_matches_go_table(path: str, expected: str) -> None:
    assert go_clean(path) == expected
    # Go's test also checks Clean is idempotent on its own output.
    assert go_clean(expected) == expected


@pytest.mark.parametrize(
    "spelling",
    [
        "/tmp/vgpulock",
        "tmp/vgpulock",
        "/tmp//vgpulock/",
        "/tmp/./vgpulock",
        "/tmp/x/../vgpulock",
        "//tmp/vgpulock",
        "/../tmp/vgpulock",
        "../../tmp/vgpulock/.",
        "tmp/vgpulock/hostpid/..",
    ],
)
def test_container_target_equivalent_parent_spellings(spelling: str) -> None:
    assert container_target(spelling) == LOCK_PARENT


@pytest.mark.parametrize(
    ("spelling", "target"),
    [
        ("", "/"),
        ("/tmp/vgpulockx", "/tmp/vgpulockx"),
        ("/tmp/vgpulock/hostpid/", BROKER_CONTAINER_DIR),
        ("tmp/vgpulock//hostpid", BROKER_CONTAINER_DIR),
        ("/tmp/vgpulock/hostpid/broker.sock", "/tmp/vgpulock/hostpid/broker.sock"),
        ("/tmp/vgpulock/../vgpulock2", "/tmp/vgpulock2"),
    ],
)
def test_container_target_distinguishes_near_misses(spelling: str, target: str) -> None:
    assert container_target(spelling) == target


def test_posix_normpath_would_be_wrong_for_two_leading_slashes() -> None:
    # The reason go_clean exists: POSIX keeps a leading "//", Go (and the runtime) does not.
    assert posixpath.normpath("//tmp/vgpulock") == "//tmp/vgpulock"
    assert go_clean("//tmp/vgpulock") == "/tmp/vgpulock"


@given(st_alloc.raw_paths())
def test_go_clean_is_idempotent_and_normal(path: str) -> None:
    clean = go_clean(path)
    assert go_clean(clean) == clean
    assert "//" not in clean
    assert clean == "/" or not clean.endswith("/")
    elements = clean.split("/")
    assert "." not in elements or clean == "."
    # ".." survives only as a leading run of a relative path.
    rest = elements[1:] if clean.startswith("/") else elements
    while not clean.startswith("/") and rest and rest[0] == "..":
        rest = rest[1:]
    assert ".." not in rest


@given(st_alloc.raw_paths())
def test_container_target_agrees_with_normpath_on_single_slash_root(path: str) -> None:
    # For a path starting with exactly one slash, POSIX normpath and Go Clean agree; this is
    # an independent oracle for container_target.
    assert container_target(path) == posixpath.normpath("/" + path.lstrip("/"))


@given(st_alloc.parent_paths())
def test_generated_parent_spellings_are_equivalent(path: str) -> None:
    assert container_target(path) == LOCK_PARENT


@given(st_alloc.broker_paths())
def test_generated_broker_spellings_are_equivalent(path: str) -> None:
    assert container_target(path) == BROKER_CONTAINER_DIR
