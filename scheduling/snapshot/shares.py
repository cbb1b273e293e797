"""Fair share: every active project's weight, quotas and decayed GPU-hours on a cluster."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from portal.accounts.models import Project, Quota
from scheduling import inputs, queries
from scheduling.engine import types as et
from scheduling.models import Cluster
from scheduling.snapshot.ids import epoch

# (project slug, value-weighted GPUs, started_at, ended_at or None), epoch seconds.
UsageRun = tuple[str, float, float, float | None]


def usage_runs_read(*, cluster_id: int, now: datetime, since: datetime) -> list[UsageRun]:
    """The cluster's runs that overlap ``[since, now)``: what `project_shares` decays.

    The one read of usage history; the decay itself is `inputs.project_usage`, shared with the
    replay, so no second decay formula lives in SQL.  Epoch seconds
    computed by PostgreSQL (the same value as ``datetime.timestamp()``: both are the exact
    instant correctly rounded to a double): parsing 2 datetimes per run of history in Python
    was most of `project_shares`.
    """
    runs = queries.usage_runs_rows(cluster_id=cluster_id, now=now, since=since)
    return [
        (slug, gpu_count * (value or 1.0), started_at, ended_at)
        for slug, gpu_count, value, started_at, ended_at in runs
    ]


def project_shares(*, cluster: Cluster, now: datetime, half_life_s: float) -> tuple[et.ProjectShare, ...]:
    """Every active project with its weight, decayed value-weighted GPU-hours on this cluster and quotas.

    Usage comes from `scheduling.inputs.project_usage` (the replay's code too).  Runs that
    ended more than five half-lives ago are not read: together they weigh less than 2**-5 of
    their GPU-hours.
    """
    window_start = now - timedelta(seconds=half_life_s * 5)
    usage = inputs.project_usage(
        usage_runs_read(cluster_id=cluster.pk, now=now, since=window_start),
        now=epoch(now),
        half_life_s=half_life_s,
    )
    guaranteed: dict[int, list[tuple[str, int]]] = defaultdict(list)
    type_borrow: dict[int, list[tuple[str, int]]] = defaultdict(list)
    borrow: dict[int, int | None] = {}
    for quota in Quota.objects.select_related("gpu_type").order_by("gpu_type__name"):
        guaranteed[quota.project_id].append((quota.gpu_type.name, quota.guaranteed_gpus))
        if quota.borrow_limit_gpus is not None:
            type_borrow[quota.project_id].append((quota.gpu_type.name, quota.borrow_limit_gpus))
        if quota.borrow_limit_gpus is None:
            borrow[quota.project_id] = None
        elif quota.project_id not in borrow or borrow[quota.project_id] is not None:
            borrow[quota.project_id] = (borrow.get(quota.project_id) or 0) + quota.borrow_limit_gpus
    specs = [
        inputs.ProjectSpec(
            name=project.slug,
            weight=project.fair_share_weight,
            guaranteed=tuple(guaranteed.get(project.pk, ())),
            borrow_limit=borrow.get(project.pk),
            borrow_limits=tuple(type_borrow.get(project.pk, ())),
        )
        for project in Project.objects.filter(is_active=True)
    ]
    return inputs.project_shares(specs, usage=usage)


def project_quota_share(*, project: Project) -> et.ProjectShare:
    """One project's quotas as the engine sees them (no usage: that is what a round adds)."""
    guaranteed: list[tuple[str, int]] = []
    type_borrow: list[tuple[str, int]] = []
    borrow: int | None = 0
    has_unlimited = False
    quotas = Quota.objects.filter(project=project).select_related("gpu_type").order_by("gpu_type__name")
    for quota in quotas:
        guaranteed.append((quota.gpu_type.name, quota.guaranteed_gpus))
        if quota.borrow_limit_gpus is None:
            has_unlimited = True
        else:
            borrow = (borrow or 0) + quota.borrow_limit_gpus
            type_borrow.append((quota.gpu_type.name, quota.borrow_limit_gpus))
    if has_unlimited or not guaranteed:
        borrow = None
    return et.ProjectShare(
        name=project.slug,
        weight=project.fair_share_weight,
        guaranteed=tuple(guaranteed),
        borrow_limit=borrow,
        borrow_limits=tuple(type_borrow),
    )
