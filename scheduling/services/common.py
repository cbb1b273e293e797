"""What every service shares: the conflict error, permission checks, the node lock, after-commit triggers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg.errors
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone

from portal.accounts.models import Membership, Project
from scheduling import queries
from scheduling.alternatives import Alternative
from scheduling.models import Booking
from scheduling.ports import prediction_port, round_trigger
from scheduling.queries import GpuTypeRef, ProjectRef, QuotaRow

logger = logging.getLogger(__name__)


class BookingConflictError(Exception):
    """The requested GPUs are not free; carries the nearest free alternative windows (409)."""

    def __init__(
        self,
        message: str,
        *,
        alternatives: Sequence[Alternative] = (),
        fields: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.alternatives = list(alternatives)
        self.fields = fields or {}


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def _require_member(user: User, *, project: Project) -> None:
    """Members act for their project; staff may act for any project."""
    if getattr(user, "is_staff", False):
        return
    if not Membership.objects.filter(user_id=user.pk, project=project).exists():
        raise PermissionDenied("You are not a member of this project.")


def _require_member_read_quota(user: User, *, project: ProjectRef, gpu_type: GpuTypeRef) -> QuotaRow | None:
    """``_require_member`` and the project's quota row for the type, in one round trip.

    The quota row is read before the caller's node lock (a quota created concurrently is
    indistinguishable from one created just after this booking); the project's peak use,
    which concurrent bookings do change, is computed under the lock.
    """
    found = queries.member_quota_get(user_id=user.pk, project_id=project.pk, gpu_type_id=gpu_type.pk)
    if not getattr(user, "is_staff", False) and not found.is_member:
        raise PermissionDenied("You are not a member of this project.")
    return found.quota


def _require_can_manage(user: User, *, owner_id: int, project_id: int) -> None:
    """The owner, a manager of the object's project, or staff may change it."""
    if getattr(user, "is_staff", False) or user.pk == owner_id:
        return
    is_manager = Membership.objects.filter(
        user_id=user.pk, project_id=project_id, role=Membership.Role.MANAGER
    ).exists()
    if not is_manager:
        raise PermissionDenied("Only the owner or a project manager may change this.")


def _utc(value: datetime) -> str:
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _human(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours / 24:g} days" if hours >= 48 else f"{hours:g} hours"


def is_exclusion_violation(exc: IntegrityError) -> bool:
    """The insert hit the allocation exclusion constraint (a GPU already held in that period)."""
    return isinstance(exc.__cause__, psycopg.errors.ExclusionViolation)


def _is_deadlock(exc: OperationalError) -> bool:
    # Two writers that skip the node lock can wait on each other's exclusion-index entries.
    return isinstance(exc.__cause__, psycopg.errors.DeadlockDetected)


def _lock_nodes(*, gpu_type: GpuTypeRef, cluster_ids: Sequence[int]) -> None:
    """Serialize placements on one GPU type (see the locking protocol in the package docstring)."""
    queries.nodes_lock(gpu_type_id=gpu_type.pk, cluster_ids=cluster_ids)


def _capacity_by_cluster(*, gpu_type: GpuTypeRef, cluster_ids: Sequence[int]) -> dict[int, int]:
    """GPUs of the type per cluster (one grouped row per cluster, not one row per GPU)."""
    return queries.capacity_by_cluster(gpu_type_id=gpu_type.pk, cluster_ids=cluster_ids)


def _engine_round_soon(cluster_id: int) -> None:
    """Ask for an engine round after the commit (debounced); a missed trigger waits for beat."""
    round_trigger(cluster_id)


def _runtime_predict_soon(job_id: int) -> None:
    """Store the job's predicted runtime after the commit, off the request path."""

    def enqueue() -> None:
        try:
            prediction_port().job_runtime_predict_enqueue(job_id=job_id)
        except Exception:  # the hourly refresh fills predictions that a broker outage missed
            logger.warning("could not enqueue a runtime prediction for job %s", job_id, exc_info=True)

    transaction.on_commit(enqueue)


def _lock_booking(booking: Booking) -> Booking:
    """The booking's row, locked for this transaction (after the node lock: see the protocol)."""
    return Booking.objects.select_for_update().get(pk=booking.pk)
