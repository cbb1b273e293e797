"""Loading job traces in the shared CSV format (`../shared/traces/README.md`).

Columns: ``job_id,user,group,submit_time,start_time,end_time,num_gpus,gpu_type,status[,requested_time]``,
plain or gzip.  A replay uses only the arrival (``submit_time``) and the runtime
(``end_time - start_time``); the logged start times never drive a replay.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

# Hour-of-week phase of t = 0 for traces whose calendar is known (seconds after Monday 00:00,
# local time of the cluster).  KTH: 1996-09-30 was a Monday, 12:38:01 Europe/Stockholm.
_KNOWN_WEEK_PHASE_S = {"pwa_kth_sp2_1996": 12 * 3600 + 38 * 60 + 1}


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One batch job of a trace, as replayed: arrival, size and true runtime."""

    id: str
    user: str
    project: str
    submit_at: float
    runtime_s: float
    gpu_count: int
    gpu_type: str | None
    requested_s: float | None
    status: str


@dataclass(frozen=True, slots=True)
class Trace:
    """The replayable jobs of one trace file, in submit order."""

    name: str
    jobs: tuple[TraceJob, ...]
    skipped_no_runtime: int  # rows without a start or end time (never ran in the log)
    skipped_no_gpus: int  # rows with num_gpus <= 0
    week_phase_s: float  # seconds after Monday 00:00 local at t = 0 (0 when unknown)

    @property
    def gpu_hours(self) -> float:
        """Total GPU-hours of the replayed jobs."""
        return sum(job.runtime_s * job.gpu_count for job in self.jobs) / 3600.0


def trace_name(path: str | Path) -> str:
    """The trace's name: its file name without ``.csv``/``.csv.gz``."""
    name = Path(path).name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _float_or_none(cell: str | None) -> float | None:
    if cell is None or cell.strip() == "":
        return None
    return float(cell)


def load_trace(path: str | Path, *, limit_jobs: int | None = None, min_runtime_s: float = 0.0) -> Trace:
    """Read a trace CSV into replayable jobs sorted by submit time.

    Jobs without a start or an end time are skipped and counted (they never ran in the log,
    so their runtime is unknown).  ``limit_jobs`` keeps the first N replayable jobs in submit
    order.  Times are shifted so that the first kept submission is at 0.  A job's project is
    its ``group`` column, its user the ``user`` column (``group`` when the user is empty).
    """
    path = Path(path)
    rows: list[TraceJob] = []
    skipped_runtime = 0
    skipped_gpus = 0
    with _open_text(path) as handle:
        for row in csv.DictReader(handle):
            gpus = int(float(row["num_gpus"] or 0))
            if gpus <= 0:
                skipped_gpus += 1
                continue
            start = _float_or_none(row.get("start_time"))
            end = _float_or_none(row.get("end_time"))
            if start is None or end is None or end < start:
                skipped_runtime += 1
                continue
            group = (row.get("group") or "").strip() or "default"
            user = (row.get("user") or "").strip() or group
            requested = _float_or_none(row.get("requested_time"))
            rows.append(
                TraceJob(
                    id=row["job_id"],
                    user=user,
                    project=group,
                    submit_at=float(row["submit_time"]),
                    runtime_s=max(end - start, min_runtime_s),
                    gpu_count=gpus,
                    gpu_type=(row.get("gpu_type") or "").strip() or None,
                    requested_s=requested if requested and requested > 0 else None,
                    status=row.get("status") or "",
                )
            )
    # Stable: ties keep file order, which is the log's order.
    rows.sort(key=lambda job: job.submit_at)
    if limit_jobs is not None:
        rows = rows[:limit_jobs]
    name = trace_name(path)
    origin = rows[0].submit_at if rows else 0.0
    # Samples keep the original times and a name that starts with the full trace's name.
    phase = next((v for k, v in _KNOWN_WEEK_PHASE_S.items() if name.startswith(k)), 0.0)
    if origin:
        rows = [_shift(job, origin) for job in rows]
        phase = (phase + origin) % (7 * 86_400)
    return Trace(
        name=name,
        jobs=tuple(rows),
        skipped_no_runtime=skipped_runtime,
        skipped_no_gpus=skipped_gpus,
        week_phase_s=phase,
    )


def _shift(job: TraceJob, origin: float) -> TraceJob:
    return TraceJob(
        id=job.id,
        user=job.user,
        project=job.project,
        submit_at=job.submit_at - origin,
        runtime_s=job.runtime_s,
        gpu_count=job.gpu_count,
        gpu_type=job.gpu_type,
        requested_s=job.requested_s,
        status=job.status,
    )
