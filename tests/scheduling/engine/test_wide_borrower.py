"""Berth: a wide job that would borrow waits while smaller jobs within their guarantees can use
the free GPUs (`fragmentation.defers_wide_borrower`)."""

from __future__ import annotations

from scheduling.engine import plan_round
from scheduling.engine.types import JobRequest, PendingReason, Plan, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 1_000_000.0
DAY = 86_400.0
BERTH = PolicyConfig(name="berth")


def _plan(
    pending: list[JobRequest], *, guaranteed: int = 0, quotas: bool = True, policy: PolicyConfig = BERTH
) -> Plan:
    """Two 8-GPU nodes, the second full of a month-long job of project ``a``; project ``b``
    (the wide job's) has ``guaranteed`` A100s, project ``c`` 4 (with ``quotas``)."""
    nodes = make_nodes(2, 8)
    month = running(
        job("month", 8, project="a", requested_s=30 * DAY), tuple(range(8, 16)), started_at=NOW - DAY
    )
    projects = (
        (
            ProjectShare(name="a", guaranteed=(("A100", 8),)),
            ProjectShare(name="b", guaranteed=(("A100", guaranteed),)),
            ProjectShare(name="c", guaranteed=(("A100", 4),)),
        )
        if quotas
        else ()
    )
    snap = snapshot(nodes, running_jobs=[month], pending=pending, projects=projects)
    return plan_round(snap, policy, NOW)


def _wide(submit_at: float = NOW - 3_600.0) -> JobRequest:
    return job("wide", 8, project="b", submit_at=submit_at, is_preemptible=True)


def _small(project: str = "c") -> JobRequest:
    return job("small", 1, project=project, submit_at=NOW - 60.0, user="v")


def _started(plan: Plan) -> set[str]:
    return {s.job_id for s in plan.starts}


def test_a_borrowing_wide_job_waits_while_a_guaranteed_smaller_job_can_use_the_free_node() -> None:
    plan = _plan([_wide(), _small()])
    # the wide job heads the queue (it has waited longest) and the free node would fit it, but
    # it would borrow GPUs project c is owed: the small job gets them, the wide job no reservation
    assert _started(plan) == {"small"}
    assert not any(r.holder_id == "wide" for r in plan.reservations)
    (verdict,) = [p for p in plan.pending if p.job_id == "wide"]
    assert verdict.reason == PendingReason.PRIORITY
    assert "borrowed" in verdict.sentence
    # easy has no such rule: the wide job starts
    assert "wide" in _started(_plan([_wide(), _small()], policy=PolicyConfig(name="easy")))


def test_a_wide_job_starts_as_before_within_its_guarantee_without_quotas_or_guaranteed_smaller_work() -> None:
    # its guarantee covers it: its claim stands
    assert "wide" in _started(_plan([_wide(), _small()], guaranteed=8))
    # no quotas at all: nothing to borrow from
    assert "wide" in _started(_plan([_wide(), _small()], quotas=False))
    # no smaller job waiting: the free node would idle
    assert _started(_plan([_wide()])) == {"wide"}
    # a smaller job that would borrow too (its own project's guarantee is used up) is no reason
    assert "wide" in _started(_plan([_wide(), _small(project="b")]))
    # nor is a job as wide as it is
    other = job("other-wide", 8, project="c", submit_at=NOW - 60.0)
    assert "wide" in _started(_plan([_wide(), other]))


def test_a_borrowing_wide_job_waits_at_most_the_starvation_bound() -> None:
    plan = _plan([_wide(submit_at=NOW - DAY), _small()])
    assert "wide" in _started(plan)
