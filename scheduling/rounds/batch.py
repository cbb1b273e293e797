"""Set-based writes of the round: many rows changed by one statement over arrays (``UNNEST``).

A round that requeues 174 preempted jobs wrote each one as four to six statements (its
preemption row read and saved, its allocations read and bulk-updated, the job saved): about
1,000 round trips and ~2.5 s at 1,000 nodes.  Here every such change is collected first and
written once per kind, with the same values and the same audit events as one write per row.
Django's ``bulk_update`` is not used for this: it builds a ``CASE`` per row, which PostgreSQL
evaluates in time quadratic in the rows of one statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from notifications.events import job_event_emit
from scheduling import queries
from scheduling.inputs import resumed_prediction
from scheduling.models import Allocation, Job, Preemption
from scheduling.queries.rounds import (  # re-exported: their old home
    array_literal as array_literal,
)
from scheduling.queries.rounds import (
    nested_loops_off as nested_loops_off,
)
from scheduling.queries.rounds import (
    unnest_update as unnest_update,
)
from scheduling.rounds.common import _FINISH_EVENTS, ENGINE, RoundResult, _audit, _iso, _job_state
from scheduling.services import allocation_events_record, allocation_state


def allocations_close_many(ends: Sequence[tuple[Job, datetime]], *, verb: str) -> None:
    """End the blocking allocations of many jobs, each at its own instant: what
    `common._close_job_allocations` does for one job (truncate what had started, release the
    rest), in one read and one UPDATE, with the same audit events."""
    at_by_job = {job.pk: at for job, at in ends}
    if not at_by_job:
        return
    rows = (
        Allocation.objects.filter(job_id__in=sorted(at_by_job))
        .exclude(state__in=(Allocation.State.RELEASED, Allocation.State.ENDED))
        .order_by("id")
    )
    changes: dict[datetime, list[tuple[Allocation, dict[str, Any] | None]]] = defaultdict(list)
    values: list[tuple[int, bool, datetime | None, str]] = []
    for allocation in rows:
        at = at_by_job[allocation.job_id]  # type: ignore[index]  # filtered on these job ids
        before = allocation_state(allocation)
        lower, upper = allocation.period.lower, allocation.period.upper
        cut = False
        if lower is not None and lower < at:
            if upper is None or upper > at:
                allocation.period = DateTimeTZRange(lower, at, "[)")
                cut = True
            allocation.state = Allocation.State.ENDED
        else:
            allocation.state = Allocation.State.RELEASED
        changes[at].append((allocation, before))
        values.append((allocation.pk, cut, at, allocation.state))
    unnest_update(
        Allocation._meta.db_table,
        columns=(("cut", "boolean"), ("at", "timestamptz"), ("state", "varchar")),
        rows=values,
        assign="period = CASE WHEN v.cut THEN tstzrange(lower(t.period), v.at, '[)') ELSE t.period END,"
        " state = v.state",
    )
    for at, changed in changes.items():
        allocation_events_record(changes=changed, actor=None, actor_label=ENGINE, verb=verb, at=at)


@dataclass(frozen=True, slots=True)
class Requeue:
    """A job going back to the queue: its allocations end at ``ended_at``; ``verb`` is audited.
    ``saved_s``: the progress its checkpoint kept from the run that ended (0 when all is lost)."""

    job: Job
    ended_at: datetime
    sentence: str
    message: str
    verb: str
    saved_s: float = 0.0


def jobs_requeue(requeues: Sequence[Requeue], *, at: datetime, result: RoundResult) -> None:
    """Back to the queue with ``attempt + 1``, the original submission time kept: for many jobs
    at once (one allocation close, one UPDATE), each audited as `reconcile._job_requeue` does.

    The job keeps its stored runtime prediction less the progress its checkpoint saved
    (`inputs.resumed_prediction`): a resumed job has only the rest of its work to do.  The
    replay does the same (`sim.replay.Replay._enqueue`)."""
    if not requeues:
        return
    allocations_close_many([(r.job, r.ended_at) for r in requeues], verb="allocation.end")
    rows: list[tuple[int, datetime | None, int, str, str, float | None, float | None]] = []
    for r in requeues:
        job = r.job
        before = _job_state(job)
        if job.predicted_p50_s is not None and job.predicted_p90_s is not None:
            job.predicted_p50_s, job.predicted_p90_s = resumed_prediction(
                job.predicted_p50_s, job.predicted_p90_s, saved_s=r.saved_s
            )
        job.first_submitted_at = job.first_submitted_at or job.submitted_at
        job.status = Job.Status.PENDING
        job.attempt += 1
        job.submitted_at = at
        job.started_at = job.ended_at = None
        job.pending_reason = Job.PendingReason.NONE
        job.pending_sentence = r.sentence[:500]
        job.eta_p50_at = job.eta_p90_at = None
        job.status_message = r.message[:500]
        rows.append(
            (
                job.pk,
                job.first_submitted_at,
                job.attempt,
                job.pending_sentence,
                job.status_message,
                job.predicted_p50_s,
                job.predicted_p90_s,
            )
        )
        _audit(r.verb, "job", job.pk, before, _job_state(job), at)
        result.requeued += 1
    queries.jobs_requeue_write(rows, at=at)


@dataclass(frozen=True, slots=True)
class Kill:
    """A preempted job's kill as the backend reports it: ended at ``ended_at``, work lost ``lost``."""

    job: Job
    ended_at: datetime


def preemptions_kill(kills: Sequence[Kill], *, now: datetime, lost_gpu_s: Any) -> list[Preemption]:
    """Close each job's open preemption (the latest signalled; one is created when the backend
    preempted the job on its own) with its kill time and lost work: one read, one INSERT for the
    missing rows, one UPDATE.  ``lost_gpu_s(job, started_at=, ended_at=, signalled_at=)``.
    Returns the preemptions in the order of ``kills``."""
    if not kills:
        return []
    latest: dict[int, Preemption] = {}
    for preemption in Preemption.objects.filter(
        job_id__in=sorted({k.job.pk for k in kills}), killed_at__isnull=True
    ).order_by("job_id", "-signalled_at", "-id"):
        latest.setdefault(preemption.job_id, preemption)
    missing = [
        Preemption(
            job=k.job, signalled_at=k.ended_at, kill_at=k.ended_at, reason="Preempted by the cluster itself."
        )
        for k in kills
        if k.job.pk not in latest
    ]
    for preemption in Preemption.objects.bulk_create(missing):
        latest[preemption.job_id] = preemption
    out: list[Preemption] = []
    rows: list[tuple[int, datetime, float]] = []
    for k in kills:
        preemption = latest[k.job.pk]
        before = {"killed_at": None, "lost_gpu_s": preemption.lost_gpu_s}
        preemption.killed_at = k.ended_at
        preemption.lost_gpu_s = lost_gpu_s(
            k.job,
            started_at=k.job.started_at or k.ended_at,
            ended_at=k.ended_at,
            signalled_at=preemption.signalled_at,
        )
        rows.append((preemption.pk, k.ended_at, preemption.lost_gpu_s))
        after = {"killed_at": _iso(k.ended_at), "lost_gpu_s": preemption.lost_gpu_s}
        _audit("preemption.kill", "preemption", preemption.pk, before, after, now)
        out.append(preemption)
    unnest_update(
        Preemption._meta.db_table,
        columns=(("killed", "timestamptz"), ("lost", "float8")),
        rows=rows,
        assign="killed_at = v.killed, lost_gpu_s = v.lost",
    )
    return out


def jobs_set_running(jobs: Sequence[Job]) -> None:
    """Write ``status`` and ``backend_ref`` of jobs the backend confirms running, in one UPDATE."""
    unnest_update(
        Job._meta.db_table,
        columns=(("status", "varchar"), ("ref", "varchar")),
        rows=[(job.pk, job.status, job.backend_ref) for job in jobs],
        assign="status = v.status, backend_ref = v.ref",
    )


@dataclass(frozen=True, slots=True)
class Finish:
    """A job the backend reports ended: ``status`` completed, failed or cancelled, at ``at``."""

    job: Job
    status: str
    at: datetime
    message: str


def jobs_finish(finishes: Sequence[Finish], *, result: RoundResult) -> None:
    """End many jobs (status, end, message, exit code) and their allocations, each at its own
    instant, in one allocation close and one UPDATE, audited and told as `reconcile._job_finish`
    does.  The jobs' project and cluster should be loaded with them (the notices name both)."""
    if not finishes:
        return
    allocations_close_many([(f.job, f.at) for f in finishes], verb="allocation.end")
    rows: list[tuple[int, str, datetime, str, int | None]] = []
    for f in finishes:
        job = f.job
        before = _job_state(job)
        job.status = f.status
        job.ended_at = f.at
        job.status_message = f.message[:500]
        if f.status == Job.Status.COMPLETED:
            job.exit_code = 0
        elif f.status == Job.Status.FAILED and job.exit_code is None:
            job.exit_code = 1
        rows.append((job.pk, job.status, f.at, job.status_message, job.exit_code))
        _audit(f"job.{f.status}", "job", job.pk, before, _job_state(job), f.at)
        if f.status in _FINISH_EVENTS:
            job_event_emit(job, kind=_FINISH_EVENTS[f.status], at=f.at)
        result.finished += 1
    unnest_update(
        Job._meta.db_table,
        columns=(
            ("status", "varchar"),
            ("ended", "timestamptz"),
            ("message", "varchar"),
            ("code", "integer"),
        ),
        rows=rows,
        assign="status = v.status, ended_at = v.ended, status_message = v.message, exit_code = v.code",
    )
