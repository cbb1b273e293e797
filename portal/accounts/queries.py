"""Raw SQL of the accounts app where it earns its place: the rate counter's upsert.

``tests/portal/test_accounts_queries.py`` compares what it returns with the row the ORM reads.
"""

from __future__ import annotations

from django.db import connection

from portal.accounts.models import RateCounter

_TABLE = RateCounter._meta.db_table
# One upsert with the Redis script's semantics (INCR, then EXPIRE): a key that expired starts
# again at 1; every hit pushes the expiry out.  The ORM has no INSERT ... ON CONFLICT DO UPDATE
# with an expression, and a read-then-write would race between two requests.
_HIT_SQL = (
    f"INSERT INTO {_TABLE} (key, count, expires_at) "  # noqa: S608 - the model's table, values bound
    "VALUES (%s, 1, now() + %s * interval '1 second') "
    "ON CONFLICT (key) DO UPDATE SET "
    f"count = CASE WHEN {_TABLE}.expires_at <= now() THEN 1 ELSE {_TABLE}.count + 1 END, "
    "expires_at = EXCLUDED.expires_at RETURNING count"
)
# SKIP LOCKED: rows another request holds are left for the next sweep, so concurrent sweeps
# and upserts never wait on each other (no deadlock under load).
_SWEEP_SQL = (
    f"DELETE FROM {_TABLE} WHERE key IN (SELECT key FROM {_TABLE}"  # noqa: S608 - the model's table
    " WHERE expires_at < now() LIMIT 1000 FOR UPDATE SKIP LOCKED)"
)


def rate_counter_hit(key: str, *, window_s: int) -> int:
    """Count one hit of ``key`` (its first 200 characters) in a window of ``window_s`` seconds;
    the count since the window began.  A new window also drops up to 1,000 expired rows, so
    the table stays small."""
    with connection.cursor() as cursor:
        cursor.execute(_HIT_SQL, [key[:200], window_s])
        row = cursor.fetchone()
        assert row is not None  # RETURNING of an upsert always yields the row
        count = int(row[0])
        if count == 1:
            cursor.execute(_SWEEP_SQL)
    return count
