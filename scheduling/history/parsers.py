"""Parsers for job-history dumps: text in, ``HistoryRecord``s and ``Skip``s out (pure, no Django).

Formats:

* ``sacct``: ``sacct --parsable2`` output with its header line (``|``-separated).  Fields read
  (others are ignored, order is free): ``JobID`` (required; steps such as ``12.batch`` are
  skipped), ``JobName``, ``User``, ``Account``, ``Partition``, ``Submit``, ``Start``, ``End``
  (``YYYY-MM-DDTHH:MM:SS`` in the Slurm host's zone, ``Unknown``/``None`` when unset),
  ``Timelimit`` (``[D-]HH:MM:SS``, ``MM:SS``, ``UNLIMITED``), ``State`` (``COMPLETED``,
  ``FAILED``, ``TIMEOUT``, ``OUT_OF_MEMORY``, ``NODE_FAIL``, ``CANCELLED by N``, ...),
  ``ExitCode`` (``code:signal``), and the GPUs from ``AllocTRES`` (else ``ReqTRES``,
  ``AllocGRES``, ``ReqGRES``): ``gres/gpu:TYPE=N`` or ``gres/gpu=N`` (or ``gpu:TYPE:N``).
  A dump to feed it::

      sacct -a -X --parsable2 -S 2025-01-01 -E now \\
        --format=JobID,JobName,User,Account,Partition,Submit,Start,End,Timelimit,State,ExitCode,AllocTRES,ReqTRES

* ``slurmrestd``: slurmdbd's job records as slurmrestd's accounting API answers them
  (``GET /slurmdb/v0.0.38/jobs``, Slurm 22.05), read by `parse_slurmdb_jobs`: the same fields as
  the ``sacct`` path, from ``job_id`` (array tasks ``<array job>_<task>``, het components
  ``<het job>+<offset>``), ``name``, ``user``, ``account``, ``state.current``, ``time.submission``/
  ``start``/``end`` (epoch seconds), ``time.limit`` (minutes), ``exit_code`` and the GPUs from
  ``tres.allocated`` (else ``tres.requested``) entries ``{"type": "gres", "name": "gpu:a100", "count": 2}``.
* ``swf``: the Standard Workload Format of the Parallel Workloads Archive (18 whitespace
  fields; ``;`` comments, ``; UnixStartTime: N`` gives the epoch).  One allocated processor
  counts as one GPU (as in the shared traces); users and groups become ``u<id>``/``g<id>``.
* ``scontrol``: ``scontrol show job -o`` (one job per line, ``Key=Value``): what a Slurm
  without slurmdbd still tells about finished jobs (for ``MinJobAge`` seconds).  GPUs come
  from ``TresPerNode``/``TresPerJob`` (``gres:gpu:a100:2``, times ``NumNodes`` per node), else
  ``AllocTRES``/``TRES``.
* ``trace``: the shared trace CSV (``job_id,user,group,submit_time,start_time,end_time,
  num_gpus,gpu_type,status[,requested_time]``; seconds since the trace's epoch).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

Status = Literal["completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One finished job as the source logged it (times aware UTC, ``gpu_type`` "" when unknown)."""

    source: str  # "sacct" | "swf" | "trace"
    external_id: str
    user: str
    account: str
    name: str
    gpu_count: int
    gpu_type: str
    submitted_at: datetime
    started_at: datetime
    ended_at: datetime
    requested_s: int | None
    status: Status
    exit_code: int | None


@dataclass(frozen=True, slots=True)
class Skip:
    """A source row not imported, and why (``line`` is 1-based in the input)."""

    line: int
    external_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Parsed:
    records: tuple[HistoryRecord, ...]
    skips: tuple[Skip, ...]


# ---- sacct ----

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


# ---- slurmrestd's accounting API (/slurmdb/v0.0.38/jobs) ----

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


# ---- scontrol show job -o ----

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def _key_values(line: str) -> dict[str, str]:
    """``A=1 B=x y C=`` -> ``{"A": "1", "B": "x y", "C": ""}`` (values may hold spaces)."""
    marks = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out.setdefault(mark[1], line[mark.end() : end].strip())
    return out


def parse_scontrol(text: str, *, zone: tzinfo = UTC) -> Parsed:
    """Parse ``scontrol show job -o`` output (``zone``: the Slurm host's)."""
    records: list[HistoryRecord] = []
    skips: list[Skip] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = _key_values(line)
        job_id = row.get("JobId", "")
        if not job_id:
            skips.append(Skip(number, "", "not a scontrol job line (no JobId)"))
            continue
        status = _sacct_status(row.get("JobState", ""))
        if status is None:
            skips.append(Skip(number, job_id, f"not finished ({row.get('JobState') or 'no state'})"))
            continue
        gpus = None
        nodes = int(row["NumNodes"]) if row.get("NumNodes", "").isdigit() else 1
        for field, factor in (("TresPerJob", 1), ("TresPerNode", nodes), ("AllocTRES", 1), ("TRES", 1)):
            value = row.get(field, "")
            if value and value != "(null)":
                found = gpus_from_tres(value.replace("gres:", ""))
                if found is not None:
                    gpus = (found[0] * factor, found[1])
                    break
        if gpus is None or gpus[0] <= 0:
            skips.append(Skip(number, job_id, "no GPUs (CPU-only job)"))
            continue
        try:
            submitted = _slurm_time(row.get("SubmitTime", ""), zone)
            started = _slurm_time(row.get("StartTime", ""), zone)
            ended = _slurm_time(row.get("EndTime", ""), zone)
        except ValueError as exc:
            skips.append(Skip(number, job_id, f"unreadable time: {exc}"))
            continue
        if started is None or ended is None:
            skips.append(Skip(number, job_id, "never started"))
            continue
        records.append(
            _slurm_row_record(
                row,
                job_id=job_id,
                fields=("UserId", "TimeLimit"),
                gpus=gpus,
                status=status,
                times=(submitted, started, ended),
            )
        )
    return Parsed(tuple(records), tuple(skips))


# ---- SWF ----

_SWF_STATUS: dict[int, Status] = {1: "completed", 0: "failed", 5: "cancelled", -1: "completed"}


def parse_swf(text: str, *, epoch: datetime | None = None) -> Parsed:
    """Parse an SWF log; ``epoch`` (aware) is time 0, else the header's ``UnixStartTime``."""
    start = epoch
    records: list[HistoryRecord] = []
    skips: list[Skip] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(";"):
            match = re.match(r";\s*UnixStartTime:\s*(\d+)", stripped)
            if match and start is None:
                start = datetime.fromtimestamp(int(match[1]), UTC)
            continue
        fields = stripped.split()
        if len(fields) < 18:
            skips.append(Skip(number, fields[0] if fields else "", "not an SWF record (needs 18 fields)"))
            continue
        if start is None:
            raise ValueError("the SWF log has no UnixStartTime header: give the epoch")
        try:
            job, submit, wait, run, procs = (int(float(f)) for f in fields[:5])
            req_procs, req_time, status_code = int(float(fields[7])), int(float(fields[8])), int(fields[10])
            user, group = int(fields[11]), int(fields[12])
        except ValueError:
            skips.append(Skip(number, fields[0], "unreadable number"))
            continue
        gpus = procs if procs > 0 else req_procs
        if gpus <= 0:
            skips.append(Skip(number, str(job), "no processors"))
            continue
        if wait < 0 or run < 0:
            skips.append(Skip(number, str(job), "never started (no wait or run time)"))
            continue
        status = _SWF_STATUS.get(status_code)
        if status is None:
            skips.append(Skip(number, str(job), f"status {status_code} is not a finished job"))
            continue
        submitted = start + timedelta(seconds=submit)
        started = submitted + timedelta(seconds=wait)
        records.append(
            HistoryRecord(
                source="swf",
                external_id=str(job),
                user=f"u{user}" if user >= 0 else "",
                account=f"g{group}" if group >= 0 else "",
                name=f"swf-{job}",
                gpu_count=gpus,
                gpu_type="",
                submitted_at=submitted,
                started_at=started,
                ended_at=started + timedelta(seconds=run),
                requested_s=req_time if req_time > 0 else None,
                status=status,
                exit_code=None,
            )
        )
    return Parsed(tuple(records), tuple(skips))


# ---- shared trace CSV ----

_TRACE_STATUS: dict[str, Status] = {"completed": "completed", "failed": "failed", "killed": "cancelled"}
_TRACE_COLUMNS = ("job_id", "user", "group", "submit_time", "start_time", "end_time", "num_gpus", "gpu_type")


def parse_trace_csv(lines: Iterable[str], *, epoch: datetime) -> Parsed:
    """Parse the shared trace CSV (``/work/shared/traces/README.md``); ``epoch`` is time 0."""
    reader = csv.DictReader(lines if not isinstance(lines, str) else io.StringIO(lines))
    missing = [c for c in _TRACE_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"not the shared trace format: missing column(s) {', '.join(missing)}")
    records: list[HistoryRecord] = []
    skips: list[Skip] = []
    for number, row in enumerate(reader, start=2):
        job_id = (row.get("job_id") or "").strip()
        status = _TRACE_STATUS.get((row.get("status") or "").strip())
        if status is None:
            skips.append(Skip(number, job_id, f"unknown status {row.get('status')!r}"))
            continue
        if not (row.get("start_time") or "").strip() or not (row.get("end_time") or "").strip():
            skips.append(Skip(number, job_id, "never started"))
            continue
        try:
            submit, begin, end = (float(row[c]) for c in ("submit_time", "start_time", "end_time"))
            gpus = int(float(row["num_gpus"]))
            requested = (row.get("requested_time") or "").strip()
            requested_s = int(float(requested)) if requested else None
        except (TypeError, ValueError):
            skips.append(Skip(number, job_id, "unreadable number"))
            continue
        if gpus <= 0:
            skips.append(Skip(number, job_id, "no GPUs"))
            continue
        if end < begin:
            skips.append(Skip(number, job_id, "ends before it starts"))
            continue
        records.append(
            HistoryRecord(
                source="trace",
                external_id=job_id,
                user=(row.get("user") or "").strip(),
                account=(row.get("group") or "").strip(),
                name=f"trace-{job_id}",
                gpu_count=gpus,
                gpu_type=(row.get("gpu_type") or "").strip(),
                submitted_at=epoch + timedelta(seconds=submit),
                started_at=epoch + timedelta(seconds=begin),
                ended_at=epoch + timedelta(seconds=end),
                requested_s=requested_s if requested_s and requested_s > 0 else None,
                status=status,
                exit_code=None,
            )
        )
    return Parsed(tuple(records), tuple(skips))
