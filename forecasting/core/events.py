"""Event calendars (conference deadlines, maintenance windows) as Prophet holidays.

A deadline makes demand rise in the days before it; ``days_before`` / ``days_after``
give Prophet one effect per day around the event (its ``lower_window``/``upper_window``).
A multi-day event (``end`` set) is one occurrence per day.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["Event", "events_from_json", "events_to_holidays"]


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    start: pd.Timestamp
    end: pd.Timestamp | None = None  # inclusive last day; None: a one-day event
    days_before: int = 0
    days_after: int = 0


def events_to_holidays(events: Sequence[Event]) -> pd.DataFrame | None:
    """Prophet's ``holidays`` frame (holiday, ds, lower_window, upper_window), or None."""
    rows: list[dict[str, object]] = []
    for event in events:
        last = event.end if event.end is not None else event.start
        for day in pd.date_range(pd.Timestamp(event.start).normalize(), pd.Timestamp(last).normalize()):
            rows.append(
                {
                    "holiday": event.name,
                    "ds": day,
                    "lower_window": -abs(event.days_before),
                    "upper_window": abs(event.days_after),
                }
            )
    return pd.DataFrame(rows) if rows else None


def events_from_json(path: str | Path) -> list[Event]:
    """Read ``[{"name", "start", "end"?, "days_before"?, "days_after"?}, ...]`` from a file."""
    raw: Iterable[dict[str, object]] = json.loads(Path(path).read_text())
    events = []
    for item in raw:
        end = item.get("end")
        events.append(
            Event(
                name=str(item["name"]),
                start=pd.Timestamp(str(item["start"])),
                end=pd.Timestamp(str(end)) if end else None,
                days_before=int(str(item.get("days_before", 0))),
                days_after=int(str(item.get("days_after", 0))),
            )
        )
    return events
