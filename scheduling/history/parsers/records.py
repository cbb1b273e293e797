"""What every parser returns: `HistoryRecord`s (finished GPU jobs) and `Skip`s (rows not imported, why)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

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
