"""Build and emit the notification of a scheduling state change: the one small function per
kind of holder that `scheduling.services`, `scheduling.rounds` and the beat scan call.

The callers pass the row they just changed, inside their transaction; `event_emit` does the rest
(deliveries written now, sent after the commit).  Keys name the occurrence: a job's start is
``job:<id>:started:<attempt>`` (a requeued job starting again is a new start), a booking's start
``booking:<id>:started``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.urls import get_script_prefix, get_urlconf, reverse

from notifications.models import Delivery, EventKind
from notifications.services import Event, event_emit
from scheduling.models import Booking, Job, Preemption


def _url(path: str) -> str:
    return str(settings.BERTH_PUBLIC_URL).rstrip("/") + path


# A number no job id reaches, reversed once per URL configuration and script prefix: the path
# of a job is the text around it with the job's id in its place (`reverse` writes an integer
# the same way; a round's start and preemption notices reversed ~470 paths at ~11 us each).
_ID_MARK = 987_654_321_987_654_321
_JOB_PATHS: dict[tuple[object, str], tuple[str, str]] = {}


def _job_path(job_id: int) -> str:
    """``reverse("job-detail", args=[job_id])``."""
    key = (get_urlconf(), get_script_prefix())
    around = _JOB_PATHS.get(key)
    if around is None:
        head, tail = reverse("job-detail", args=[_ID_MARK]).split(str(_ID_MARK))
        around = _JOB_PATHS[key] = (head, tail)
    return around[0] + str(int(job_id)) + around[1]


def _human_s(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _job_data(job: Job) -> dict[str, Any]:
    return {
        "job": {
            "id": job.pk,
            "name": job.name,
            "status": job.status,
            "project": job.project.slug,
            "cluster": job.cluster.name,
            "gpu_count": job.gpu_count,
            "attempt": job.attempt,
            "exit_code": job.exit_code,
            "status_message": job.status_message,
            "url": _url(_job_path(job.pk)),
        }
    }


def _cannot_start_key(job: Job) -> str:
    return f"job:{job.pk}:cannot_start:{job.attempt}"


def job_event_emit(
    job: Job, *, kind: str, at: datetime, preemption: Preemption | None = None, lost_gpu_s: float = 0.0
) -> None:
    """Tell the job's owner (and the webhooks watching it) that it started, finished, failed,
    cannot start, or is about to be preempted (``preemption`` with the grace and the work that
    would be lost, in GPU-seconds)."""
    data = _job_data(job)
    link = data["job"]["url"]
    name = f"job {job.pk} ({job.name})"
    if kind == EventKind.JOB_STARTED:
        key = f"job:{job.pk}:started:{job.attempt}"
        subject = f"Berth: {name} started"
        text = f"Your {name} started on {job.gpu_count} GPU(s) of {job.cluster.name}.\n{link}"
    elif kind == EventKind.JOB_FINISHED:
        key = f"job:{job.pk}:finished:{job.attempt}"
        subject = f"Berth: {name} finished"
        text = f"Your {name} finished (exit code {job.exit_code}).\nOutput: {link}"
    elif kind == EventKind.JOB_FAILED:
        key = f"job:{job.pk}:failed:{job.attempt}"
        subject = f"Berth: {name} failed"
        text = (
            f"Your {name} failed (exit code {job.exit_code}). {job.status_message}\n"
            f"Output and exit code: {link}"
        )
    elif kind == EventKind.JOB_CANNOT_START:
        key = _cannot_start_key(job)
        subject = f"Berth: {name} cannot start"
        text = f"Your {name} cannot start as submitted: {job.pending_sentence}\n{link}"
        data["job"]["reason"] = job.pending_reason
        data["job"]["sentence"] = job.pending_sentence
    elif kind == EventKind.JOB_PREEMPTED and preemption is not None:
        grace_s = (preemption.kill_at - preemption.signalled_at).total_seconds()
        key = f"job:{job.pk}:preempted:{preemption.pk}"
        subject = f"Berth: {name} will be preempted in {_human_s(grace_s)}"
        saved = (
            "It checkpoints, so it resumes from its last checkpoint."
            if job.is_checkpointable
            else "It does not checkpoint: its work so far will be lost and it restarts from the beginning."
        )
        text = (
            f"Your preemptible {name} is being reclaimed: {preemption.reason}\n"
            f"Grace: {_human_s(grace_s)} (it is stopped at {preemption.kill_at.isoformat()}). "
            f"{saved} Work lost at that point: about {lost_gpu_s / 3600:.2f} GPU-hours. "
            f"It is requeued automatically.\n{link}"
        )
        data["preemption"] = {
            "id": preemption.pk,
            "reason": preemption.reason,
            "signalled_at": preemption.signalled_at.isoformat(),
            "kill_at": preemption.kill_at.isoformat(),
            "grace_s": grace_s,
            "lost_gpu_s": lost_gpu_s,
            "is_checkpointable": job.is_checkpointable,
        }
    else:
        raise ValueError(f"not a job event: {kind}")
    event_emit(
        Event(
            kind=kind,
            key=key,
            user_id=job.user_id,
            project_id=job.project_id,
            subject=subject,
            text=text,
            at=at,
            data=data,
        )
    )


def jobs_cannot_start_emit(jobs: Sequence[Job], *, at: datetime) -> int:
    """Tell the owners of ``jobs`` (each can never start as submitted) once per attempt; returns how many
    were told now.  One query finds the jobs told already, so a round re-finding the same verdict
    costs no more than that query."""
    keys = {job.pk: _cannot_start_key(job) for job in jobs}
    told = set(Delivery.objects.filter(event_key__in=list(keys.values())).values_list("event_key", flat=True))
    fresh = [job for job in jobs if keys[job.pk] not in told]
    for job in fresh:
        job_event_emit(job, kind=EventKind.JOB_CANNOT_START, at=at)
    return len(fresh)


def booking_event_emit(booking: Booking, *, kind: str, at: datetime, detail: str = "") -> None:
    """Tell the booking's owner that it starts soon, started (with how to get on its GPUs), ends
    soon, has lent work reclaimed for it, or may not get its GPUs at its start (``detail`` says why)."""
    from scheduling.access import booking_access

    link = _url(reverse("booking-detail", args=[booking.pk]))
    data: dict[str, Any] = {
        "booking": {
            "id": booking.pk,
            "status": booking.status,
            "project": booking.project.slug,
            "cluster": booking.cluster.name,
            "gpu_type": booking.gpu_type.name,
            "gpu_count": booking.gpu_count,
            "start_at": booking.start_at.isoformat(),
            "end_at": booking.end_at.isoformat(),
            "url": link,
        }
    }
    what = f"booking {booking.pk} ({booking.gpu_count} × {booking.gpu_type.name} on {booking.cluster.name})"
    if kind == EventKind.BOOKING_STARTING:
        key = f"booking:{booking.pk}:starting:{booking.start_at.isoformat()}"
        minutes = max(0, round((booking.start_at - at).total_seconds() / 60))
        subject = f"Berth: your booking {booking.pk} starts in {minutes} min"
        access = booking_access(booking)
        data["access"] = access.as_dict()
        text = f"Your {what} starts at {booking.start_at.isoformat()}.\n\n{access.as_text()}\n\n{link}"
    elif kind == EventKind.BOOKING_STARTED:
        key = f"booking:{booking.pk}:started"
        subject = f"Berth: your booking {booking.pk} has started"
        access = booking_access(booking)
        data["access"] = access.as_dict()
        ends = booking.end_at.isoformat()
        text = f"Your {what} has started; it ends at {ends}.\n\n{access.as_text()}\n\n{link}"
    elif kind == EventKind.BOOKING_ENDING:
        key = f"booking:{booking.pk}:ending:{booking.end_at.isoformat()}"
        minutes = max(0, round((booking.end_at - at).total_seconds() / 60))
        subject = f"Berth: your booking {booking.pk} ends in {minutes} min"
        text = f"Your {what} ends at {booking.end_at.isoformat()}. Save your work, or extend it:\n{link}"
    elif kind == EventKind.BOOKING_RECLAIMED:
        key = f"booking:{booking.pk}:reclaimed"
        subject = f"Berth: GPUs are being freed for your booking {booking.pk}"
        text = (
            f"Preemptible work borrowed the GPUs of your {what}; it is being reclaimed so that "
            f"they are yours at {booking.start_at.isoformat()}. {detail}\n{link}"
        )
    elif kind == EventKind.BOOKING_AT_RISK:
        key = f"booking:{booking.pk}:at_risk"
        subject = f"Berth: your booking {booking.pk} may not get its GPUs at its start"
        text = f"Your {what} may start late: {detail}\n{link}"
        data["booking"]["detail"] = detail
    else:
        raise ValueError(f"not a booking event: {kind}")
    event_emit(
        Event(
            kind=kind,
            key=key,
            user_id=booking.user_id,
            project_id=booking.project_id,
            subject=subject,
            text=text,
            at=at,
            data=data,
        )
    )
