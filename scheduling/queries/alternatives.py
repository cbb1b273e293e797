"""The alternatives search of a refused booking (`scheduling.alternatives`): two statements."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection

from scheduling.models import Allocation, Cluster, Gpu, GpuType, Node
from scheduling.prepared import prepared_fetchall

# part, gpu id, then type id, type name, cluster name (part 0) or lower, upper in epoch s (parts 1, 2)
SearchRow = tuple[int, int, Any, Any, Any, float | None, float | None]
AllocationSpan = tuple[int, float | None, float | None]  # gpu id, lower and upper (epoch s)


# One statement, one round trip (a refused booking is what an attacker loops on, and at load
# every round trip waits for a core): the bookable GPUs of every type with at least the
# requested memory, grouped by (type, cluster), only groups with ``gpu_count`` GPUs at all;
# then the blocking allocations of those GPUs in two parts, what overlaps the requested start
# (the GiST index) and what starts after it in start order, at most ``limit`` rows (the
# ``allocation_lower_blocking`` index, so PostgreSQL reads at most the rows returned instead of
# sorting the whole horizon).  Bounds as epoch seconds via ``date_part`` (the float directly;
# ``extract`` computes a numeric first, and parsing timestamps in Python was most of the cost).
_SEARCH_SQL = f"""
WITH candidates AS MATERIALIZED (
    SELECT g.id, t.id AS type_id, t.name AS type_name, c.name AS cluster_name,
           count(*) OVER (PARTITION BY t.id, c.id) AS group_size
      FROM {Gpu._meta.db_table} g
      JOIN {Node._meta.db_table} n ON n.id = g.node_id
      JOIN {Cluster._meta.db_table} c ON c.id = n.cluster_id
      JOIN {GpuType._meta.db_table} t ON t.id = n.gpu_type_id
     WHERE (t.id = %(type)s OR t.memory_gib >= %(memory)s) AND n.status = %(up)s AND c.is_active
       AND (%(clusters)s::bigint[] IS NULL OR c.id = ANY(%(clusters)s::bigint[]))
), eligible AS MATERIALIZED (
    SELECT id FROM candidates WHERE group_size >= %(count)s
)
SELECT 0, id, type_id, type_name, cluster_name, NULL::float8, NULL::float8
  FROM candidates WHERE group_size >= %(count)s
UNION ALL
SELECT 1, a.gpu_id, NULL, NULL, NULL, date_part('epoch', lower(a.period)), date_part('epoch', upper(a.period))
  FROM {Allocation._meta.db_table} a
 WHERE a.gpu_id = ANY(ARRAY(SELECT id FROM eligible)) AND a.state <> 'released'
   AND a.period && tstzrange(%(start)s, %(start)s, '[]') AND lower(a.period) < %(start)s
UNION ALL
(SELECT 2, a.gpu_id, NULL, NULL, NULL,
        date_part('epoch', lower(a.period)), date_part('epoch', upper(a.period))
   FROM {Allocation._meta.db_table} a
  WHERE a.gpu_id = ANY(ARRAY(SELECT id FROM eligible)) AND a.state <> 'released'
    AND lower(a.period) >= %(start)s AND lower(a.period) < %(until)s
  ORDER BY lower(a.period) LIMIT %(limit)s)
"""  # noqa: S608 (table names from the models; values are parameters)


def alternatives_search_rows(params: dict[str, Any]) -> list[SearchRow]:
    """`_SEARCH_SQL` (its parameters by name): ``(part, gpu id, type id, type name, cluster name,
    lower, upper)``; part 0 the candidate GPUs, 1 the allocations over the start, 2 the first
    ``limit`` starting after it."""
    return prepared_fetchall(_SEARCH_SQL, params)


_LATER_SQL = f"""
    SELECT gpu_id, date_part('epoch', lower(period)), date_part('epoch', upper(period))
      FROM {Allocation._meta.db_table}
     WHERE gpu_id = ANY(%s::bigint[]) AND state <> 'released'
       AND lower(period) >= to_timestamp(%s) - interval '1 microsecond' AND lower(period) < %s
     ORDER BY lower(period) LIMIT %s
"""  # noqa: S608 (the table name is the model's; values are parameters)


def alternatives_later_rows(
    *, gpu_ids: list[int], after_s: float, until: datetime, limit: int
) -> list[AllocationSpan]:
    """The next ``limit + 1`` blocking allocations of ``gpu_ids`` starting at or after ``after_s``
    (from a microsecond before: an epoch float's round trip must not lose a row; a row read
    twice is the same busy interval twice, which the sweep ignores)."""
    with connection.cursor() as cursor:
        cursor.execute(_LATER_SQL, [gpu_ids, after_s, until, limit + 1])
        return list(cursor.fetchall())
