"""A session's failed reclaim is remembered for identical sessions of the round (same plan)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduling.engine import plan_round
from scheduling.engine.placement import Hold
from scheduling.engine.policies.berth import BERTH
from scheduling.engine.preemption import Reclaim as ReclaimPlan
from scheduling.engine.preemption import takeable_on
from scheduling.engine.round import Round
from scheduling.engine.stages import reclaim as reclaim_stage
from scheduling.engine.types import ClusterSnapshot, JobKind, JobRequest, Plan, PolicyConfig, RunningJob
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0
SESSIONS = 6


def _session(job_id: str, gpu_count: int = 2, *, submit_at: float = 1.0) -> JobRequest:
    return job(job_id, gpu_count, submit_at=submit_at, kind=JobKind.INTERACTIVE, requested_s=3_600)


def _ckpt(job_id: str, gpu_count: int) -> JobRequest:
    return job(
        job_id,
        gpu_count,
        requested_s=86_400,
        is_preemptible=True,
        is_checkpointable=True,
        checkpoint_interval_s=600,
    )


def _full_snapshot() -> ClusterSnapshot:
    """Two 4-GPU nodes full; one GPU of node 1 runs checkpointing preemptible work: a
    2-GPU session has a victim in reach but never two GPUs on one node."""
    nodes = make_nodes(2, 4)
    pinned0 = running(job("pinned0", 4, requested_s=86_400), (0, 1, 2, 3), started_at=NOW - 3_000)
    pinned1 = running(job("pinned1", 3, requested_s=86_400), (4, 5, 6), started_at=NOW - 3_000)
    lent = running(_ckpt("lent", 1), (7,), started_at=NOW - 3_000)
    pending = [_session(f"s{i}", submit_at=float(i)) for i in range(SESSIONS)]
    return snapshot(nodes, running_jobs=[pinned0, pinned1, lent], pending=pending)


def _count_searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    search: Callable[..., ReclaimPlan | None] = reclaim_stage.plan_reclaim

    def counted(*args: object, **kwargs: object) -> ReclaimPlan | None:
        calls[0] += 1
        return search(*args, **kwargs)

    monkeypatch.setattr(reclaim_stage, "plan_reclaim", counted)
    return calls


def _without_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reclaim_stage._FailMemo, "has_failed", lambda _self: False)


def _plan(snap: ClusterSnapshot) -> Plan:
    return plan_round(snap, PolicyConfig(name="berth"), NOW)


def test_identical_failing_sessions_search_once_with_the_same_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _full_snapshot()
    calls = _count_searches(monkeypatch)
    plan = _plan(snap)
    # the head session searched, then its reservation held GPUs (a hold forgets the answer):
    # the second searched again and the other four got the same "no"
    assert calls[0] == 2
    assert not plan.preemptions
    assert not plan.starts
    with monkeypatch.context() as patched:
        _without_memo(patched)
        calls[0] = 0
        reference = _plan(snap)
        assert calls[0] >= SESSIONS  # every session searched (the head one twice)
    assert plan == reference
    assert plan.pending == reference.pending


def _round(snap: ClusterSnapshot) -> Round:
    return Round(snap, PolicyConfig(name="berth"), NOW, BERTH)


def _ask(rnd: Round, session: JobRequest) -> bool:
    assert BERTH.reclaim is not None
    types = rnd.types_for(session)
    return BERTH.reclaim.for_demand(
        rnd,
        session,
        types,
        rnd.state.estimate(session),
        single=rnd.is_single_node(types, session.gpu_count),
    )


def test_a_preemption_forgets_the_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _full_snapshot()
    searches = [0]  # every search reads what is arriving first
    incoming = reclaim_stage._incoming

    def counted(rnd: Round) -> dict[int, float]:
        searches[0] += 1
        return incoming(rnd)

    monkeypatch.setattr(reclaim_stage, "_incoming", counted)
    rnd = _round(snap)
    assert not _ask(rnd, _session("a"))
    assert not _ask(rnd, _session("b"))
    assert searches[0] == 1
    lent = next(r for r in snap.running if r.job.id == "lent")
    rnd.preempt(lent, for_id="booking", why="a booking", is_high_class=True)
    # the signalled job's GPU is promised to the booking now: the identical session searches
    # again (and, with no victim left, fails); a fourth one trusts that new answer
    assert not _ask(rnd, _session("c"))
    assert searches[0] == 2
    assert not _ask(rnd, _session("d"))
    assert searches[0] == 2


def test_gpus_taken_after_a_free_only_answer_search_again() -> None:
    """A session whose GPUs were all free fails here (it should start, not reclaim); once the
    pool loses those GPUs the identical session needs a victim, and gets one."""
    nodes = make_nodes(2, 4)
    pinned0 = running(job("pinned0", 4, requested_s=86_400), (0, 1, 2, 3), started_at=NOW - 3_000)
    lent = running(_ckpt("lent", 2), (4, 5), started_at=NOW - 3_000)
    snap = snapshot(nodes, running_jobs=[pinned0, lent])
    rnd = _round(snap)
    assert not _ask(rnd, _session("a"))  # GPUs 6 and 7 are free: nothing to reclaim
    rnd.inter_pool.take((6, 7))  # placed on since
    assert _ask(rnd, _session("b"))
    assert [p.job_id for p in rnd.out.preemptions] == ["lent"]


def test_a_hold_forgets_the_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _full_snapshot()
    calls = _count_searches(monkeypatch)
    rnd = _round(snap)
    assert not _ask(rnd, _session("a"))
    holds = rnd.inter_pool.holds
    rnd.inter_pool.hold((), Hold(holder="x", normal_until=NOW, lent_until=NOW))
    assert rnd.inter_pool.holds == holds + 1
    assert not _ask(rnd, _session("b"))
    assert calls[0] == 2


def test_takeable_on_indexes_consenting_batch_work_by_first_gpu() -> None:
    nodes = make_nodes(1, 8)
    late = running(_ckpt("late", 2), (6, 7), started_at=NOW - 100)
    early = running(_ckpt("early", 2), (1, 5), started_at=NOW - 100)
    pinned = running(job("pinned", 2), (2, 3), started_at=NOW - 100)
    lent = running(job("lent", 1), (0,), started_at=NOW - 100, is_preemptible=True)
    graced = RunningJob(
        job=_ckpt("graced", 1), gpu_ids=(4,), started_at=NOW - 100, is_preemptible=False, grace_until=NOW
    )
    rnd = _round(snapshot(nodes, running_jobs=[late, early, pinned, lent, graced]))
    taken = takeable_on(rnd.state, 0)
    assert [r.job.id for r in taken] == ["lent", "early", "late"]
    assert takeable_on(rnd.state, 0) is taken  # indexed once per round
