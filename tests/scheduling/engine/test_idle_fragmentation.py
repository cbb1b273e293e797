"""Idle reasons when a job preempts while idle GPUs are split across nodes."""

from __future__ import annotations

from scheduling.engine import plan_round
from scheduling.engine.types import IdleReason, JobKind, PendingReason, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 10_000.0


def test_idle_gpus_split_across_nodes_while_a_job_preempts_are_fragmentation() -> None:
    """A 4-GPU session reclaims 2 lent GPUs on one node while 3 + 3 GPUs sit idle on two others:
    those 6 idle GPUs are idle because they are not together (fragmentation), not for lack of
    demand (a job of their type is waiting and would fit them in total)."""
    nodes = make_nodes(3, 4)
    lent = running(job("lent", 2, requested_s=7_200), (0, 1), started_at=NOW - 600, is_preemptible=True)
    pinned_b = running(job("pb", 1, requested_s=7_200), (4,), started_at=NOW - 600)
    pinned_c = running(job("pc", 1, requested_s=7_200), (8,), started_at=NOW - 600)
    session = job("s", 4, submit_at=NOW - 5, kind=JobKind.INTERACTIVE, requested_s=3_600)
    snap = snapshot(nodes, running_jobs=[lent, pinned_b, pinned_c], pending=[session])
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    assert plan.preemptions, "the scenario needs the session to reclaim the lent GPUs"
    (verdict,) = [e for e in plan.pending if e.job_id == "s"]
    assert verdict.reason == PendingReason.PREEMPTING, verdict
    idle = dict(plan.idle)
    for gpu in (5, 6, 7, 9, 10, 11):
        assert idle[gpu] == IdleReason.FRAGMENTATION, (gpu, idle)
