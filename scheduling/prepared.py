"""Statements run as prepared statements on Django's connection (the hot paths' SQL).

Planning such a statement can cost PostgreSQL as much CPU as running it, and Django's default
cursor binds parameters client-side, so it never reuses a plan.  These helpers were in
`scheduling.selectors` (which still re-exports them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import connection


def _connection_ready() -> None:
    """Django's connection, health-checked like ``connection.cursor()`` does it.

    ``ensure_connection()`` alone skips the per-request health check (``CONN_HEALTH_CHECKS``):
    a persistent connection that died with a PostgreSQL restart was then used as is, and the
    first request of each web thread whose first query came here (an availability read with a
    cached token) answered 503 after the database was back.
    """
    connection.close_if_health_check_failed()
    connection.ensure_connection()


def prepared_fetchall(sql: str, params: Sequence[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a read-only statement as a prepared statement on Django's connection; all rows.

    For the hot paths' SQL: planning such a statement can cost PostgreSQL as much CPU as
    running it, and Django's default cursor binds parameters client-side, so it never reuses a
    plan.  A server-side-binding psycopg cursor with ``prepare=True`` plans once per connection.
    It runs in Django's current transaction (if any), with Django's error translation, but
    outside Django's query log and execute wrappers: never use it for writes.
    """
    _connection_ready()
    raw = connection.connection
    if raw is None or connection.vendor != "postgresql":  # pragma: no cover - Berth runs on PostgreSQL
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
        cursor.execute(sql, params, prepare=True)
        return list(cursor.fetchall())


def prepared_execute(sql: str, params: Sequence[Any] | dict[str, Any]) -> None:
    """``prepared_fetchall`` for a statement that returns no rows (the availability cache sees
    its writes like any other: PostgreSQL's triggers tell it)."""
    _connection_ready()
    raw = connection.connection
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
        cursor.execute(sql, params, prepare=True)
