"""What every service shares: the conflict error, permission checks, the node lock, after-commit triggers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg.errors
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from portal.accounts.models import Membership, Project, Quota
from scheduling.alternatives import Alternative
from scheduling.models import (
    Booking,
    Gpu,
    GpuType,
    Node,
)
from scheduling.ports import prediction_port
from scheduling.selectors import prepared_fetchall

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


def _require_member_read_quota(user: User, *, project: Project, gpu_type: GpuType) -> Quota | None:
    """``_require_member`` and the project's quota row for the type, in one round trip.

    The quota row is read before the caller's node lock (a quota created concurrently is
    indistinguishable from one created just after this booking); the project's peak use,
    which concurrent bookings do change, is computed under the lock.
    """
    [(is_member, quota_id, guaranteed, borrow)] = prepared_fetchall(
        f"""
        SELECT EXISTS (SELECT 1 FROM {Membership._meta.db_table} WHERE user_id = %s AND project_id = %s),
               q.id, q.guaranteed_gpus, q.borrow_limit_gpus
          FROM (SELECT 1) AS one
          LEFT JOIN {Quota._meta.db_table} q ON q.project_id = %s AND q.gpu_type_id = %s
        """,  # noqa: S608 - table names from the models, values bound
        [user.pk, project.pk, project.pk, gpu_type.pk],
    )
    if not getattr(user, "is_staff", False) and not is_member:
        raise PermissionDenied("You are not a member of this project.")
    if quota_id is None:
        return None
    return Quota(
        pk=quota_id, project=project, gpu_type=gpu_type, guaranteed_gpus=guaranteed, borrow_limit_gpus=borrow
    )


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


def _lock_nodes(*, gpu_type: GpuType, cluster_ids: Sequence[int]) -> None:
    """Serialize placements on one GPU type (see the locking protocol in the package docstring)."""
    prepared_fetchall(
        f"SELECT id FROM {Node._meta.db_table} WHERE gpu_type_id = %s AND cluster_id = ANY(%s)"  # noqa: S608
        " ORDER BY id FOR UPDATE",
        [gpu_type.pk, list(cluster_ids)],
    )


def _capacity_by_cluster(*, gpu_type: GpuType, cluster_ids: Sequence[int]) -> dict[int, int]:
    """GPUs of the type per cluster (one grouped row per cluster, not one row per GPU)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT n.cluster_id, count(*) FROM {Gpu._meta.db_table} g"  # noqa: S608
            f" JOIN {Node._meta.db_table} n ON n.id = g.node_id"
            " WHERE n.gpu_type_id = %s AND n.cluster_id = ANY(%s) GROUP BY n.cluster_id",
            [gpu_type.pk, list(cluster_ids)],
        )
        return {cluster_id: int(n) for cluster_id, n in cursor.fetchall()}


def _engine_round_soon(cluster_id: int) -> None:
    """Ask for an engine round after the commit (debounced); a missed trigger waits for beat."""
    from scheduling.tasks import engine_round_trigger  # lazy: tasks -> rounds -> services

    engine_round_trigger(cluster_id)


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
