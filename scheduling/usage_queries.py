"""Decayed fair-share usage per project, summed by PostgreSQL (one row per project, not per run).

`scheduling.snapshots.project_shares` reads every run of the last five half-lives (5,000
finished jobs and the running ones in the demo lab; 7,000 rows at 1,000 nodes) and folds them in
Python (`inputs.project_usage`): about half of the demo's snapshot build.  The decayed usage of
a run has a closed form, so the sum can be taken where the rows are:

    usage(p) = sum over runs of p of  gpus x value x (2^-(now-end)/h - 2^-(now-start)/h) x h / ln 2 / 3600

with ``end`` = ``now`` for work still running (`inputs.decayed_gpu_hours`, the integral of
``decay_usage``; `inputs.UsageLedger` folds the same terms run by run).  The values agree with
`inputs.project_usage` to rounding (the terms are added in another order: relative differences
of ~1e-15; `tests/scheduling/test_rounds_usage_query.py`).  PostgreSQL raises on an underflowing
``power``, so exponents are capped at 1,074 half-lives (2^-1074 is the smallest double; Python
rounds what lies beyond to 0 or that value).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from portal.accounts.models import Project
from scheduling.models import GpuType, Job

# %(now_s)s / %(h)s: the round's instant (epoch s) and the half-life (s).  The filter is
# `snapshots._USAGE_SQL`'s: started before now, ended after the window's start or not at all.
# A run with no GPU type, or a type of value 0, counts its GPUs at value 1 (``value or 1.0``).
_DECAYED_USAGE_SQL = f"""
    SELECT p.slug,
           sum(j.gpu_count * COALESCE(NULLIF(t.value, 0), 1.0)::float8 * (
                 CASE WHEN j.ended_at IS NULL OR j.ended_at > %(now)s THEN 1.0::float8
                      ELSE power(0.5::float8, LEAST(GREATEST(
                           %(now_s)s - date_part('epoch', j.ended_at), 0.0) / %(h)s, 1074.0))
                 END
               - power(0.5::float8, LEAST(GREATEST(
                           %(now_s)s - date_part('epoch', j.started_at), 0.0) / %(h)s, 1074.0))))
      FROM {Job._meta.db_table} j
      JOIN {Project._meta.db_table} p ON p.id = j.project_id
      LEFT JOIN {GpuType._meta.db_table} t ON t.id = j.gpu_type_id
     WHERE j.cluster_id = %(cluster)s AND j.started_at IS NOT NULL AND j.started_at < %(now)s
       AND (j.ended_at IS NULL OR j.ended_at > %(window)s)
       AND (j.ended_at IS NULL OR j.ended_at > %(now)s OR j.ended_at > j.started_at)
     GROUP BY p.slug
"""  # noqa: S608 (table names from the models; values are parameters)

_HOUR_S = 3_600.0


def decayed_project_usage(*, cluster_id: int, now: datetime, half_life_s: float) -> dict[str, float]:
    """Decayed value-weighted GPU-hours per project on the cluster at ``now``: what
    ``inputs.project_usage`` returns for the rows of `snapshots._USAGE_SQL` (runs that ended
    more than five half-lives ago are not read), in one aggregate query.

    A project without runs in the window is absent (the shares count it as 0).  With a
    half-life of 0 or less nothing is remembered: every project's usage is 0.
    """
    if half_life_s <= 0:
        return {}
    params: dict[str, Any] = {
        "cluster": cluster_id,
        "now": now,
        "now_s": now.timestamp(),
        "h": float(half_life_s),
        "window": now - timedelta(seconds=half_life_s * 5),
    }
    with connection.cursor() as cursor:
        cursor.execute(_DECAYED_USAGE_SQL, params)
        rows = cursor.fetchall()
    scale = half_life_s / math.log(2.0) / _HOUR_S
    return {slug: float(total) * scale for slug, total in rows}
