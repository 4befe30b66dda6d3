"""The Python broker client's decisions (pure) and its refusals that need no sandbox.

Exchanges with real servers, in a PID + mount namespace behind a read-only bind mount, are
the contract tests in tests/clients/test_contract.py; they run this client and the C one.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
from pathlib import Path

import pytest
from hypothesis import given

from hami_trio.broker.client import (
    DEFAULT_CLIENT_SOCKET_PATH,
    NoAnswer,
    Reason,
    check_directory,
    check_socket,
    classify_connect_error,
    classify_response,
    query_host_pid,
)
from tests.strategies.client import any_received_bytes, valid_responses

P = Path("/x/hostpid/broker.sock")
RESPONSE = struct.Struct("!4sHHI")


def fake_stat(mode: int, uid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


def reason_of(result: int | NoAnswer | None) -> Reason | None:
    assert not isinstance(result, int)
    return None if result is None else result.reason


def test_reason_names_match_the_c_client() -> None:
    # hostpid_client.c's status_names table, in its enum order: "ok" then the reasons.
    source = (Path(__file__).parents[2] / "clients" / "c" / "hostpid_client.c").read_text()
    table = re.search(r"status_names\[\] = \{(.*?)\};", source, re.DOTALL)
    assert table is not None
    assert re.findall(r'"(\w+)"', table.group(1)) == ["ok", *(r.value for r in Reason)]


def test_default_path_is_the_containers_nested_mount() -> None:
    assert Path("/tmp/vgpulock/hostpid/broker.sock") == DEFAULT_CLIENT_SOCKET_PATH


class TestCheckDirectory:
    def test_trusted(self) -> None:
        assert check_directory(P.parent, fake_stat(stat.S_IFDIR | 0o711), True) is None
        assert check_directory(P.parent, fake_stat(stat.S_IFDIR | 0o755), True) is None

    @pytest.mark.parametrize("mode", [0o777, 0o731, 0o713, 0o1777, 0o770])
    def test_group_or_other_write_bits(self, mode: int) -> None:
        found = check_directory(P.parent, fake_stat(stat.S_IFDIR | mode), True)
        assert reason_of(found) is Reason.UNSAFE_MODE

    def test_not_a_directory(self) -> None:
        found = check_directory(P.parent, fake_stat(stat.S_IFLNK | 0o777), True)
        assert reason_of(found) is Reason.UNSAFE_MODE

    def test_owner(self) -> None:
        found = check_directory(P.parent, fake_stat(stat.S_IFDIR | 0o711, uid=65534), True)
        assert reason_of(found) is Reason.UNSAFE_OWNER
        assert found is not None
        assert "uid 65534" in found.detail

    def test_expected_uid_is_configurable_for_tests(self) -> None:
        st = fake_stat(stat.S_IFDIR | 0o711, uid=1000)
        assert check_directory(P.parent, st, True, expected_uid=1000) is None
        assert reason_of(check_directory(P.parent, st, True)) is Reason.UNSAFE_OWNER

    def test_read_write_mount(self) -> None:
        found = check_directory(P.parent, fake_stat(stat.S_IFDIR | 0o711), False)
        assert reason_of(found) is Reason.NOT_READ_ONLY

    def test_owner_is_checked_before_mode_and_mount(self) -> None:
        # The order is part of the contract: both clients report the same first failure.
        found = check_directory(P.parent, fake_stat(stat.S_IFDIR | 0o777, uid=5), False)
        assert reason_of(found) is Reason.UNSAFE_OWNER


class TestCheckSocket:
    def test_trusted(self) -> None:
        assert check_socket(P, fake_stat(stat.S_IFSOCK | 0o666)) is None

    @pytest.mark.parametrize("kind", [stat.S_IFREG, stat.S_IFLNK, stat.S_IFDIR, stat.S_IFIFO])
    def test_not_a_socket(self, kind: int) -> None:
        assert reason_of(check_socket(P, fake_stat(kind | 0o666))) is Reason.NOT_SOCKET

    def test_owner(self) -> None:
        found = check_socket(P, fake_stat(stat.S_IFSOCK | 0o666, uid=65534))
        assert reason_of(found) is Reason.UNSAFE_OWNER


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (errno.ENOENT, Reason.MISSING),
        (errno.ECONNREFUSED, Reason.STALE),
        (errno.EAGAIN, Reason.TIMEOUT),
        (errno.ETIMEDOUT, Reason.TIMEOUT),
        (errno.EACCES, Reason.REFUSED),
        (errno.ENOTSOCK, Reason.REFUSED),
    ],
)
def test_connect_errors(err: int, reason: Reason) -> None:
    assert classify_connect_error(P, err).reason is reason


class TestClassifyResponse:
    def test_success(self) -> None:
        assert classify_response(P, RESPONSE.pack(b"HPID", 1, 0, 4242)) == 4242

    @pytest.mark.parametrize(
        "data",
        [
            RESPONSE.pack(b"HPIX", 1, 0, 4242),  # wrong magic
            RESPONSE.pack(b"HPID", 2, 0, 4242),  # wrong version
            RESPONSE.pack(b"HPID", 1, 1, 0),  # status 1 (invalid request)
            RESPONSE.pack(b"HPID", 1, 0, 0),  # PID 0
            RESPONSE.pack(b"HPID", 1, 0, 2**31),  # does not fit a pid_t
            RESPONSE.pack(b"HPID", 1, 0, 4242)[:11],  # 11 bytes
            b"",
        ],
        ids=["magic", "version", "status1", "pid0", "pid_huge", "short", "empty"],
    )
    def test_defects_are_malformed(self, data: bytes) -> None:
        assert reason_of(classify_response(P, data)) is Reason.MALFORMED

    @given(valid_responses())
    def test_every_valid_response_gives_its_pid(self, case: tuple[bytes, int]) -> None:
        data, pid = case
        assert classify_response(P, data) == pid

    @given(any_received_bytes())
    def test_a_pid_only_from_an_exactly_valid_response(self, data: bytes) -> None:
        result = classify_response(P, data)
        if isinstance(result, int):
            assert len(data) == 12
            assert data[:8] == b"HPID\x00\x01\x00\x00"
            assert result == int.from_bytes(data[8:], "big")
            assert 0 < result < 2**31
        else:
            assert result.reason is Reason.MALFORMED


@pytest.mark.parametrize("value", [None, "", "true", " 1", "01", "1 ", "yes"])
def test_switch_off_is_disabled(tmp_path: Path, value: str | None) -> None:
    env = {} if value is None else {"LIBVGPU_HOSTPID_BROKER": value}
    result = query_host_pid(tmp_path / "absent" / "broker.sock", env=env)
    assert reason_of(result) is Reason.DISABLED


def test_switch_exactly_1_queries(tmp_path: Path) -> None:
    result = query_host_pid(
        tmp_path / "absent" / "broker.sock", env={"LIBVGPU_HOSTPID_BROKER": "1"}
    )
    assert reason_of(result) is Reason.MISSING


def test_switch_read_from_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "absent" / "broker.sock"
    monkeypatch.setenv("LIBVGPU_HOSTPID_BROKER", "1")
    assert reason_of(query_host_pid(path)) is Reason.MISSING
    monkeypatch.setenv("LIBVGPU_HOSTPID_BROKER", "true")
    assert reason_of(query_host_pid(path)) is Reason.DISABLED


def test_enabled_overrides_the_switch(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "broker.sock"
    assert reason_of(query_host_pid(path, enabled=True, env={})) is Reason.MISSING
    on = {"LIBVGPU_HOSTPID_BROKER": "1"}
    assert reason_of(query_host_pid(path, enabled=False, env=on)) is Reason.DISABLED


def test_writable_directory_is_not_read_only(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    found = query_host_pid(tmp_path / "broker.sock", enabled=True, expected_uid=os.geteuid())
    assert reason_of(found) is Reason.NOT_READ_ONLY


def test_directory_of_another_owner(tmp_path: Path) -> None:
    found = query_host_pid(tmp_path / "broker.sock", enabled=True, expected_uid=os.geteuid() + 1)
    assert reason_of(found) is Reason.UNSAFE_OWNER


def test_symlinked_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    found = query_host_pid(tmp_path / "link" / "broker.sock", enabled=True)
    assert reason_of(found) is Reason.UNSAFE_MODE


@pytest.mark.parametrize("deadline", [0, -1.0, float("nan"), float("inf")])
def test_deadline_must_be_positive(tmp_path: Path, deadline: float) -> None:
    with pytest.raises(ValueError, match="deadline"):
        query_host_pid(tmp_path / "broker.sock", deadline, enabled=True)
