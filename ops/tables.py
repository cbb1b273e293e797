"""The shape every staff report takes: a `Table` (chart, HTML table and CSV from the same rows)
over a `Range` of hour or day buckets.  Split from `ops.selectors` (house rule)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from scheduling.labels import reason_label

BUCKETS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


@dataclass(frozen=True, slots=True)
class Table:
    """One chart's numbers: the same rows print as an HTML table and download as CSV."""

    name: str  # also the CSV file name and the ?csv= value
    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    # How ops.js draws it: "stacked" (bars), "line", "heatmap" or "" (table only).
    chart: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Said in words in place of the chart when `is_blank` (why there is nothing to draw).
    empty_reason: str = ""
    # Said under the chart: e.g. why some cells are "–" (no record then), not 0.
    note: str = ""

    @property
    def is_blank(self) -> bool:
        """No value to draw: every charted cell is empty or zero (a blank axis says nothing)."""
        columns = self.extra.get("data_columns") or self.extra.get("only") or range(1, len(self.headers))
        if self.extra.get("skip_last") and not (self.extra.get("only") or self.extra.get("data_columns")):
            columns = list(columns)[:-1]
        return not any(row[i] for row in self.rows for i in columns if i < len(row))

    @property
    def blank_reason(self) -> str:
        """The sentence shown instead of an empty chart ("" while there is something to draw)."""
        if not self.is_blank:
            return ""
        return self.empty_reason or "Nothing to draw in this range."

    @property
    def chart_id(self) -> str:
        return f"chart-{self.name}"

    def chart_data(self) -> dict[str, Any]:
        """Column 0 is the x label; every other column one dataset."""
        return {
            "kind": self.chart,
            "title": self.caption,
            "labels": [str(r[0]) for r in self.rows],
            "series": [
                {"label": reason_label(h), "data": [r[i] for r in self.rows]}
                for i, h in enumerate(self.headers)
                if i > 0
            ],
            **self.extra,
        }


@dataclass(frozen=True, slots=True)
class Range:
    start_at: datetime
    end_at: datetime
    bucket: str  # "hour" | "day"

    @property
    def step(self) -> timedelta:
        return BUCKETS[self.bucket]

    def starts(self) -> list[datetime]:
        out, t = [], self.start_at
        while t < self.end_at:
            out.append(t)
            t += self.step
        return out

    def index(self, at: datetime) -> int:
        return int((at - self.start_at) // self.step)


def range_get(*, days: int, bucket: str, now: datetime | None = None) -> Range:
    """The last ``days`` days up to the end of the current bucket, aligned to the bucket."""
    now = (now or timezone.now()).astimezone(UTC)
    if bucket == "day":
        end = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    else:
        end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return Range(start_at=end - timedelta(days=days), end_at=end, bucket=bucket)


def _label(at: datetime, bucket: str) -> str:
    return at.strftime("%Y-%m-%d") if bucket == "day" else at.strftime("%Y-%m-%d %H:00")
