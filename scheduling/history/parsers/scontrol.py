"""``scontrol show job -o``: what a Slurm without slurmdbd still tells about finished jobs."""

from __future__ import annotations

import re
from datetime import UTC, tzinfo

from scheduling.history.parsers.records import HistoryRecord, Parsed, Skip
from scheduling.history.parsers.sacct import _sacct_status, _slurm_row_record, _slurm_time, gpus_from_tres

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
