"""The shared trace CSV (``../shared/traces/README.md``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime, timedelta

from scheduling.history.parsers.records import HistoryRecord, Parsed, Skip, Status

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
