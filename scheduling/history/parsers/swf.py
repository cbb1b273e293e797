"""The Standard Workload Format of the Parallel Workloads Archive."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from scheduling.history.parsers.records import HistoryRecord, Parsed, Skip, Status

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
