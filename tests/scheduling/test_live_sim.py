"""The live simulated backend on a real Redis, driven by an injected clock (no Django involved)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from scheduling.backends.base import BackendError, ObservedState
from scheduling.backends.live_sim import LiveSimBackend, LiveSimConfig
from scheduling.engine.types import Node, Plan, PreemptAction, StartAction
from tests.integration.loop import ENGINE_REDIS_URL

PREFIX = "berth:livesim:unit-test"
NODES = (
    Node(id="n0", gpu_type="A100", gpu_ids=(1, 2, 3, 4)),
    Node(id="n1", gpu_type="A100", gpu_ids=(5, 6, 7, 8)),
)


class Clock:
    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(ENGINE_REDIS_URL)
    for key in r.scan_iter(match=f"{PREFIX}*"):
        r.delete(key)
    yield r
    for key in r.scan_iter(match=f"{PREFIX}*"):
        r.delete(key)


def backend(client: redis.Redis, clock: Clock, **config: object) -> LiveSimBackend:
    return LiveSimBackend(NODES, redis=client, config=LiveSimConfig(key_prefix=PREFIX, **config), clock=clock)


def start(job_id: str, gpus: tuple[int, ...], *, lent: bool = False) -> StartAction:
    return StartAction(
        job_id=job_id, gpu_ids=gpus, node_ids=("n0",), is_preemptible=lent, expected_end_at=0.0
    )


def states(b: LiveSimBackend) -> dict[str, ObservedState]:
    return {j.job_id: j.state for j in b.snapshot().jobs}


def test_jobs_run_their_work_and_finish_on_the_wall_clock(client: redis.Redis) -> None:
    clock = Clock()
    sim = backend(client, clock, speedup=10.0)
    results = sim.apply(Plan(starts=(start("1", (1, 2)),)), payloads={"1": {"sim_runtime_s": 600}})
    assert [r.is_ok for r in results] == [True]

    clock.at += 59  # 590 s of work done at 10x
    assert states(sim) == {"1": ObservedState.RUNNING}
    clock.at += 2
    # A second instance (another worker process) sees the same state: it lives in Redis.
    other = backend(client, clock, speedup=10.0)
    (job,) = other.snapshot().jobs
    assert job.state == ObservedState.COMPLETED
    assert job.ended_at == pytest.approx(1_000_000.0 + 60)
    assert job.gpu_ids == (1, 2)


def test_starts_never_double_allocate_and_repeat_idempotently(client: redis.Redis) -> None:
    clock = Clock()
    sim = backend(client, clock)
    sim.apply(Plan(starts=(start("1", (1, 2)),)), payloads={"1": {"sim_runtime_s": 600}})

    again, clash, bad = sim.apply(
        Plan(starts=(start("1", (1, 2)), start("2", (2, 3)), start("3", (99,)))),
        payloads={"2": {"sim_runtime_s": 60}, "3": {"sim_runtime_s": 60}},
    )

    assert again.is_ok
    assert again.message == "already running"
    assert not clash.is_ok
    assert "busy" in clash.message
    assert not bad.is_ok
    assert sim.running_on() == {1: "1", 2: "1"}


def test_preemption_kills_at_kill_time_and_a_restart_runs_the_work_left(client: redis.Redis) -> None:
    clock = Clock()
    sim = backend(client, clock)
    payload = {"sim_runtime_s": 1000, "is_checkpointable": True, "checkpoint_interval_s": 300}
    sim.apply(Plan(starts=(start("7", (5, 6), lent=True),)), payloads={"7": payload})
    clock.at += 400
    t_signal = clock.at
    (result,) = sim.apply(
        Plan(preemptions=(PreemptAction("7", signal_at=t_signal, kill_at=t_signal + 30, reason="booking"),))
    )
    assert result.is_ok
    clock.at += 29
    assert states(sim) == {"7": ObservedState.RUNNING}
    clock.at += 1
    (job,) = sim.snapshot().jobs
    assert job.state == ObservedState.PREEMPTED
    assert job.ended_at == pytest.approx(t_signal + 30)
    # Checkpointed at the signal (400 s in): 30 s lost, 600 s of work left for the restart.
    assert "lost 30 s" in job.message
    sim.apply(Plan(starts=(start("7", (1, 2), lent=True),)), payloads={"7": payload})
    clock.at += 599
    assert states(sim) == {"7": ObservedState.RUNNING}
    clock.at += 1
    assert states(sim) == {"7": ObservedState.COMPLETED}


def test_non_preemptible_work_refuses_preemption(client: redis.Redis) -> None:
    clock = Clock()
    sim = backend(client, clock)
    sim.apply(Plan(starts=(start("1", (1,)),)), payloads={"1": {"sim_runtime_s": 100}})
    (result,) = sim.apply(
        Plan(preemptions=(PreemptAction("1", signal_at=clock.at, kill_at=clock.at, reason="x"),))
    )
    assert not result.is_ok


def test_runtime_is_drawn_from_the_estimate_deterministically(client: redis.Redis) -> None:
    clock = Clock()
    sim = backend(client, clock, runtime_fraction_lo=0.5, runtime_fraction_hi=0.5)
    sim.apply(Plan(starts=(start("3", (1,)),)), payloads={"3": {"requested_s": 1000}})
    clock.at += 499
    assert states(sim) == {"3": ObservedState.RUNNING}
    clock.at += 1
    assert states(sim) == {"3": ObservedState.COMPLETED}


def test_fault_switches(client: redis.Redis) -> None:
    clock = Clock()
    with pytest.raises(BackendError):
        backend(client, clock, is_unreachable=True).snapshot()
    with pytest.raises(BackendError):
        backend(client, clock, fail_apply=True).apply(Plan())
    (refused,) = backend(client, clock, refuse_starts=True).apply(Plan(starts=(start("1", (1,)),)))
    assert not refused.is_ok


def test_cancel_and_retention(client: redis.Redis) -> None:
    clock = Clock()
    sim = backend(client, clock, retention_s=60.0)
    sim.apply(Plan(starts=(start("1", (1,)),)), payloads={"1": {"sim_runtime_s": 1000}})
    assert sim.cancel("1").is_ok
    assert states(sim) == {"1": ObservedState.CANCELLED}
    assert sim.cancel("1").message == "not running"
    clock.at += 61
    assert states(sim) == {}  # forgotten after the retention, like slurmctld's MinJobAge


def test_config_from_cluster_settings() -> None:
    config = LiveSimConfig.from_mapping({"speedup": "4", "fail_rate": 0.1, "unknown": 1}, key_prefix="p")
    assert config.speedup == 4.0
    assert config.fail_rate == 0.1
    assert config.key_prefix == "p"
    with pytest.raises(ValueError, match="speedup"):
        LiveSimConfig.from_mapping({"speedup": 0}, key_prefix="p")


def test_a_loaded_record_is_a_copy_the_caller_may_change(client: redis.Redis) -> None:
    """`_load` hands out copies of the records it parsed before (its cache of parsed records
    must not see what a caller does to them, lists included)."""
    clock = Clock()
    sim = backend(client, clock)
    sim.apply(Plan(starts=(start("1", (1, 2)),)), payloads={"1": {"sim_runtime_s": 600}})
    first = sim.records()["1"]
    first["gpu_ids"].append(99)
    first["state"] = "completed"
    again = sim.records()["1"]
    assert again["gpu_ids"] == [1, 2]
    assert again["state"] == "running"
    assert again["gpu_ids"] is not sim.records()["1"]["gpu_ids"]
