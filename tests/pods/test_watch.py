"""Tests of the pod watch: backoff, settings and the source; the list/watch loop against a
scripted API on a MockClock (exact delays from a seeded random source); then the real
kubernetes-asyncio client over real HTTP(S) against :mod:`tests.pods.fake_kube`.

The network tests run on the real clock with millisecond backoff settings: MockClock's
autojump would treat waiting for a loopback socket as idle time and fire the client's
timeouts.  They assert no timing at all; the schedule is the MockClock tests' job.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import cast

import pytest
import trio
import trio.testing
import trio_asyncio
import trustme
from kubernetes_asyncio import client as k8s_client
from prometheus_client import CollectorRegistry

from hami_trio.errors import ConfigError, PodSourceError
from hami_trio.pods.access import KubeAccess
from hami_trio.pods.decode import KeepRules
from hami_trio.pods.source import PodInfo, PodSource
from hami_trio.pods.watch import (
    Backoff,
    KubernetesPodSource,
    PodWatcher,
    WatchSettings,
    serve_pod_watch,
)
from tests.pods.fake_kube import FakeKubeApi

FAST = WatchSettings(
    backoff_initial=0.02,
    backoff_max=0.2,
    watch_timeout=30,
    connect_timeout=2,
    list_timeout=5,
    read_grace=5,
    min_watch_duration=0.05,
    keep=KeepRules().with_labels(["v"]),
)
MIG = "hami.io/vgpu-mig-allocations"


# Backoff, settings, the source --------------------------------------------------------------


class FixedRandom(random.Random):
    """A random source whose ``random()`` is always ``value``: 0.0 gives every delay's floor
    (``uniform(a, b) == a``), 1.0 its ceiling."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_grows_with_jitter_and_caps() -> None:
    backoff = Backoff(0.5, 8.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(10)]
    ceilings = [min(8.0, 0.5 * 2**n) for n in range(10)]
    twin = random.Random(7)  # the same seed draws exactly the same jitter
    assert delays == [twin.uniform(ceiling / 2, ceiling) for ceiling in ceilings]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert delays == sorted(delays[:5]) + delays[5:]  # non-decreasing until the cap
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay() == twin.uniform(0.25, 0.5)
    with pytest.raises(ValueError, match="initial"):
        Backoff(0, 1)
    with pytest.raises(ValueError, match="initial"):
        Backoff(2, 1)


def test_backoff_interval_ends_are_exact() -> None:
    floors = Backoff(0.5, 8.0, rng=FixedRandom(0.0))
    assert [floors.next_delay() for _ in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    tops = Backoff(0.5, 8.0, rng=FixedRandom(1.0))
    assert [tops.next_delay() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    tops.reset()
    assert tops.next_delay() == 0.5


def test_backoff_survives_many_failures() -> None:
    for value, last in ((0.0, 15.0), (1.0, 30.0)):
        backoff = Backoff(0.1, 30.0, rng=FixedRandom(value))
        for _ in range(5000):
            delay = backoff.next_delay()
        assert delay == last
    backoff = Backoff(0.1, 30.0, rng=random.Random(1))
    twin = random.Random(1)
    for n in range(5000):
        ceiling = 30.0 if n >= 9 else 0.1 * 2**n  # 0.1 * 2**9 = 51.2 is past the cap
        assert backoff.next_delay() == twin.uniform(ceiling / 2, ceiling)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="watch_timeout"):
        WatchSettings(watch_timeout=0)
    with pytest.raises(ValueError, match="initial"):
        WatchSettings(backoff_initial=5, backoff_max=1)


def test_source_before_any_list() -> None:
    registry = CollectorRegistry()
    source = KubernetesPodSource("node-a", registry=registry)
    checked: PodSource = source  # structurally a PodSource
    assert not checked.ready
    assert not checked.authoritative
    assert checked.lookup("x") is None
    assert registry.get_sample_value("hami_trio_pod_watch_synced") == 0
    assert registry.get_sample_value("hami_trio_pod_watch_relists_total") == 0
    with pytest.raises(ConfigError):
        KubernetesPodSource("Bad_Name")


# The list/watch loop on a MockClock -----------------------------------------------------------

SCHEDULE = WatchSettings(backoff_initial=0.5, backoff_max=4.0, min_watch_duration=1.0)
EMPTY_LIST = json.dumps({"metadata": {"resourceVersion": "7"}, "items": []}).encode()


class ScriptedResponse:
    """What ``list_pod_for_all_namespaces(_preload_content=False)`` returns: an aiohttp-like
    response with a status and a body (a watch's 200 stream is empty: it ends at once)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self._body = body
        self.content = self

    async def read(self, n: int = -1) -> bytes:
        """The body, ``n`` bytes at a time, then b"" (a watch's stream ends at once)."""
        taken = self._body if n < 0 else self._body[:n]
        self._body = self._body[len(taken) :]
        return taken

    def close(self) -> None:
        pass


class ScriptedCore:
    """A CoreV1Api stand-in: records when (MockClock time) each list and watch was asked for
    and answers ``list_status`` / ``watch_status``."""

    def __init__(self, *, list_status: int = 200, watch_status: int = 200) -> None:
        self.list_status = list_status
        self.watch_status = watch_status
        self.lists: list[float] = []
        self.watches: list[float] = []

    async def list_pod_for_all_namespaces(self, **kwargs: object) -> ScriptedResponse:
        if kwargs.get("watch"):
            self.watches.append(trio.current_time())
            status_body = b'{"kind": "Status", "code": 503}' if self.watch_status != 200 else b""
            return ScriptedResponse(self.watch_status, status_body)
        self.lists.append(trio.current_time())
        return ScriptedResponse(self.list_status, EMPTY_LIST)


async def run_watcher(core: ScriptedCore, seed: int, until: Callable[[], bool]) -> None:
    source = KubernetesPodSource("node-a")
    watcher = PodWatcher(source, cast(k8s_client.CoreV1Api, core), SCHEDULE, random.Random(seed))
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        with trio.fail_after(600):
            while not until():  # noqa: ASYNC110 - the loop under test has no event to wait on
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def schedule(seed: int, count: int, *, per_attempt_draws: int = 0) -> list[float]:
    """The delays a seeded :class:`Backoff` with ``SCHEDULE``'s bounds gives; each attempt
    first draws ``per_attempt_draws`` other numbers from the same source (a watch's timeout)."""
    rng = random.Random(seed)
    backoff = Backoff(SCHEDULE.backoff_initial, SCHEDULE.backoff_max, rng=rng)
    delays = []
    for _ in range(count):
        for _ in range(per_attempt_draws):
            rng.random()
        delays.append(backoff.next_delay())
    return delays


async def test_failed_lists_back_off_on_the_exact_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    core = ScriptedCore(list_status=503)
    await run_watcher(core, 11, lambda: len(core.lists) == 9)
    assert gaps(core.lists) == pytest.approx(schedule(11, 8), abs=1e-9)
    assert core.watches == []


async def test_failed_watches_back_off_on_the_exact_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    core = ScriptedCore(watch_status=503)
    await run_watcher(core, 12, lambda: len(core.watches) == 9)
    assert len(core.lists) == 1  # a failed watch resumes, it does not relist
    # Each watch draws its server timeout from the same source before failing.
    assert gaps(core.watches) == pytest.approx(schedule(12, 8, per_attempt_draws=1), abs=1e-9)


async def test_watches_that_end_at_once_back_off_instead_of_spinning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    core = ScriptedCore()  # every watch ends cleanly, at once, with no event
    await run_watcher(core, 13, lambda: len(core.watches) == 9)
    assert len(core.lists) == 1
    assert gaps(core.watches) == pytest.approx(schedule(13, 8, per_attempt_draws=1), abs=1e-9)


# Against the fake API server ---------------------------------------------------------------


def write_kubeconfig(path: Path, server: str, token: str | None = None) -> str:
    """A kubeconfig (JSON is YAML) pointing at ``server``."""
    user: dict[str, str] = {"token": token} if token else {}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "fake", "user": "me"}}],
        "current-context": "ctx",
    }
    path.write_text(json.dumps(doc))
    return str(path)


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` (state of the fake server and of the watch) for up to 10 s."""
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 - two independent components, no shared Event
            await trio.sleep(0.005)


async def start_watch(
    nursery: trio.Nursery,
    access: KubeAccess,
    *,
    registry: CollectorRegistry | None = None,
    settings: WatchSettings = FAST,
    node: str = "node-a",
) -> KubernetesPodSource:
    source = KubernetesPodSource(node, registry=registry)
    await nursery.start(
        partial(serve_pod_watch, source, access, settings=settings, rng=random.Random(3))
    )
    return source


def pod_uids(source: KubernetesPodSource) -> set[str]:
    return set(source.pods())


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeKubeApi:
    api = FakeKubeApi()
    await nursery.start(api.serve)
    return api


@pytest.fixture
def access(fake: FakeKubeApi, tmp_path: Path) -> KubeAccess:
    return KubeAccess(
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{fake.port}")
    )


def lists(fake: FakeKubeApi) -> list[str | None]:
    return [r.resource_version for r in fake.requests if not r.watch]


def watches(fake: FakeKubeApi) -> list[str | None]:
    return [r.resource_version for r in fake.requests if r.watch]


async def test_initial_list_is_scoped_to_the_node(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    mine = fake.add_pod(
        "train",
        namespace="team",
        containers=("worker", "sidecar"),
        init_containers=("setup",),
        annotations={"hami.io/vgpu-mig-allocations": "[]", "other": "x"},
        labels={"hami.io/vgpu-node": "node-a"},
    )
    fake.add_pod("elsewhere", node="node-b")
    registry = CollectorRegistry()
    source = await start_watch(nursery, access, registry=registry)
    await wait_until(lambda: source.authoritative)
    assert source.ready
    assert pod_uids(source) == {mine}
    assert source.lookup(mine) == PodInfo(
        uid=mine,
        namespace="team",
        name="train",
        containers=("worker", "sidecar"),
        init_containers=("setup",),
        annotations={"hami.io/vgpu-mig-allocations": "[]"},
        labels={"hami.io/vgpu-node": "node-a"},
        phase="Running",
    )
    await wait_until(lambda: fake.open_watches == 1)
    list_request, watch_request = fake.requests[:2]
    assert list_request.field_selector == "spec.nodeName=node-a"
    assert list_request.resource_version == "0"  # the first list may come from the cache
    assert watch_request.field_selector == "spec.nodeName=node-a"
    assert watch_request.resource_version == str(fake.resource_version)
    assert watch_request.params["allowWatchBookmarks"].lower() == "true"
    assert 30 <= int(watch_request.params["timeoutSeconds"]) < 60
    assert registry.get_sample_value("hami_trio_pod_watch_synced") == 1
    assert registry.get_sample_value("hami_trio_pod_watch_relists_total") == 0


async def test_added_modified_deleted(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    source = await start_watch(nursery, access)
    await wait_until(lambda: source.ready)
    assert source.pods() == {}
    uid = fake.add_pod("a", annotations={MIG: "1"})
    other = fake.add_pod("b", node="node-b")
    await wait_until(lambda: uid in source.pods())
    fake.modify_pod(uid, annotations={MIG: "2", "hami.io/x": "3"})
    await wait_until(lambda: source.pods()[uid].annotations == {MIG: "2"})
    fake.delete_pod(uid)
    await wait_until(lambda: uid not in source.pods())
    assert other not in source.pods()
    assert source.resource_version == str(fake.resource_version)
    assert lists(fake) == ["0"]  # no relist for ordinary events


async def test_bookmark_moves_the_resume_point(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    first_rv = source.resource_version
    fake.add_pod("not-mine", node="node-b")  # moves the cluster's version, invisible to us
    fake.bookmark()
    await wait_until(lambda: source.resource_version == str(fake.resource_version))
    assert source.resource_version != first_rv
    fake.end_watches()  # like the server's timeoutSeconds: resume, do not relist
    await wait_until(lambda: len(watches(fake)) == 2 and fake.open_watches == 1)
    assert watches(fake) == [first_rv, str(fake.resource_version)]
    assert lists(fake) == ["0"]
    assert source.authoritative


@pytest.mark.parametrize("gone_as_status", [False, True], ids=["error-event", "http-410"])
async def test_expired_watch_relists_without_losing_or_duplicating(
    nursery: trio.Nursery, tmp_path: Path, gone_as_status: bool
) -> None:
    fake = FakeKubeApi(gone_as_status=gone_as_status)
    await nursery.start(fake.serve)
    access = KubeAccess(
        kubeconfig=write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    )
    keep = fake.add_pod("keep")
    gone = fake.add_pod("gone")
    registry = CollectorRegistry()
    source = await start_watch(nursery, access, registry=registry)
    await wait_until(lambda: fake.open_watches == 1)
    assert pod_uids(source) == {keep, gone}
    # Changes the watch never delivers, then history is compacted and the watch drops: the
    # client's resume point is too old and only a new list can tell it what happened.
    fake.delete_pod(gone)
    fake.modify_pod(keep, labels={"v": "2"})
    new = fake.add_pod("new")
    fake.compact()
    fake.end_watches()
    await wait_until(lambda: source.relists == 1 and fake.open_watches == 1)
    assert source.pods().keys() == fake.pods_on("node-a").keys() == {keep, new}
    assert source.pods()[keep].labels == {"v": "2"}
    assert lists(fake) == ["0", None]  # the relist is a consistent read
    assert registry.get_sample_value("hami_trio_pod_watch_relists_total") == 1
    assert source.authoritative


async def test_undecodable_event_relists(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    uid = fake.add_pod("a")
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    fake.send_raw(b'{"type": "ADDED", "object": {"metadata": {"resourceVersion": "1"}}}')
    await wait_until(lambda: source.relists == 1)
    assert pod_uids(source) == {uid}


async def test_error_event_other_than_410_retries_the_watch(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    rv = source.resource_version
    fake.send_error(500, "InternalError", "etcd hiccup")
    await wait_until(lambda: len(watches(fake)) == 2 and fake.open_watches == 1)
    assert watches(fake) == [rv, rv]
    assert source.relists == 0


async def test_outage_keeps_pods_backs_off_and_recovers(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    a = fake.add_pod("a")
    b = fake.add_pod("b")
    registry = CollectorRegistry()
    source = await start_watch(nursery, access, registry=registry)
    await wait_until(lambda: fake.open_watches == 1)
    port = fake.port
    assert port is not None
    fake.stop()
    await wait_until(lambda: not source.authoritative)
    await trio.sleep(0.3)  # several refused reconnects
    # Last known set, still ready (metrics keep flowing), but not authoritative.
    assert pod_uids(source) == {a, b}
    assert source.ready
    assert registry.get_sample_value("hami_trio_pod_watch_synced") == 0
    # The cluster changes while we cannot see it; history is kept, so no relist is needed.
    fake.delete_pod(a)
    c = fake.add_pod("c")
    await nursery.start(partial(fake.serve, port=port))
    await wait_until(lambda: pod_uids(source) == {b, c} and source.authoritative)
    assert source.relists == 0
    assert registry.get_sample_value("hami_trio_pod_watch_synced") == 1


async def test_authority_returns_only_with_news_from_the_resumed_watch(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    fake.add_pod("a")
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    port = fake.port
    assert port is not None
    fake.stop()
    await wait_until(lambda: not source.authoritative)
    await nursery.start(partial(fake.serve, port=port))
    await wait_until(lambda: fake.open_watches == 1)
    await trio.sleep(0.1)
    # Connected, but nothing replayed yet: a pod created during the outage could still be
    # on its way, so the lister must not treat unknown pods as gone.
    assert not source.authoritative
    fake.bookmark()
    await wait_until(lambda: source.authoritative)
    assert source.relists == 0


async def test_error_responses_back_off(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    uid = fake.add_pod("a")
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    fake.fail_with(503)
    fake.end_watches()
    await wait_until(lambda: not source.authoritative)
    before = len(fake.requests)
    # It keeps retrying (the exact schedule is test_failed_watches_back_off_on_the_exact_
    # schedule's, on a MockClock) and keeps the pods it knows.
    await wait_until(lambda: len(fake.requests) - before >= 3)
    assert pod_uids(source) == {uid}
    fake.fail_with(None)
    await wait_until(lambda: fake.open_watches == 1)
    fake.bookmark()  # a quiet node: authority comes back with the first bookmark
    await wait_until(lambda: source.authoritative)
    assert source.relists == 0


async def test_unauthorized_never_becomes_ready(nursery: trio.Nursery, tmp_path: Path) -> None:
    fake = FakeKubeApi(token="right")
    await nursery.start(fake.serve)
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}", "wrong")
    source = await start_watch(nursery, KubeAccess(kubeconfig=kubeconfig))
    await wait_until(lambda: len(fake.requests) >= 3)
    assert not source.ready
    assert all(r.authorization == "Bearer wrong" and not r.watch for r in fake.requests)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _in_cluster(tmp_path: Path, ca: trustme.CA, port: int, token: str) -> KubeAccess:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    ca.cert_pem.write_to_path(str(sa / "ca.crt"))
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
    return KubeAccess.from_env(env, service_account_dir=str(sa))


async def _serve_tls(
    nursery: trio.Nursery, fake: FakeKubeApi, ca: trustme.CA, tmp_path: Path
) -> None:
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "server.crt"))
    for extra in leaf.cert_chain_pems[1:]:
        extra.write_to_path(str(tmp_path / "server.crt"), append=True)
    leaf.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    await nursery.start(
        partial(
            fake.serve, certfile=str(tmp_path / "server.crt"), keyfile=str(tmp_path / "server.key")
        )
    )


async def test_in_cluster_tls_with_service_account(
    nursery: trio.Nursery, tmp_path: Path, ca: trustme.CA
) -> None:
    fake = FakeKubeApi(token="sa-token")
    await _serve_tls(nursery, fake, ca, tmp_path)
    uid = fake.add_pod("a")
    assert fake.port is not None
    source = await start_watch(nursery, _in_cluster(tmp_path, ca, fake.port, "sa-token"))
    await wait_until(lambda: source.authoritative and fake.open_watches == 1)
    assert pod_uids(source) == {uid}
    assert {r.authorization for r in fake.requests} == {"Bearer sa-token"}


async def test_in_cluster_tls_rejects_an_unknown_ca(
    nursery: trio.Nursery, tmp_path: Path, ca: trustme.CA
) -> None:
    fake = FakeKubeApi(token="sa-token")
    await _serve_tls(nursery, fake, ca, tmp_path)
    assert fake.port is not None
    source = await start_watch(nursery, _in_cluster(tmp_path, trustme.CA(), fake.port, "sa-token"))
    await trio.sleep(0.3)
    assert not source.ready
    assert fake.requests == []  # the handshake failed before any request was sent


async def test_configuration_errors_fail_start_up(nursery: trio.Nursery, tmp_path: Path) -> None:
    source = KubernetesPodSource("node-a")
    with pytest.raises(PodSourceError, match="kubeconfig"):
        await nursery.start(serve_pod_watch, source, KubeAccess(kubeconfig=str(tmp_path / "no")))
    sa = KubeAccess(
        service_host="127.0.0.1",
        service_port="1",
        token_path=str(tmp_path / "token"),
        ca_path=str(tmp_path / "ca.crt"),
    )
    with pytest.raises(PodSourceError, match="token"):
        await nursery.start(serve_pod_watch, source, sa)
    assert not source.ready


async def test_cancelled_watch_shuts_down_cleanly(fake: FakeKubeApi, access: KubeAccess) -> None:
    tasks_before = _living_tasks()
    async with trio.open_nursery() as inner:
        source = await start_watch(inner, access)
        await wait_until(lambda: fake.open_watches == 1)
        inner.cancel_scope.cancel()
    assert not source.authoritative
    # The server sees the connection go away promptly.
    await wait_until(lambda: fake.closed_watches == 1 and fake.open_watches == 0)
    assert _living_tasks() == tasks_before
    gc.collect()  # unclosed aiohttp sessions/connectors would warn here (warnings are errors)


def _living_tasks() -> int:
    return trio.lowlevel.current_statistics().tasks_living


# Paginated lists, an expired continue token, what is kept ----------------------------------

PAGED = dataclasses.replace(FAST, list_page_size=2)


async def test_lists_are_paginated(nursery: trio.Nursery, tmp_path: Path) -> None:
    fake = FakeKubeApi(paginate_cached_lists=True)
    await nursery.start(fake.serve)
    access = KubeAccess(
        kubeconfig=write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    )
    uids = {fake.add_pod(f"p{i}") for i in range(5)}
    fake.add_pod("elsewhere", node="node-b")
    source = await start_watch(nursery, access, settings=PAGED)
    await wait_until(lambda: source.authoritative)
    assert pod_uids(source) == uids
    pages = [r for r in fake.requests if not r.watch]
    assert [r.params.get("limit") for r in pages] == ["2", "2", "2"]
    assert [r.resource_version for r in pages] == ["0", None, None]  # a continue names none
    assert [bool(r.params.get("continue")) for r in pages] == [False, True, True]


async def test_an_expired_continue_token_restarts_the_list_cleanly(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    fake = FakeKubeApi(paginate_cached_lists=True)
    await nursery.start(fake.serve)
    access = KubeAccess(
        kubeconfig=write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    )
    first, second, *_ = [fake.add_pod(f"p{i}") for i in range(5)]

    def in_the_middle(pages: int) -> None:
        if pages == 1:  # the first page (first, second) was read; then the cluster moves on
            fake.delete_pod(first)
            fake.modify_pod(second, labels={"v": "2"})
            fake.add_pod("late")
            fake.expire_continue_tokens()

    fake.on_page = in_the_middle
    source = await start_watch(nursery, access, settings=PAGED)
    await wait_until(lambda: source.authoritative)
    assert source.pods().keys() == fake.pods_on("node-a").keys()
    assert first not in source.pods()
    assert source.pods()[second].labels == {"v": "2"}
    assert len(source.pods()) == 5
    pages = [r for r in fake.requests if not r.watch]
    # page 1, the expired continuation, then the whole list again as a consistent read
    assert [bool(r.params.get("continue")) for r in pages] == [False, True, False, True, True]
    assert pages[2].resource_version is None
    assert source.relists == 0  # one list, started twice
    await wait_until(lambda: fake.open_watches == 1)
    assert watches(fake) == [str(fake.resource_version)]


async def test_what_is_not_kept_is_counted(nursery: trio.Nursery, tmp_path: Path) -> None:
    fake = FakeKubeApi()
    await nursery.start(fake.serve)
    access = KubeAccess(
        kubeconfig=write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{fake.port}")
    )
    big = fake.add_pod("big", annotations={MIG: "x" * (65 * 1024)}, labels={"v": "1"})
    registry = CollectorRegistry()
    source = await start_watch(nursery, access, registry=registry)
    await wait_until(lambda: source.authoritative)
    assert source.pods()[big].annotations == {}
    assert source.pods()[big].labels == {"v": "1"}

    def cuts(reason: str) -> float | None:
        return registry.get_sample_value("hami_trio_pod_watch_cuts_total", {"reason": reason})

    assert cuts("annotation-too-long") == 1
    assert cuts("pod-too-large") == cuts("total-too-large") == cuts("label-too-long") == 0
    fake.modify_pod(big, annotations={MIG: "[]"})  # a change that fits is kept whole again
    await wait_until(lambda: source.pods()[big].annotations == {MIG: "[]"})
    assert cuts("annotation-too-long") == 1
    held = registry.get_sample_value("hami_trio_pod_watch_held_bytes")
    assert held is not None
    assert 0 < held < 4096


async def test_a_watch_event_larger_than_a_read_buffer_arrives_whole(
    nursery: trio.Nursery, fake: FakeKubeApi, access: KubeAccess
) -> None:
    source = await start_watch(nursery, access)
    await wait_until(lambda: fake.open_watches == 1)
    value = "[" + "0" * 60_000 + "]"
    uid = fake.add_pod("wide", annotations={MIG: value, "junk": "j" * 500_000})
    await wait_until(lambda: uid in source.pods())
    assert source.pods()[uid].annotations == {MIG: value}
    assert source.relists == 0
