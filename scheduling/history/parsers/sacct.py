"""``sacct --parsable2`` dumps, and the Slurm helpers the other Slurm formats share (TRES, times, states)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo

from scheduling.history.parsers.records import HistoryRecord, Parsed, Skip, Status

_GPU_TRES = re.compile(r"gres/gpu(?::(?P<type>[^=,]+))?=(?P<n>\d+)")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:,(]+))?:(?P<n>\d+)")
_FAILED_STATES = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
_UNFINISHED = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"}


def gpus_from_tres(text: str) -> tuple[int, str] | None:
    """(GPU count, type or "") from a TRES or GRES string; ``None`` when it names no GPUs.

    With both a typed and an untyped entry (``gres/gpu=2,gres/gpu:a100=2``) the typed wins.
    """
    found = [(int(m["n"]), m["type"] or "") for m in _GPU_TRES.finditer(text)]
    if not found:
        found = [(int(m["n"]), m["type"] or "") for m in _GPU_GRES.finditer(text)]
    if not found:
        return None
    typed = [f for f in found if f[1]]
    if typed:
        return sum(n for n, _ in typed), typed[0][1] if len({t for _, t in typed}) == 1 else ""
    return found[0]


def slurm_duration_s(text: str) -> int | None:
    """Seconds of a Slurm duration (``[D-]HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``MM``); ``None``
    for ``UNLIMITED``, ``Partition_Limit`` or empty."""
    raw = text.strip()
    if not raw or not raw[0].isdigit():
        return None
    days = 0
    if "-" in raw:
        day_text, raw = raw.split("-", 1)
        days = int(day_text)
    parts = [int(p) for p in raw.split(":")]
    if len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, (m, s) = 0, parts
    else:
        h, m, s = 0, parts[0], 0
    return days * 86400 + h * 3600 + m * 60 + s


def _slurm_time(text: str, zone: tzinfo) -> datetime | None:
    raw = text.strip()
    if not raw or raw in ("Unknown", "None", "N/A"):
        return None
    value = datetime.fromisoformat(raw)
    return (value if value.tzinfo else value.replace(tzinfo=zone)).astimezone(UTC)


def _slurm_name(text: str) -> str:
    """``berth(995)`` -> ``berth``; ``(null)`` -> ``""``."""
    name = text.strip()
    if name in ("(null)", "N/A"):
        return ""
    return name.split("(", 1)[0] if name.endswith(")") else name


def _sacct_status(state: str) -> Status | None:
    word = state.split()[0].upper() if state.strip() else ""
    if word == "COMPLETED":
        return "completed"
    if word in _FAILED_STATES:
        return "failed"
    if word == "CANCELLED":
        return "cancelled"
    return None


def parse_sacct(text: str, *, zone: tzinfo = UTC) -> Parsed:
    """Parse ``sacct --parsable2`` output (header line required; ``zone``: the Slurm host's)."""
    lines = list(text.splitlines())
    header_at = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_at is None:
        return Parsed((), ())
    header = lines[header_at].rstrip("|").split("|")
    if "JobID" not in header:
        raise ValueError("not sacct --parsable2 output: the first line must be the header with JobID")
    records: list[HistoryRecord] = []
    skips: list[Skip] = []
    for number, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        if not line.strip():
            continue
        cells = line.rstrip("\n").split("|")
        row = dict(zip(header, cells, strict=False))
        job_id = row.get("JobID", "").strip()

        def skip(reason: str, job_id: str = job_id, number: int = number) -> None:
            skips.append(Skip(number, job_id, reason))

        if not job_id:
            skip("no JobID")
            continue
        if "." in job_id:
            skip("job step (the allocation's own row counts)")
            continue
        state = row.get("State", "")
        status = _sacct_status(state)
        if status is None:
            word = state.split()[0].upper() if state.strip() else "no state"
            skip(f"not finished ({word})" if word in _UNFINISHED else f"unknown state {state!r}")
            continue
        gpus = None
        for field in ("AllocTRES", "ReqTRES", "AllocGRES", "ReqGRES"):
            if row.get(field):
                gpus = gpus_from_tres(row[field])
                if gpus is not None:
                    break
        if gpus is None or gpus[0] <= 0:
            skip("no GPUs (CPU-only job)")
            continue
        try:
            submitted = _slurm_time(row.get("Submit", ""), zone)
            started = _slurm_time(row.get("Start", ""), zone)
            ended = _slurm_time(row.get("End", ""), zone)
        except ValueError as exc:
            skip(f"unreadable time: {exc}")
            continue
        if started is None or ended is None:
            skip("never started")
            continue
        if ended < started:
            skip("ends before it starts")
            continue
        records.append(
            _slurm_row_record(
                row,
                job_id=job_id,
                fields=("User", "Timelimit"),
                gpus=gpus,
                status=status,
                times=(submitted, started, ended),
            )
        )
    return Parsed(tuple(records), tuple(skips))


def _slurm_row_record(
    row: Mapping[str, str],
    *,
    job_id: str,
    fields: tuple[str, str],
    gpus: tuple[int, str],
    status: Status,
    times: tuple[datetime | None, datetime, datetime],
) -> HistoryRecord:
    """A finished Slurm job from a sacct or scontrol row (``fields``: its user and time-limit
    column names, which the two spell differently).  Source ``sacct`` for both: one key space."""
    user_field, limit_field = fields
    submitted, started, ended = times
    exit_text = row.get("ExitCode", "").split(":")[0]
    return HistoryRecord(
        source="sacct",
        external_id=job_id,
        user=_slurm_name(row.get(user_field, "")),
        account=_slurm_name(row.get("Account", "")),
        name=row.get("JobName", "").strip() or f"slurm-{job_id}",
        gpu_count=gpus[0],
        gpu_type=gpus[1],
        submitted_at=submitted or started,
        started_at=started,
        ended_at=ended,
        requested_s=slurm_duration_s(row.get(limit_field, "")),
        status=status,
        exit_code=int(exit_text) if exit_text.isdigit() else None,
    )
