"""One engine round: lock, snapshot, reconcile, plan, persist, apply (`engine_round_run`)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from notifications.services import events_deferred
from scheduling import metrics
from scheduling.backend_registry import backend_for_cluster
from scheduling.backends.base import (
    BackendError,
)
from scheduling.engine.explain import idle_by_node
from scheduling.engine.startability import enforces_guarantees
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig
from scheduling.models import (
    Cluster,
    EngineRound,
)
from scheduling.rounds.apply import (
    _apply_after_commit,
)
from scheduling.rounds.common import (
    RoundResult,
    cluster_round_lock,
    cyclic_gc_paused,
    hook,
)
from scheduling.rounds.persist import (
    _persist_plan,
    _unstartable_by_shape,
)
from scheduling.rounds.reconcile import (
    _extend_running,
    _reconcile_bookings,
    _reconcile_jobs,
    _set_degraded,
    _sync_nodes,
)
from scheduling.services import (
    audit_events_deferred,
)
from scheduling.snapshots import (
    cluster_snapshot_build,
    epoch,
    policy_config_for_cluster,
)

logger = logging.getLogger(__name__)

# ---- the round ----


def _record_backend_error(cluster: Cluster, *, now: datetime, exc: Exception, policy: str, t0: float) -> int:
    message = f"backend unreachable: {exc}"
    with transaction.atomic():
        _set_degraded(cluster, is_degraded=True, message=message, now=now)
        row = EngineRound.objects.create(
            cluster=cluster,
            policy=policy,
            started_at=now,
            duration_ms=(time.perf_counter() - t0) * 1000.0,
            error=message[:2000],
        )
    metrics.backend_error_count(cluster=cluster.name, operation="snapshot")
    return row.pk


def _elapsed_ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0


def engine_round_run(*, cluster_id: int, now: datetime | None = None) -> RoundResult:
    """Run one engine round for a cluster; returns what it did.  Never raises for backend trouble.

    ``now`` (aware) fixes the round's clock and, for the simulator, the backend's clock
    (tests); by default both are the wall clock.  Status ``"locked"`` means another round of
    this cluster is running; ``"backend_error"`` means the backend could not be read (the
    cluster is marked degraded); ``"apply_failed"`` means the plan was persisted but the
    backend refused it as a whole (the starts were rolled back).
    """
    result = RoundResult(cluster_id=cluster_id)
    # The collector is paused outside the lock: the lock is released while it is still paused,
    # so the collection the round leaves runs after the round and its lock (with the order the
    # other way round, the unlock's own allocations started it inside the round: 9-43 ms).
    with cyclic_gc_paused(), cluster_round_lock(cluster_id) as acquired:
        if not acquired:
            result.status = "locked"
            return result
        t0 = time.perf_counter()
        cluster = Cluster.objects.get(pk=cluster_id)
        if not cluster.is_active:
            result.status = "inactive"
            return result
        _round_locked(cluster, fixed_now=now, result=result, t0=t0)
    return result


def _round_locked(cluster: Cluster, *, fixed_now: datetime | None, result: RoundResult, t0: float) -> None:
    """The round, under the cluster's lock: every phase, timed into ``result.phases_ms``."""
    now = fixed_now or timezone.now()
    policy = policy_config_for_cluster(cluster=cluster, at=now)
    clock = (lambda: epoch(fixed_now)) if fixed_now is not None else None
    phases = result.phases_ms
    mark = time.perf_counter()
    try:
        backend = backend_for_cluster(cluster, clock=clock)
        observed = backend.snapshot()
    except BackendError as exc:
        result.round_id = _record_backend_error(cluster, now=now, exc=exc, policy=policy.name, t0=t0)
        result.status = "backend_error"
        result.message = str(exc)
        _round_done(cluster, result, t0=t0)
        return
    phases["backend_snapshot"], mark = _elapsed_ms(mark), time.perf_counter()

    with transaction.atomic(durable=True), audit_events_deferred(), events_deferred():
        if cluster.is_degraded:
            _set_degraded(cluster, is_degraded=False, message="", now=now)
        _sync_nodes(cluster, observed)
        reconciled = _reconcile_jobs(cluster, observed, now=now, result=result)
        _reconcile_bookings(cluster, now=now)
        _extend_running(cluster, now=now)
    phases["reconcile"], mark = _elapsed_ms(mark), time.perf_counter()

    snapshot = cluster_snapshot_build(cluster=cluster, now=now, policy=policy)
    phases["snapshot_build"], mark = _elapsed_ms(mark), time.perf_counter()
    try:
        plan = hook("plan_round")(snapshot, policy, epoch(now))
    except Exception as exc:  # an engine bug must show on the round, not only in a worker log
        _record_engine_error(cluster, exc, policy=policy, now=now, result=result, t0=t0)
        return
    phases["plan"], mark = _elapsed_ms(mark), time.perf_counter()

    with transaction.atomic(durable=True), audit_events_deferred(), events_deferred():
        round_row = _round_row_create(cluster, snapshot, plan, policy=policy, now=now, result=result)
        started_ids = {s.job_id for s in plan.starts}
        unstartable = _unstartable_by_shape(
            snapshot,
            [job for job in snapshot.pending if job.id not in started_ids],
            is_guarantee_enforced=enforces_guarantees(policy.name),
        )
        persisted = _persist_plan(
            cluster, plan, round_row=round_row, now=now, result=result, unstartable=unstartable
        )
        round_row.decisions = {
            **round_row.decisions,
            "reconcile": {"finished": result.finished, "requeued": result.requeued, "lost": result.lost},
            "persisted": {
                "starts": result.started,
                "conflicts": result.start_conflicts,
                "preemptions": result.preempted,
            },
        }
        round_row.save(update_fields=["decisions"])
        transaction.on_commit(
            lambda: _apply_after_commit(
                cluster=cluster,
                backend=backend,
                persisted=persisted,
                plan=plan,
                to_cancel=reconciled.to_cancel,
                round_id=round_row.pk,
                result=result,
            )
        )
    # The apply ran on commit, inside the block just left: it has a phase of its own.
    phases["persist"] = max(0.0, _elapsed_ms(mark) - phases.get("apply", 0.0))
    result.duration_ms = (time.perf_counter() - t0) * 1000.0
    EngineRound.objects.filter(pk=round_row.pk).update(duration_ms=result.duration_ms)
    _round_done(cluster, result, t0=t0, duration_known=True)


def _record_engine_error(
    cluster: Cluster, exc: Exception, *, policy: PolicyConfig, now: datetime, result: RoundResult, t0: float
) -> None:
    logger.exception("plan_round failed for cluster %s", cluster.name)
    result.duration_ms = (time.perf_counter() - t0) * 1000.0
    row = EngineRound.objects.create(
        cluster=cluster,
        policy=policy.name,
        started_at=now,
        duration_ms=result.duration_ms,
        error=f"engine error: {type(exc).__name__}: {exc}"[:2000],
    )
    result.round_id, result.status, result.message = row.pk, "engine_error", str(exc)
    _round_done(cluster, result, t0=t0)


def _round_row_create(
    cluster: Cluster,
    snapshot: ClusterSnapshot,
    plan: Plan,
    *,
    policy: PolicyConfig,
    now: datetime,
    result: RoundResult,
) -> EngineRound:
    """The round's `EngineRound` row with what the plan decided."""
    idle = Counter(reason.value for _, reason in plan.idle)
    round_row = EngineRound.objects.create(
        cluster=cluster,
        policy=policy.name,
        started_at=now,
        decisions={
            "starts": len(plan.starts),
            "preemptions": len(plan.preemptions),
            "reservations": len(plan.reservations),
            "releases": len(plan.releases),
            "pending": len(plan.pending),
            "running": len(snapshot.running),
            "idle": dict(idle),
            "idle_nodes": idle_by_node(snapshot.nodes, plan.idle),
            "notes": list(plan.notes)[:20],
            "plan_ms": round(result.phases_ms["plan"], 3),
            "next_round_at": plan.next_round_at,
        },
    )
    result.round_id = round_row.pk
    result.next_round_at = plan.next_round_at
    return round_row


def _round_done(cluster: Cluster, result: RoundResult, *, t0: float, duration_known: bool = False) -> None:
    if not duration_known:
        result.duration_ms = (time.perf_counter() - t0) * 1000.0
    metrics.round_observe(cluster=cluster.name, duration_s=result.duration_ms / 1000.0, outcome=result.status)
