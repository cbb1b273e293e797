"""Raw SQL of the scheduling app where it earns its place: typed rows, tested against the ORM.

Each function here runs one statement and returns frozen dataclasses of plain values (never model
instances).  ``tests/scheduling/test_queries.py`` compares every row with what the ORM reads
from the same data, field for field, so a column added to a model and not here fails a test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from portal.accounts.models import Project
from scheduling.models import Cluster, GpuType
from scheduling.selectors import prepared_fetchall


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


@dataclass(frozen=True, slots=True)
class GpuTypeRow:
    """Every column of a ``GpuType``, by attribute name."""

    id: int
    name: str
    memory_gib: float
    precisions: list[str]
    relative_speed: float
    value: float


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
