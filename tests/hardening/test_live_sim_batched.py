"""The live simulator writes a snapshot's or an apply's records in one HSET (and one HDEL), not a
round trip per record, with the same state as before; a write that fails writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduling.backends.base import BackendError, ObservedState
from scheduling.engine.types import Plan, PreemptAction
from tests.scheduling.test_live_sim import Clock, backend, start
from tests.scheduling.test_live_sim import client as client  # the fixture


class Counting:
    """A Redis client that counts the writes it forwards."""

    def __init__(self, inner: redis.Redis) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.fail_writes = False

    def hset(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("hset")
        if self.fail_writes:
            raise redis.ConnectionError("down")
        return self.inner.hset(*args, **kwargs)

    def hdel(self, *args: Any) -> Any:
        self.calls.append("hdel")
        return self.inner.hdel(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_records_are_written_once_per_call_with_the_same_state(client: redis.Redis) -> None:
    clock, counting = Clock(), Counting(client)
    sim = backend(counting, clock, retention_s=100.0)  # type: ignore[arg-type]
    starts = tuple(start(str(i), (i,), lent=True) for i in range(1, 7))
    payloads = {str(i): {"sim_runtime_s": 100.0 * i} for i in range(1, 7)}
    assert all(r.is_ok for r in sim.apply(Plan(starts=starts), payloads=payloads))
    assert counting.calls == ["hset"]  # six starts, one write
    assert set(sim.records()) == {str(i) for i in range(1, 7)}

    counting.calls.clear()
    clock.at += 350  # jobs 1-3 end (100, 200, 300 s)
    jobs = {j.job_id: j.state for j in sim.snapshot().jobs}
    assert counting.calls == ["hset"]
    assert [jobs[str(i)] for i in range(1, 7)] == [ObservedState.COMPLETED] * 3 + [ObservedState.RUNNING] * 3
    assert {k: r["state"] for k, r in sim.records().items()} == {
        **{str(i): "completed" for i in range(1, 4)},
        **{str(i): "running" for i in range(4, 7)},
    }

    counting.calls.clear()
    clock.at += 150  # jobs 1-3 leave the retention window; 4 and 5 end
    preempt = PreemptAction(job_id="6", signal_at=clock.at, kill_at=clock.at + 30, reason="test")
    assert [r.is_ok for r in sim.apply(Plan(preemptions=(preempt,)))] == [True]
    assert sorted(counting.calls) == ["hdel", "hset"]
    records = sim.records()
    assert {k: r["state"] for k, r in records.items()} == {"4": "completed", "5": "completed", "6": "running"}
    assert records["6"]["kill_at"] == clock.at + 30
    # A start of a job whose old record is deleted in the same call keeps the new record.
    clock.at += 10_000
    again = sim.apply(Plan(starts=(start("4", (4,)),)), payloads={"4": {"sim_runtime_s": 50.0}})
    assert [r.is_ok for r in again] == [True]
    # (6 is killed in this call: it stays for the retention window like any ended run.)
    assert {k: r["state"] for k, r in sim.records().items()} == {"4": "running", "6": "preempted"}


def test_a_failed_write_writes_nothing_and_is_a_backend_error(client: redis.Redis) -> None:
    clock, counting = Clock(), Counting(client)
    sim = backend(counting, clock)  # type: ignore[arg-type]
    counting.fail_writes = True
    with pytest.raises(BackendError):
        sim.apply(Plan(starts=(start("1", (1,)), start("2", (2,)))), payloads={})
    counting.fail_writes = False
    assert sim.records() == {}


def test_records_parsed_once_are_handed_out_as_copies(client: redis.Redis) -> None:
    """`_load` keeps what it parsed per stored text: a caller changing a record (top level or
    its GPU list) does not change what the next load returns, and a record changed in Redis by
    someone else is read anew."""
    clock = Clock()
    sim = backend(client, clock)
    sim.apply(Plan(starts=(start("1", (1, 2)),)), payloads={"1": {"sim_runtime_s": 100.0}})
    first = sim.records()["1"]
    first["state"] = "mangled"
    first["gpu_ids"].append(99)
    again = sim.records()["1"]
    assert again["state"] == "running"
    assert again["gpu_ids"] == [1, 2]
    other = backend(client, clock)  # another process's backend object, same Redis state
    other.cancel("1")
    assert sim.records()["1"]["state"] == "cancelled"
