"""Pure mapping of Slurm's job records to observed jobs: states, GPU ids, the preemption signal mark."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from scheduling.backends.base import BackendError, ObservedJob, ObservedState
from scheduling.backends.slurm.config import SIGNAL_MARK
from scheduling.backends.slurm.parse import expand_hostlist, load_json, parse_gres

_HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})

_TERMINAL = {
    "COMPLETED": ObservedState.COMPLETED,
    "FAILED": ObservedState.FAILED,
    "TIMEOUT": ObservedState.FAILED,
    "OUT_OF_MEMORY": ObservedState.FAILED,
    "BOOT_FAIL": ObservedState.FAILED,
    "DEADLINE": ObservedState.FAILED,
    "SPECIAL_EXIT": ObservedState.FAILED,
    "CANCELLED": ObservedState.CANCELLED,
    "REVOKED": ObservedState.CANCELLED,
    "PREEMPTED": ObservedState.PREEMPTED,
    "NODE_FAIL": ObservedState.LOST,
}
_LIVE = {
    "PENDING": ObservedState.PENDING,
    "CONFIGURING": ObservedState.PENDING,
    "REQUEUED": ObservedState.PREEMPTED,
    "REQUEUE_HOLD": ObservedState.PREEMPTED,
    "REQUEUE_FED": ObservedState.PREEMPTED,
    "RUNNING": ObservedState.RUNNING,
    "COMPLETING": ObservedState.RUNNING,
    "SUSPENDED": ObservedState.RUNNING,  # still holds its GPUs
    "RESIZING": ObservedState.RUNNING,
    "SIGNALING": ObservedState.RUNNING,
    "STAGE_OUT": ObservedState.RUNNING,
}


def job_state(raw: Mapping[str, Any]) -> ObservedState:
    """Map one v0.0.38 job object to `ObservedState` (see the package docstring for the table).

    A held job is Berth's own preemption (requeuehold) or a hold Berth put before it started:
    preempted, so the engine may place it again.
    """
    state = str(raw.get("job_state", "")).upper()
    if str(raw.get("state_reason", "")) in _HELD_REASONS and state in {"PENDING", "COMPLETING"}:
        return ObservedState.PREEMPTED
    if state in _TERMINAL:
        return _TERMINAL[state]
    if state in _LIVE:
        return _LIVE[state]
    # A state this table does not know (a newer Slurm): report it lost with the reason, rather than
    # failing the whole snapshot; the caller's reconcile shows the message.
    return ObservedState.LOST


def _is_live(raw: Mapping[str, Any]) -> bool:
    return str(raw.get("job_state", "")).upper() in _LIVE


def job_gpu_ids(raw: Mapping[str, Any], gpu_ids: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Berth ids of the GPUs Slurm allocated, from ``gres_detail`` (one entry per allocated node)."""
    nodes = expand_hostlist(str(raw.get("nodes") or ""))
    out: list[int] = []
    for node, detail in zip(nodes, raw.get("gres_detail") or (), strict=False):
        ids = gpu_ids.get(node, ())
        for name, _kind, _count, idx in parse_gres(str(detail)):
            if name == "gpu":
                out.extend(ids[i] for i in idx if i < len(ids))
    return tuple(sorted(out))


def _epoch_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and 0 < value < 4_000_000_000 else None


def observe_job(
    raw: Mapping[str, Any], *, job_id: str, gpu_ids: Mapping[str, tuple[int, ...]]
) -> ObservedJob:
    """One Slurm job object as an `ObservedJob` of the Berth job ``job_id``."""
    state = job_state(raw)
    started = _epoch_or_none(raw.get("start_time"))
    ended = _epoch_or_none(raw.get("end_time"))
    slurm_state = str(raw.get("job_state", ""))
    reason = str(raw.get("state_reason", "None"))
    message = slurm_state if reason in {"None", ""} else f"{slurm_state} ({reason})"
    if state is ObservedState.LOST and slurm_state.upper() not in _TERMINAL:
        message = f"unmapped Slurm state {slurm_state}"
    restarts = raw.get("restart_cnt") or 0
    if restarts:
        message += f", restarts={restarts}"
    is_live_run = state is ObservedState.RUNNING or (
        state is ObservedState.PREEMPTED and slurm_state.upper() == "COMPLETING"
    )
    return ObservedJob(
        job_id=job_id,
        state=state,
        gpu_ids=job_gpu_ids(raw, gpu_ids) if is_live_run else (),
        # Pending jobs carry the *expected* start in start_time; only report starts that happened.
        started_at=started if state not in {ObservedState.PENDING} and raw.get("nodes") else None,
        ended_at=ended if str(raw.get("job_state", "")).upper() in _TERMINAL else None,
        backend_ref=str(raw.get("job_id", "")),
        message=message,
    )


def berth_jobs(raw_jobs: Iterable[Mapping[str, Any]], *, prefix: str) -> dict[str, Mapping[str, Any]]:
    """Berth id -> the Slurm job that represents it (live first, then the newest)."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for raw in raw_jobs:
        name = str(raw.get("name") or "")
        if not name.startswith(prefix) or len(name) == len(prefix):
            continue
        job_id = name[len(prefix) :]
        old = chosen.get(job_id)
        key = (_is_live(raw), int(raw.get("job_id") or 0))
        if old is None or key > (_is_live(old), int(old.get("job_id") or 0)):
            chosen[job_id] = raw
    return chosen


def parse_jobs(text: str, *, prefix: str, gpu_ids: Mapping[str, tuple[int, ...]]) -> tuple[ObservedJob, ...]:
    """Berth's jobs from a ``GET /jobs`` answer, sorted by Berth id."""
    data = load_json(text, doing="list jobs")
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list):
        raise BackendError("list jobs: answer has no 'jobs' list")
    chosen = berth_jobs(raw_jobs, prefix=prefix)
    return tuple(observe_job(chosen[j], job_id=j, gpu_ids=gpu_ids) for j in sorted(chosen))


def signalled_at(raw: Mapping[str, Any]) -> float | None:
    """When Berth sent the grace signal to the job's current run, from its comment (None: not yet).

    A mark older than the run's start belongs to an earlier run (Slurm requeued the job by itself).
    """
    comment = str(raw.get("comment") or "")
    if not comment.startswith(SIGNAL_MARK):
        return None
    try:
        at = float(comment[len(SIGNAL_MARK) :])
    except ValueError:
        return None
    started = _epoch_or_none(raw.get("start_time"))
    return None if started is not None and at < started else at
