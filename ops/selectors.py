"""Aggregate reads for the staff (operations) pages: utilization, fairness, idle reasons, audit.

Every selector returns plain `Table` objects: the page draws its chart from a table, prints
the same table under it and serves it as CSV, so the three can never disagree.  Callers
check ``is_staff`` (these read every project's data).

Queries are bounded: each selector runs a fixed number of queries whatever the range, and
buckets in Python (allocations are few per GPU and hour).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet

from ops.idle import IDLE_REASONS, ROUND_HOLD_MAX, IdleDrill, idle_drill_get, idle_get
from ops.tables import BUCKETS, Range, Table, range_get
from ops.usage import (
    HEATMAP_MAX_COLUMNS,
    fairness_get,
    no_work_reason,
    runtime_accuracy_get,
    utilization_get,
)
from portal.accounts.models import Project, Quota
from scheduling.models import AuditEvent, Cluster

# The report selectors live in `tables`, `usage` and `idle` (house rule: files under 600 lines);
# the views and tests name them from here.
__all__ = [
    "BUCKETS",
    "HEATMAP_MAX_COLUMNS",
    "IDLE_REASONS",
    "ROUND_HOLD_MAX",
    "AuditChange",
    "IdleDrill",
    "Range",
    "Table",
    "audit_changes",
    "audit_entity_types",
    "audit_event_list",
    "cluster_list",
    "fairness_get",
    "gpu_type_list",
    "idle_drill_get",
    "idle_get",
    "no_work_reason",
    "project_list",
    "quota_list",
    "range_get",
    "runtime_accuracy_get",
    "utilization_get",
]


def cluster_list() -> list[Cluster]:
    return list(Cluster.objects.filter(is_active=True).order_by("name"))


# ---- audit log ----


def audit_event_list(
    *,
    actor: str = "",
    verb: str = "",
    entity_type: str = "",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Audit events, newest first; ``actor`` matches a username or an actor label."""
    qs = AuditEvent.objects.select_related("actor").order_by("-at", "-id")
    if actor:
        qs = qs.filter(Q(actor__username=actor) | Q(actor_label=actor))
    if verb:
        qs = qs.filter(verb__startswith=verb)
    if entity_type:
        qs = qs.filter(entity_type=entity_type)
    if start_at:
        qs = qs.filter(at__gte=start_at)
    if end_at:
        qs = qs.filter(at__lt=end_at)
    return qs


@dataclass(frozen=True, slots=True)
class AuditChange:
    field: str
    before: str  # "" when the field is new
    after: str  # "" when the field is gone


def _audit_value(value: Any) -> str:
    """A stored field as people read it: ISO instants as "2026-12-02 13:57:57 UTC" (the
    microseconds and offset of the JSON say nothing to a reader), dicts as sorted JSON."""
    if value is None:
        return "none"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            return value
        if at.tzinfo is not None:
            return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    return str(value)


def audit_changes(before: Any, after: Any) -> list[AuditChange]:
    """The fields an audit event changed, before -> after, in field order; a creation lists every
    field it set (before ""), a deletion every field it had (after "").  Non-dict states (rare)
    compare as one value."""
    if not isinstance(before, dict) and not isinstance(after, dict):
        if before == after:
            return []
        return [AuditChange("value", "" if before is None else _audit_value(before), _audit_value(after))]
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    changes = []
    for key in [*old, *(k for k in new if k not in old)]:
        if key in old and key in new and old[key] == new[key]:
            continue
        changes.append(
            AuditChange(
                str(key),
                _audit_value(old[key]) if key in old else "",
                _audit_value(new[key]) if key in new else "",
            )
        )
    return changes


def audit_entity_types() -> list[str]:
    return list(AuditEvent.objects.order_by().values_list("entity_type", flat=True).distinct())


def quota_list() -> list[Quota]:
    return list(
        Quota.objects.select_related("project", "gpu_type").order_by("project__name", "gpu_type__name")
    )


def project_list() -> list[Project]:
    return list(Project.objects.filter(is_active=True).order_by("name"))


def gpu_type_list() -> list[Any]:
    from scheduling.models import GpuType

    return list(GpuType.objects.order_by("name"))
