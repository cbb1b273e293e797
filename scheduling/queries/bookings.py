"""The booking path's statements: a request's names, membership and quota, the node lock, free
GPUs, capacity, a new booking's allocations with their audit events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from portal.accounts.models import Membership, Project, Quota, quota_max_gpus
from scheduling.admission import FreeNode
from scheduling.models import Allocation, AuditEvent, Cluster, Gpu, GpuType, Node
from scheduling.prepared import prepared_execute, prepared_fetchall


class ProjectRef(Protocol):
    """What the services read of a project: a ``Project`` or a ``ProjectRow``."""

    @property
    def pk(self) -> int: ...
    @property
    def slug(self) -> str: ...
    @property
    def is_active(self) -> bool: ...


class GpuTypeRef(Protocol):
    """What the services read of a GPU type: a ``GpuType`` or a ``GpuTypeRow``."""

    @property
    def pk(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def memory_gib(self) -> float: ...


class ClusterRef(Protocol):
    """What the services read of a cluster: a ``Cluster`` or a ``ClusterRow``."""

    @property
    def pk(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def is_active(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ProjectRow:
    """Every column of a ``Project``, by attribute name."""

    id: int
    name: str
    slug: str
    description: str
    fair_share_weight: float
    is_active: bool
    created_at: datetime

    @property
    def pk(self) -> int:
        return self.id


@dataclass(frozen=True, slots=True)
class GpuTypeRow:
    """Every column of a ``GpuType``, by attribute name."""

    id: int
    name: str
    memory_gib: float
    precisions: list[str]
    relative_speed: float
    value: float

    @property
    def pk(self) -> int:
        return self.id


@dataclass(frozen=True, slots=True)
class ClusterRow:
    """Every column of a ``Cluster``, by attribute name (``settings`` decoded from JSON)."""

    id: int
    name: str
    backend: str
    settings: Any
    is_active: bool
    is_degraded: bool
    status_message: str
    created_at: datetime

    @property
    def pk(self) -> int:
        return self.id


@dataclass(frozen=True, slots=True)
class BookingRefs:
    """What a booking request's names refer to; None: no such row (or an inactive cluster)."""

    project: ProjectRow | None
    gpu_type: GpuTypeRow | None
    cluster: ClusterRow | None


_PROJECT_COLUMNS = "p.id, p.name, p.slug, p.description, p.fair_share_weight, p.is_active, p.created_at"
_GPU_TYPE_COLUMNS = "t.id, t.name, t.memory_gib, t.precisions, t.relative_speed, t.value"
_CLUSTER_COLUMNS = (
    "c.id, c.name, c.backend, c.settings::text, c.is_active, c.is_degraded, c.status_message, c.created_at"
)
_REFS_FROM = f"""
      FROM (SELECT 1) AS one
      LEFT JOIN {Project._meta.db_table} p ON p.slug = %s
      LEFT JOIN {GpuType._meta.db_table} t ON t.name = %s
"""
# One statement for the three names of a booking request (three ORM lookups cost ~8x its CPU).
# Table names come from the models; every value is bound.
_REFS_SQL = f"SELECT {_PROJECT_COLUMNS}, {_GPU_TYPE_COLUMNS} {_REFS_FROM}"
_REFS_WITH_CLUSTER_SQL = f"""
    SELECT {_PROJECT_COLUMNS}, {_GPU_TYPE_COLUMNS}, {_CLUSTER_COLUMNS} {_REFS_FROM}
      LEFT JOIN {Cluster._meta.db_table} c ON c.name = %s AND c.is_active
"""
_PROJECT_WIDTH, _GPU_TYPE_WIDTH = 7, 6


def booking_refs_get(*, project_slug: str, gpu_type_name: str, cluster_name: str | None) -> BookingRefs:
    """The project (by slug), GPU type (by name) and active cluster (by name, when one is named)
    of a booking request, in one prepared statement.  A name that matches nothing is None."""
    if cluster_name is None:
        [row] = prepared_fetchall(_REFS_SQL, [project_slug, gpu_type_name])
    else:
        [row] = prepared_fetchall(_REFS_WITH_CLUSTER_SQL, [project_slug, gpu_type_name, cluster_name])
    project = row[:_PROJECT_WIDTH]
    gpu_type = row[_PROJECT_WIDTH : _PROJECT_WIDTH + _GPU_TYPE_WIDTH]
    cluster = row[_PROJECT_WIDTH + _GPU_TYPE_WIDTH :]
    return BookingRefs(
        project=ProjectRow(*project) if project[0] is not None else None,
        gpu_type=GpuTypeRow(*gpu_type) if gpu_type[0] is not None else None,
        cluster=_cluster_row(cluster) if cluster and cluster[0] is not None else None,
    )


def _cluster_row(columns: tuple[Any, ...]) -> ClusterRow:
    pk, name, backend, settings_json, is_active, is_degraded, status_message, created_at = columns
    return ClusterRow(
        id=pk,
        name=name,
        backend=backend,
        settings=json.loads(settings_json),
        is_active=is_active,
        is_degraded=is_degraded,
        status_message=status_message,
        created_at=created_at,
    )


# ---- booking placement: membership and quota, the node lock, free GPUs, the audited insert ----


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """Every column of a ``Quota``, by attribute name."""

    id: int
    project_id: int
    gpu_type_id: int
    guaranteed_gpus: int
    borrow_limit_gpus: int | None

    @property
    def max_gpus(self) -> int | None:
        return quota_max_gpus(self.guaranteed_gpus, self.borrow_limit_gpus)


@dataclass(frozen=True, slots=True)
class MemberQuota:
    """Whether the user is a member of the project, and the project's quota row for the type."""

    is_member: bool
    quota: QuotaRow | None


_MEMBER_QUOTA_SQL = f"""
SELECT EXISTS (SELECT 1 FROM {Membership._meta.db_table}
                WHERE user_id = %(user)s AND project_id = %(project)s),
       q.id, q.project_id, q.gpu_type_id, q.guaranteed_gpus, q.borrow_limit_gpus
  FROM (SELECT 1) AS one
  LEFT JOIN {Quota._meta.db_table} q ON q.project_id = %(project)s AND q.gpu_type_id = %(gpu_type)s
"""  # noqa: S608 - table names from the models, values bound


def member_quota_get(*, user_id: int, project_id: int, gpu_type_id: int) -> MemberQuota:
    """Membership and the quota row of (project, type), in one prepared statement."""
    [(is_member, *quota)] = prepared_fetchall(
        _MEMBER_QUOTA_SQL, {"user": user_id, "project": project_id, "gpu_type": gpu_type_id}
    )
    return MemberQuota(is_member=bool(is_member), quota=QuotaRow(*quota) if quota[0] is not None else None)


_LOCK_NODES_SQL = (
    f"SELECT id FROM {Node._meta.db_table} WHERE gpu_type_id = %s AND cluster_id = ANY(%s)"  # noqa: S608
    " ORDER BY id FOR UPDATE"
)


def nodes_lock(*, gpu_type_id: int, cluster_ids: Sequence[int]) -> list[int]:
    """Lock the type's nodes on the clusters (in id order, so writers queue rather than deadlock);
    their ids."""
    return [node_id for (node_id,) in prepared_fetchall(_LOCK_NODES_SQL, [gpu_type_id, list(cluster_ids)])]


_CAPACITY_SQL = (
    f"SELECT n.cluster_id, count(*) FROM {Gpu._meta.db_table} g"  # noqa: S608
    f" JOIN {Node._meta.db_table} n ON n.id = g.node_id"
    " WHERE n.gpu_type_id = %s AND n.cluster_id = ANY(%s) GROUP BY n.cluster_id"
)


def capacity_by_cluster(*, gpu_type_id: int, cluster_ids: Sequence[int]) -> dict[int, int]:
    """GPUs of the type per cluster (one grouped row per cluster, not one row per GPU)."""
    rows = prepared_fetchall(_CAPACITY_SQL, [gpu_type_id, list(cluster_ids)])
    return {cluster_id: int(n) for cluster_id, n in rows}


# GPUs of the type on up nodes with no blocking allocation overlapping the period, one row per
# node with its free GPUs' ids and indexes as arrays (in index order).  Raw SQL: it runs under
# the node lock of every booking, and the ORM's compilation of the NOT EXISTS cost more CPU
# than PostgreSQL's answer; one row per node rather than per GPU saves converting and
# regrouping every GPU in Python.  ``NOT (state = 'released')`` is the exclusion index's
# predicate, so the index serves the anti-join.
_FREE_GPUS_SQL = f"""
SELECT n.id, n.name, n.cluster_id, array_agg(g.id ORDER BY g.index), array_agg(g.index ORDER BY g.index)
  FROM {Gpu._meta.db_table} g
  JOIN {Node._meta.db_table} n ON n.id = g.node_id
 WHERE n.gpu_type_id = %(gpu_type)s AND n.cluster_id = ANY(%(clusters)s) AND n.status = %(up)s
   AND NOT EXISTS (
       SELECT 1 FROM {Allocation._meta.db_table} a
        WHERE a.gpu_id = g.id AND a.period && %(period)s AND NOT (a.state = %(released)s)
   )
 GROUP BY n.id
 ORDER BY n.id
"""  # noqa: S608 - table names from the models, values bound


def free_nodes_get(
    *, gpu_type_id: int, cluster_ids: Sequence[int], period: DateTimeTZRange
) -> list[FreeNode]:
    """The up nodes of the type with GPUs that no blocking allocation holds within ``period``."""
    rows = prepared_fetchall(
        _FREE_GPUS_SQL,
        {
            "gpu_type": gpu_type_id,
            "clusters": list(cluster_ids),
            "up": Node.Status.UP.value,
            "period": period,
            "released": Allocation.State.RELEASED.value,
        },
    )
    return [
        FreeNode(node_id, name, cluster_id, tuple(gpu_ids), tuple(indexes))
        for node_id, name, cluster_id, gpu_ids, indexes in rows
    ]


# A new booking's planned allocations and its audit events (the booking's, then one per
# allocation in GPU order) in one prepared statement: through the ORM these were two INSERTs
# whose compilation cost more CPU than anything else in booking_create.  The allocation events'
# ``after`` is ``allocation_state`` of each new allocation, built by the caller.
_ALLOCATIONS_INSERT_AUDITED_SQL = f"""
WITH alloc AS (
    INSERT INTO {Allocation._meta.db_table}
           (gpu_id, booking_id, job_id, period, is_preemptible, state, created_at)
    SELECT u.gpu, %(booking)s::bigint, NULL, %(period)s::tstzrange, false, %(state)s::varchar,
           %(at)s::timestamptz
      FROM unnest(%(gpus)s::bigint[]) WITH ORDINALITY AS u(gpu, ord)
     ORDER BY u.ord
    RETURNING id, gpu_id
),
events AS (
    SELECT 0::bigint AS ord, %(booking)s::bigint AS entity_id, 'booking' AS entity_type,
           'booking.create' AS verb, %(booking_after)s::jsonb AS after
    UNION ALL
    SELECT a.ord, alloc.id, 'allocation', 'allocation.create', a.after
      FROM alloc JOIN unnest(%(gpus)s::bigint[], %(afters)s::jsonb[]) WITH ORDINALITY AS a(gpu, after, ord)
        ON a.gpu = alloc.gpu_id
)
INSERT INTO {AuditEvent._meta.db_table}
       (actor_id, actor_label, verb, entity_type, entity_id, before, after, at)
SELECT %(actor)s::bigint, %(label)s::varchar, verb, entity_type, entity_id, NULL, after, %(at)s::timestamptz
  FROM events ORDER BY ord
"""  # noqa: S608 - table names from the models, values bound


def booking_allocations_insert_audited(
    *,
    booking_id: int,
    gpu_ids: Sequence[int],
    period: DateTimeTZRange,
    booking_after: dict[str, Any],
    allocation_afters: Sequence[dict[str, Any]],
    actor_id: int | None,
    actor_label: str,
    at: datetime,
) -> None:
    """Insert the planned allocations of the (already inserted) booking on ``gpu_ids`` and write
    ``booking.create`` and one ``allocation.create`` event per allocation, as
    ``allocation_events_record`` would.  ``allocation_afters``: parallel to ``gpu_ids``."""
    prepared_execute(
        _ALLOCATIONS_INSERT_AUDITED_SQL,
        {
            "booking": booking_id,
            "period": period,
            "state": Allocation.State.PLANNED.value,
            "at": at,
            "gpus": list(gpu_ids),
            "booking_after": json.dumps(booking_after),
            "afters": [json.dumps(after) for after in allocation_afters],
            "actor": actor_id,
            "label": str(actor_label),
        },
    )
