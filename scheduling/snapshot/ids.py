"""Engine ids of the portal's rows and the engine's clock (epoch seconds).

A job is ``str(job.pk)``, a booking ``"booking-<pk>"``, a GPU its ``Gpu`` primary key, a node its
name, a project its slug and a user its username.
"""

from __future__ import annotations

from datetime import UTC, datetime

from scheduling.models import Job

BOOKING_PREFIX = "booking-"

RUNNING_STATUSES = (Job.Status.STARTING, Job.Status.RUNNING)


def epoch(value: datetime) -> float:
    return value.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


def booking_engine_id(booking_id: int) -> str:
    return f"{BOOKING_PREFIX}{booking_id}"


def parse_holder_id(holder_id: str) -> tuple[str, int] | None:
    """``("booking", pk)`` or ``("job", pk)`` for an engine id; None for anything else."""
    if holder_id.startswith(BOOKING_PREFIX):
        rest = holder_id[len(BOOKING_PREFIX) :]
        return ("booking", int(rest)) if rest.isdigit() else None
    return ("job", int(holder_id)) if holder_id.isdigit() else None
