"""Explanations are computed when ``Plan.pending`` is first read: the plan must not show it."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from scheduling.engine import plan_round
from scheduling.engine.explain import explain_pending, waiting_kinds
from scheduling.engine.policies.easy import EASY
from scheduling.engine.round import Round
from scheduling.engine.stages.compose import schedule
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 10_000.0


def _snapshot() -> ClusterSnapshot:
    nodes = make_nodes(4, 2)
    busy = running(job("r", 6, requested_s=1_000), (0, 1, 2, 3, 4, 5), started_at=NOW - 100)
    pending = [
        job("big", 6, submit_at=1),
        job("small", 1, submit_at=2, requested_s=10),
        job("mid", 3, submit_at=3),
    ]
    return snapshot(nodes, running_jobs=[busy], pending=pending)


@pytest.mark.parametrize("policy", ["fifo", "easy", "static", "berth"])
def test_a_plan_reads_like_an_eager_one(policy: str) -> None:
    snap = _snapshot()
    plan = plan_round(snap, PolicyConfig(name=policy), NOW)
    again = plan_round(snap, PolicyConfig(name=policy), NOW)
    assert plan == again
    explained = {e.job_id: e for e in plan.pending}
    started = {s.job_id for s in plan.starts}
    assert set(explained) | started == {"big", "small", "mid"}
    for explanation in explained.values():
        assert explanation.sentence
    assert plan.pending is plan.pending  # computed once
    copied = dataclasses.replace(plan, notes=("x",))
    assert copied.pending == plan.pending
    assert copied.notes == ("x",)
    assert pickle.loads(pickle.dumps(plan)) == plan  # noqa: S301 (our own bytes)
    assert dataclasses.asdict(plan)["pending"] == tuple(dataclasses.asdict(e) for e in plan.pending)
    assert isinstance(plan, Plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.pending = ()  # type: ignore[misc]


def test_reason_codes_match_the_explanations() -> None:
    snap = _snapshot()
    sched = Round(snap, PolicyConfig(name="easy"), NOW, EASY)
    queue = schedule(sched)
    by_id = {job.id: job for job in queue}
    explained = {
        (sched.state.eligible_types(by_id[e.job_id]), e.reason) for e in explain_pending(sched, queue)
    }
    assert waiting_kinds(sched, queue) == explained
    assert explained
