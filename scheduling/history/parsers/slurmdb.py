"""slurmdbd's job records as slurmrestd's accounting API answers them (``GET /slurmdb/v0.0.38/jobs``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from scheduling.history.parsers.records import HistoryRecord, Parsed, Skip, Status
from scheduling.history.parsers.sacct import _UNFINISHED, _sacct_status, _slurm_name, gpus_from_tres

_SLURM_NO_VAL = 0xFFFFFFFE  # NO_VAL / INFINITE in a uint32 field


def _tres_text(entries: Any) -> str:
    """``[{"type": "gres", "name": "gpu:a100", "count": 2}, ...]`` -> ``gres/gpu:a100=2,...``."""
    parts: list[str] = []
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("count"), int):
            continue
        kind, name = entry.get("type") or "", entry.get("name") or ""
        parts.append(f"{kind}/{name}={entry['count']}" if name else f"{kind}={entry['count']}")
    return ",".join(parts)


def _epoch_time(value: Any) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value >= _SLURM_NO_VAL:
        return None
    return datetime.fromtimestamp(value, UTC)


def _slurmdb_exit_code(raw: Any, status: Status) -> int | None:
    """The exit code from an accounting ``exit_code`` object, ``None`` when it is not known.

    Slurm 22.05's dbv0.0.38 dumper reports every normal exit as ``{"status": "SUCCESS",
    "return_code": 0}``, whatever the code (``WIFEXITED`` is tested before the code is read), so a
    0 is believed only for a completed job; a failed job's code must come from elsewhere (the
    controller, while it remembers the job).  ``ERROR`` carries the real code; a signal has none
    (sacct's ``0:9`` reads as 0, the signal is what matters, so it is unknown here).
    """
    if not isinstance(raw, dict):
        return None
    code = raw.get("return_code")
    if isinstance(code, bool) or not isinstance(code, int):
        return None
    kind = raw.get("status")
    if kind == "ERROR":
        return code
    if kind == "SUCCESS" and status == "completed":
        return code
    return None


def _slurmdb_job_id(job: dict[str, Any]) -> str:
    """sacct's JobID: ``123``, an array task ``120_3``, a het component ``130+1``."""
    array, het = job.get("array") or {}, job.get("het") or {}
    if isinstance(array, dict) and array.get("job_id") and isinstance(array.get("task_id"), int):
        return f"{array['job_id']}_{array['task_id']}"
    if isinstance(het, dict) and het.get("job_id") and isinstance(het.get("job_offset"), int):
        return f"{het['job_id']}+{het['job_offset']}"
    return str(job.get("job_id") or "")


def parse_slurmdb_jobs(
    jobs: Iterable[Any], *, known: dict[str, tuple[str, int | None]] | None = None
) -> Parsed:
    """Parse the ``jobs`` of a ``GET /slurmdb/v0.0.38/jobs`` answer (one record per job, steps nested).

    ``known`` (job id -> (user name, exit code)) is what slurmctld still remembers of recent jobs
    (``GET /slurm/v0.0.38/jobs``): it fills a user the accounting lacks (a uid without an
    association is ``null`` there) and a failed job's exit code (which 22.05's accounting API loses,
    see `_slurmdb_exit_code`).  Skips carry the record's position (1-based) as their line.
    """
    known = known or {}
    records: list[HistoryRecord] = []
    skips: list[Skip] = []
    for number, job in enumerate(jobs, start=1):
        if not isinstance(job, dict):
            skips.append(Skip(number, "", "not a job record"))
            continue
        result = _slurmdb_record(number, job, known=known)
        if isinstance(result, Skip):
            skips.append(result)
        else:
            records.append(result)
    return Parsed(tuple(records), tuple(skips))


def _slurmdb_record(
    number: int, job: dict[str, Any], *, known: dict[str, tuple[str, int | None]]
) -> HistoryRecord | Skip:
    """One accounting record as a history record, or why it is skipped."""
    job_id = _slurmdb_job_id(job)
    if not job_id:
        return Skip(number, "", "no job_id")
    state_obj = job.get("state")
    state = str(state_obj.get("current") or "") if isinstance(state_obj, dict) else str(state_obj or "")
    status = _sacct_status(state)
    if status is None:
        word = state.split()[0].upper() if state.strip() else "no state"
        return Skip(
            number, job_id, f"not finished ({word})" if word in _UNFINISHED else f"unknown state {state!r}"
        )
    gpus = _slurmdb_gpus(job.get("tres"))
    if gpus is None or gpus[0] <= 0:
        return Skip(number, job_id, "no GPUs (CPU-only job)")
    time_obj = job.get("time")
    times: dict[str, Any] = time_obj if isinstance(time_obj, dict) else {}
    submitted, started, ended = (_epoch_time(times.get(k)) for k in ("submission", "start", "end"))
    if started is None or ended is None:
        return Skip(number, job_id, "never started")
    if ended < started:
        return Skip(number, job_id, "ends before it starts")
    limit = times.get("limit")
    requested_s = (
        limit * 60
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < _SLURM_NO_VAL
        else None
    )
    live_user, live_exit = known.get(job_id, ("", None))
    exit_code = _slurmdb_exit_code(job.get("exit_code"), status)
    if exit_code is None:
        exit_code = live_exit
    return HistoryRecord(
        source="sacct",  # the same Slurm job ids as a sacct dump: one import key space
        external_id=job_id,
        user=_slurm_name(str(job.get("user") or "")) or live_user,
        account=_slurm_name(str(job.get("account") or "")),
        name=str(job.get("name") or "").strip() or f"slurm-{job_id}",
        gpu_count=gpus[0],
        gpu_type=gpus[1],
        submitted_at=submitted or started,
        started_at=started,
        ended_at=ended,
        requested_s=requested_s,
        status=status,
        exit_code=exit_code,
    )


def _slurmdb_gpus(tres_obj: Any) -> tuple[int, str] | None:
    """GPU count and type from the record's allocated TRES, else its requested TRES."""
    tres: dict[str, Any] = tres_obj if isinstance(tres_obj, dict) else {}
    for field in ("allocated", "requested"):
        found = gpus_from_tres(_tres_text(tres.get(field)))
        if found is not None:
            return found
    return None
