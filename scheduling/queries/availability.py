"""The availability timeline's statement (`scheduling.selectors.availability_get`) and the
database clock its read-after stamps use."""

from __future__ import annotations

from django.db import connection

from scheduling.prepared import prepared_fetchall

# The availability hot path in one round trip: the capacity row (gpu_id NULL) and, for every
# allocation overlapping the window, the first and last step it touches.  Raw SQL because
# it runs hundreds of times a second; tests compare it with a brute-force count.  Typed
# parameters (numeric epoch, exact) keep one prepared plan per connection.
_AVAILABILITY_SQL = """
WITH gpu_type AS (SELECT id FROM scheduling_gputype WHERE name = %(gpu_type)s),
bookable AS (
    SELECT g.id
      FROM scheduling_gpu g
      JOIN scheduling_node n ON n.id = g.node_id
      JOIN scheduling_cluster c ON c.id = n.cluster_id
     WHERE n.gpu_type_id = (SELECT id FROM gpu_type) AND n.status = 'up' AND c.is_active
       AND (%(cluster)s::text IS NULL OR c.name = %(cluster)s::text)
)
SELECT NULL::bigint, count(*)::int, NULL::int FROM bookable HAVING EXISTS (SELECT 1 FROM gpu_type)
UNION ALL
SELECT a.gpu_id,
       greatest(0, floor((extract(epoch FROM lower(a.period)) - %(t0)s::numeric) / %(step)s::int))::int,
       least(%(last)s::int,
             ceil((extract(epoch FROM upper(a.period)) - %(t0)s::numeric) / %(step)s::int)::int - 1)
  FROM scheduling_allocation a
 WHERE a.gpu_id IN (SELECT id FROM bookable)
   AND a.period && tstzrange(%(start)s, %(end)s, '[)')
   AND NOT (a.state = 'released')
 ORDER BY 1 NULLS FIRST, 2
"""


def availability_rows(params: dict[str, object]) -> list[tuple[int | None, int, int | None]]:
    # Planning this statement cost PostgreSQL more CPU than running it.
    return prepared_fetchall(_AVAILABILITY_SQL, params)


def clock_epoch_s() -> float:
    """PostgreSQL's clock now, in seconds since the epoch (``clock_timestamp``, not the
    transaction's start)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_part('epoch', clock_timestamp())")
        row = cursor.fetchone()
        assert row is not None
        return float(row[0])
