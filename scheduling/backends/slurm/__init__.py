"""Slurm backend: Berth drives a real Slurm through slurmrestd (OpenAPI v0.0.38, Slurm 22.05) with JWT.

Modules: ``config`` (`SlurmConfig`, `SlurmJobPayload`, errors), ``parse`` and ``states`` (pure parsers of
slurmrestd answers), ``output`` (job output files), ``client`` (transport and reads), ``backend``
(`SlurmBackend`: snapshot, apply, cancel).  Import the names below from ``scheduling.backends.slurm``.

Configuration (`SlurmConfig`, or `SlurmConfig.from_env`)
    ``url`` of slurmrestd (``BERTH_SLURMRESTD_URL``, default ``http://127.0.0.1:46820``, the port
    ``scripts/slurm.sh`` uses) and ``user`` (``BERTH_SLURM_USER``, default ``berth``): every request is
    made, and every job runs, as this Slurm user.  Token: a fixed ``token`` (``BERTH_SLURM_JWT``, e.g. from a
    secret; the operator renews it), else the backend mints one with ``scontrol token username=<user>
    lifespan=<token_lifespan_s>`` and mints a new one ``token_refresh_margin_s`` before it expires, or
    after a 401.  Minting tokens for another user, requeueing and reservations need Slurm operator rights
    on the worker's host (``scontrol`` with a munge key; ``scontrol`` is the argv prefix, so it can be
    wrapped).  ``partition`` receives every job.  ``dry_run=True`` (``BERTH_SLURM_DRY_RUN=1``) reads for
    real and writes nothing: each action comes back ``is_ok`` with a ``dry-run:`` message.

GPU ids
    Slurm numbers GPUs per node by GRES index (0..n-1); Berth needs ids unique in the cluster.  With
    ``gpu_ids`` (node name -> Berth ids, indexed by GRES index; the portal passes its database's) the
    mapping is explicit, and production clusters should set it.  Nodes it does not list are sorted by
    name in natural order (n2 < n10) and their GPUs numbered consecutively above every configured id:
    stable while the inventory is, shifted when a node is added or removed.  A node's ``gres`` string
    gives its type and count (``gpu:a100:4`` -> type ``a100``, 4 GPUs; an untyped ``gpu:4`` is type
    ``gpu``; a node with several GPU types reports the first, with all its GPUs); ``gpu_types`` renames
    Slurm's types to Berth's names (``{"a100": "A100"}``).  Node state: idle/mixed/allocated/completing
    -> up; a DRAIN flag or drained/draining state -> draining; down, NOT_RESPONDING, fail, future,
    unknown -> down.

Jobs
    A `StartAction` submits a batch job named ``<job_name_prefix><job id>`` (the tag the snapshot uses to
    find Berth's jobs; others are ignored), pinned with ``nodelist`` to the planned nodes, asking
    ``gres=gpu:<type>:<n>`` per node.  Slurm chooses *which* GPUs of the node the job gets (gres/gpu has
    no per-index request), so the snapshot reports the indices Slurm really allocated (``gres_detail``,
    ``gpu:a100:2(IDX:0-1)``), mapped to Berth ids.  Only the count per node is guaranteed to match the
    plan; the ids often differ (Slurm takes the lowest free indices), so the caller should record the
    reported ones.  What the job runs comes from a `SlurmJobPayload` (or a
    plain mapping with the same keys) per job id: ``payloads`` given to `apply`, else ``payload_source``.
    If a planned node lies in a Berth reservation (see below) the job is submitted into it: FLEX lets it
    start now and run past the window, so Berth can lend booked GPUs, while other Slurm users stay off.
    That needs a finite time limit: ``time_limit_s`` of the payload, else ``default_time_limit_s``.

    Slurm states map to `ObservedState`: PENDING/CONFIGURING -> pending (or preempted when Berth holds
    it after a requeue), RUNNING/COMPLETING/SUSPENDED -> running, COMPLETED -> completed,
    FAILED/TIMEOUT/OUT_OF_MEMORY/BOOT_FAIL/DEADLINE -> failed, CANCELLED -> cancelled,
    PREEMPTED/REQUEUED/REQUEUE_HOLD -> preempted, NODE_FAIL -> lost, a state this table does not know ->
    lost with the state in the message.  A COMPLETING job reports no GPU ids (Slurm stops listing them
    while the GPUs are being freed).  When several Slurm jobs carry one
    Berth id (a resubmission after a terminal state) the live one, else the newest, is reported.
    slurmctld forgets finished jobs after ``MinJobAge`` (``scripts/slurm.sh`` sets an hour): the caller's
    reconcile must run more often than that.

Preemption
    `PreemptAction`, applied every round until done: before ``signal_at`` nothing; from ``signal_at`` the
    job gets ``preempt_signal`` once (the fact is kept in the job's Slurm comment, so any worker knows);
    from ``kill_at`` ``scontrol requeuehold``: Slurm kills it (SIGTERM, SIGKILL after KillWait), keeps the
    job, its id and its restart count, and holds it.  We hold rather than requeue because a plain requeue
    lets Slurm restart the job by itself on the same node, the GPUs just reclaimed; with the hold the job
    waits for Berth, whose next `StartAction` for it updates nodelist, gres and BeginTime (a requeue sets it
    about 2 min ahead) and releases it.  Cancel + resubmit would lose Slurm's job id and accounting trail,
    so it is used only where Slurm 22.05 leaves no choice: a move to another GPU *type* (a pending job whose
    GRES type is updated stays "never runnable") cancels the held job and submits the payload again under
    the same Berth id.  While the requeue is still killing the job (COMPLETING, ~KillWait) a start for it
    fails for that round and succeeds on a later one.
    `SlurmBackend.cancel` cancels (``DELETE /job/{id}``).

Reservations (bookings)
    v0.0.38 has no reservation writes, so `ReserveAction` runs ``scontrol create|update reservation``:
    named ``<reservation_prefix><holder id>``, on the nodes holding the planned GPUs, for ``user``,
    with flags FLEX (Berth's jobs in it may start early and run past it), IGNORE_JOBS (lent jobs still
    run there; Berth preempts them before the start) and OVERLAP (two bookings may share a node).
    Slurm 22.05 reservations cannot hold GPUs without slurmdbd, so a reservation covers whole nodes.
    `ReleaseAction` deletes it.  Reservations that exist with the same nodes and end are success.

Accounting (history)
    `SlurmBackend.accounting_jobs` reads slurmdbd's job records through slurmrestd's accounting API
    (``GET /slurmdb/v0.0.38/jobs``; slurmrestd must load the ``openapi/dbv0.0.38`` plugin and Slurm must
    use ``accounting_storage/slurmdbd``), with the same JWT; "Nothing found" (9003) is an empty list.
    `SlurmBackend.controller_jobs` is what slurmctld still remembers (``MinJobAge``): the history import
    takes exit codes and user names from it, which 22.05's accounting API loses (see
    ``scheduling.history.parsers.parse_slurmdb_jobs``).  A slurmrestd without the accounting plugin
    answers 404: `SlurmEndpointMissingError`.

Errors
    Everything raises `BackendError`.  Connection failures, timeouts, an unreachable controller (slurmrestd
    answers 500 after ~9 s of retries) and malformed answers raise it from `snapshot` and `apply` (the
    caller marks the cluster degraded and retries).  Slurm refusing one action (error codes >= 2000 in the
    ``errors`` array, or an ``scontrol`` refusal) is `SlurmRejectedError`, a `BackendError` that `apply`
    turns into a failed `ActionResult` so one bad payload does not block the plan.
"""

from __future__ import annotations

from scheduling.backends.slurm.backend import SlurmBackend
from scheduling.backends.slurm.client import API, DB_API, run_command
from scheduling.backends.slurm.config import (
    SIGNAL_MARK,
    PayloadSource,
    Runner,
    SlurmConfig,
    SlurmEndpointMissingError,
    SlurmJobPayload,
    SlurmRejectedError,
)
from scheduling.backends.slurm.output import exit_code_of, expand_output_path, read_tail
from scheduling.backends.slurm.parse import (
    NodeInventory,
    check_errors,
    expand_hostlist,
    gpu_id_table,
    load_json,
    node_status,
    parse_gres,
    parse_index_list,
    parse_nodes,
    reservation_name,
    slurm_time,
    tres_gpu_types,
)
from scheduling.backends.slurm.states import (
    berth_jobs,
    job_gpu_ids,
    job_state,
    observe_job,
    parse_jobs,
    signalled_at,
)

__all__ = [
    "API",
    "DB_API",
    "SIGNAL_MARK",
    "NodeInventory",
    "PayloadSource",
    "Runner",
    "SlurmBackend",
    "SlurmConfig",
    "SlurmEndpointMissingError",
    "SlurmJobPayload",
    "SlurmRejectedError",
    "berth_jobs",
    "check_errors",
    "exit_code_of",
    "expand_hostlist",
    "expand_output_path",
    "gpu_id_table",
    "job_gpu_ids",
    "job_state",
    "load_json",
    "node_status",
    "observe_job",
    "parse_gres",
    "parse_index_list",
    "parse_jobs",
    "parse_nodes",
    "read_tail",
    "reservation_name",
    "run_command",
    "signalled_at",
    "slurm_time",
    "tres_gpu_types",
]
