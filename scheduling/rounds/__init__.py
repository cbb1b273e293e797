"""The engine round service: lock, snapshot, reconcile, plan, persist, apply after commit (DESIGN §1).

`engine_round_run(cluster_id=...)` runs one round for one cluster:

1. A per-cluster PostgreSQL **session** advisory lock (``pg_try_advisory_lock``) makes rounds
   of one cluster exclusive across any number of workers; a second caller gets ``"locked"`` at
   once.  The lock covers the backend apply after the commit too, so no other round can
   reconcile a start that is still being applied; a crashed worker's connection drops and
   PostgreSQL releases the lock.
2. ``backend.snapshot()``.  A `BackendError` marks the cluster degraded with the message and
   records the round's error; bookings and submissions do not depend on the engine and keep
   working.  The next good round clears the flag.
3. Reconcile (one transaction): jobs that finished or failed end their allocations (periods
   truncated to ``[start, ended)``); preempted jobs are requeued with ``attempt + 1``, their
   ``first_submitted_at`` kept and the lost GPU-seconds written on the `Preemption` row; jobs
   the database believes running that the backend does not know are *lost* and requeued;
   a start that never reached the backend is rolled back.  Work the backend runs that the
   database does not (a cancelled job, a start the database rolled back) is adopted if its GPUs
   are free, else cancelled after the commit; a job running on other GPUs than planned (Slurm
   picks indices) has its allocations moved.  Bookings become active at their start and
   completed at their end.  Allocations of running jobs are extended before they lapse.
4. The frozen `ClusterSnapshot` (``scheduling.snapshots``) goes through ``plan_round``; an
   exception there is recorded on the round (status ``engine_error``) and changes nothing.
5. The plan is persisted in ONE transaction: allocations for starts (job rows, then node
   rows, locked in id order; the exclusion constraint refuses any overlap, which rolls back
   only that start and leaves the job pending with a reason), `Preemption` rows, the pending
   explanations (and the engine's notes on bookings that may start late), the `EngineRound`
   row and an `AuditEvent` (actor ``engine``) for every change.
6. ``backend.apply`` runs in ``transaction.on_commit``.  A failed start (a failed result, or
   the whole apply raising `BackendError`) is rolled back: its allocations are released and
   the job is pending again with reason ``backend``.  Nothing is left half-started.

Every step is idempotent: running a round again, or after a crash at any point, converges.

The package: `common` (result, audit helpers, the lock), `reconcile`, `persist` (with
`explanations`: the pending jobs' reasons, sentences and ETAs), `apply` and
`run` (`engine_round_run`).  Every name the single module ``scheduling/rounds.py`` had is
re-exported here.  `plan_round` and `_call_apply` are looked up on this package when a round
calls them (`common.hook`), so replacing them here (tests do) is obeyed.
"""

from __future__ import annotations

import logging

from scheduling.engine import plan_round
from scheduling.rounds.apply import (
    _apply_after_commit,
    _apply_and_record,
    _call_apply,
    _closed_booking_releases,
    _open_preemptions,
    _resent_preemptions,
    _tell_refused_reservations,
)
from scheduling.rounds.common import (
    _BOOKING_NOTE_PREFIX,
    _ETA_SLACK,
    _EXTEND_BY,
    _EXTEND_MARGIN,
    _FINISH_EVENTS,
    _LOCK_NAMESPACE,
    _MIN_PERIOD,
    _NODE_STATUS,
    _STALE_TOLERANCE_S,
    ENGINE,
    RoundResult,
    _audit,
    _audit_allocations,
    _close_job_allocations,
    _is_exclusion_violation,
    _iso,
    _job_state,
    _next_blocking_start,
    _release_job_allocations,
    cluster_round_lock,
    cyclic_gc_paused,
    round_process_warm,
)
from scheduling.rounds.explanations import (
    _eta_close,
    _eta_close_s,
    _eta_text,
    _explanation_changed,
    _explanations_changed,
    _with_eta_text,
    _write_explanations,
)
from scheduling.rounds.persist import (
    _UNSTARTABLE_MEMO,
    _UNSTARTABLE_MEMO_MAX_SHAPES,
    _allocations_insert,
    _grace_text,
    _job_payload,
    _persist_plan,
    _Persisted,
    _unstartable_by_shape,
    _write_booking_notes,
)
from scheduling.rounds.reconcile import (
    _adopt,
    _blocking_starts,
    _Caps,
    _extend_running,
    _first_cap,
    _is_stale,
    _job_finish,
    _job_preempted,
    _job_requeue,
    _lost_gpu_s,
    _realign,
    _reconcile_bookings,
    _reconcile_jobs,
    _Reconciled,
    _running_upper,
    _set_degraded,
    _start_rollback,
    _sync_nodes,
)
from scheduling.rounds.run import (
    _elapsed_ms,
    _record_backend_error,
    engine_round_run,
)

logger = logging.getLogger(__name__)

__all__ = [
    "ENGINE",
    "_BOOKING_NOTE_PREFIX",
    "_ETA_SLACK",
    "_EXTEND_BY",
    "_EXTEND_MARGIN",
    "_FINISH_EVENTS",
    "_LOCK_NAMESPACE",
    "_MIN_PERIOD",
    "_NODE_STATUS",
    "_STALE_TOLERANCE_S",
    "_UNSTARTABLE_MEMO",
    "_UNSTARTABLE_MEMO_MAX_SHAPES",
    "RoundResult",
    "_Caps",
    "_Persisted",
    "_Reconciled",
    "_adopt",
    "_allocations_insert",
    "_apply_after_commit",
    "_apply_and_record",
    "_audit",
    "_audit_allocations",
    "_blocking_starts",
    "_call_apply",
    "_close_job_allocations",
    "_closed_booking_releases",
    "_elapsed_ms",
    "_eta_close",
    "_eta_close_s",
    "_eta_text",
    "_explanation_changed",
    "_explanations_changed",
    "_extend_running",
    "_first_cap",
    "_grace_text",
    "_is_exclusion_violation",
    "_is_stale",
    "_iso",
    "_job_finish",
    "_job_payload",
    "_job_preempted",
    "_job_requeue",
    "_job_state",
    "_lost_gpu_s",
    "_next_blocking_start",
    "_open_preemptions",
    "_persist_plan",
    "_realign",
    "_reconcile_bookings",
    "_reconcile_jobs",
    "_record_backend_error",
    "_release_job_allocations",
    "_resent_preemptions",
    "_running_upper",
    "_set_degraded",
    "_start_rollback",
    "_sync_nodes",
    "_tell_refused_reservations",
    "_unstartable_by_shape",
    "_with_eta_text",
    "_write_booking_notes",
    "_write_explanations",
    "cluster_round_lock",
    "cyclic_gc_paused",
    "engine_round_run",
    "plan_round",
    "round_process_warm",
]
