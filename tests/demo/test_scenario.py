"""The demo's scenario: who runs, when, where (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_trio.demo.scenario import (
    GPU_A,
    INFERENCE_BURSTS,
    MAX_WORKLOADS,
    MIG_WINDOW,
    Behaviour,
    DemoPaths,
    MemoryPlan,
    busy_at,
    check_timing,
    default_workloads,
    hami_core_env,
    memory_at,
    parse_memory_size,
)
from hami_trio.demo.workload import HamiCoreSettings
from hami_trio.errors import ConfigError


@pytest.mark.parametrize("count", range(2, MAX_WORKLOADS + 1))
def test_every_size_has_a_high_and_a_low_priority_workload_sharing_a_gpu(count: int) -> None:
    specs = default_workloads(count)
    assert len(specs) == count
    assert len({s.name for s in specs}) == count
    high = [s for s in specs if s.priority == 0]
    assert high
    assert any(s.gpu == h.gpu and s.priority > h.priority for h in high for s in specs)


@pytest.mark.parametrize("count", range(2, MAX_WORKLOADS + 1))
def test_every_outranked_workload_wants_to_launch_after_each_burst_it_meets(count: int) -> None:
    # Otherwise a block could end because the demand did, and "unblocked after" could not
    # be seen: after a burst the monitor needs two ticks (up to 0.133 of the shortest run).
    specs = default_workloads(count)
    for spec in specs:
        bursts = [
            burst
            for other in specs
            if other.gpu == spec.gpu and other.priority < spec.priority
            for burst in other.behaviour.busy
        ]
        for start, end in spec.behaviour.busy:
            for b_start, b_end in bursts:
                if min(end, b_end) > max(start, b_start):
                    assert end >= b_end + 0.15, (spec.name, (start, end), (b_start, b_end))


@pytest.mark.parametrize("count", [-1, 0, 1, MAX_WORKLOADS + 1])
def test_workload_count_out_of_range(count: int) -> None:
    with pytest.raises(ConfigError, match="--workloads"):
        default_workloads(count)


def test_bursts_stay_clear_of_the_mig_window() -> None:
    # The story: blocks happen while the monitor ticks, the pause shows a frozen view.
    assert all(end <= MIG_WINDOW[0] or start >= MIG_WINDOW[1] for start, end in INFERENCE_BURSTS)
    inference = default_workloads(2)[0]
    assert inference.gpu == GPU_A
    assert inference.behaviour.busy == INFERENCE_BURSTS


def test_busy_windows_are_half_open_and_end_with_the_run() -> None:
    windows = ((0.1, 0.3), (0.5, 1.0))
    assert [busy_at(windows, f) for f in (0.0, 0.1, 0.29, 0.3, 0.5, 0.99, 1.0, 1.5)] == [
        False,
        True,
        True,
        False,
        True,
        True,
        False,
        False,
    ]


def test_memory_grows_over_the_run_and_bursts_add_on_top() -> None:
    plan = MemoryPlan(context=10, module=20, data_start=100, data_end=200, burst=7)
    assert memory_at(plan, -1.0, busy=False) == (10, 20, 100)
    assert memory_at(plan, 0.5, busy=False) == (10, 20, 150)
    assert memory_at(plan, 0.5, busy=True) == (10, 20, 157)
    assert memory_at(plan, 3.0, busy=False) == (10, 20, 200)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1g", 1 << 30), ("1024m", 1 << 30), ("1048576K", 1 << 30), ("1073741824", 1 << 30), ("0", 0)],
)
def test_memory_sizes_as_hami_core_spells_them(text: str, value: int) -> None:
    assert parse_memory_size(text) == value


@pytest.mark.parametrize("text", ["", "1t", "-1g", "1.5g", "g", "1 g"])
def test_bad_memory_sizes_name_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match="CUDA_DEVICE_MEMORY_LIMIT"):
        parse_memory_size(text)


def test_timing_needs_three_ticks_per_phase() -> None:
    check_timing(6, 0.2)
    check_timing(30, 1)
    with pytest.raises(ConfigError, match="--duration 5 is too short for --interval 1"):
        check_timing(5, 1)
    with pytest.raises(ConfigError, match="--duration"):
        check_timing(0, 1)
    with pytest.raises(ConfigError, match="--interval"):
        check_timing(10, -1)


def test_hami_core_env_round_trips_through_the_workloads_parser() -> None:
    for spec in default_workloads(6):
        env = hami_core_env(spec, "/tmp/vgpu/x.cache")
        settings = HamiCoreSettings.from_env(env)
        assert settings.priority == spec.priority
        assert settings.memory_limit == spec.memory_limit
        assert settings.sm_limit == spec.sm_limit
        assert settings.gpu == spec.gpu
        assert settings.cache_file == Path("/tmp/vgpu/x.cache")
        assert settings.broker_enabled is spec.broker
    assert [s.broker for s in default_workloads(5)] == [True, True, True, False, True]


def test_behaviour_json_round_trip_and_errors() -> None:
    behaviour = default_workloads(3)[2].behaviour
    assert Behaviour.from_json(behaviour.to_json()) == behaviour
    with pytest.raises(ConfigError, match="behaviour"):
        Behaviour.from_json({"busy": [[0, 1]], "sm_util": 3})


def test_paths_follow_hamis_layout(tmp_path: Path) -> None:
    paths = DemoPaths(tmp_path)
    assert paths.containers == tmp_path / "hook" / "containers"
    assert paths.container_dir("uid-1", "ctr") == paths.containers / "uid-1_ctr"
    assert paths.socket_path.parent == paths.broker_dir
    assert paths.mig_lock.name == "hami-mig-apply.lock"
