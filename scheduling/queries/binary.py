"""Reads of many rows in PostgreSQL's binary format (`binary_rows`).

Django's PostgreSQL cursor binds parameters client-side, and a client-side cursor reads results
only as text: PostgreSQL formats every float, integer and timestamp as text and psycopg parses
it back.  A round reads ~12,000 open jobs of 22 columns (and their versions every round, the
explanations, the running GPUs); in binary, psycopg's C loaders take the values as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from psycopg import Cursor, pq


def binary_rows(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (``%s`` placeholders) with ``params``, read in binary format.

    The statement runs on Django's connection, in its transaction, through Django's cursor
    wrapper (database errors become Django's, debug and test query logging sees it), on a
    server-binding psycopg cursor: the parameters travel apart from the statement (a list is
    an array parameter).  The values are the same Python values a text read gives (floats,
    integers, strings, booleans, lists; `tests/scheduling/test_queries_binary.py`); a
    timestamp column would come in the connection's time zone, so the round's reads compute
    epochs in SQL instead.
    """
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw: Cursor[tuple[Any, ...]] = Cursor(connection.connection)
    raw.format = pq.Format.BINARY
    # the stubs type the wrappers' argument as a wrapper; Django passes the database cursor
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    cursor = wrap(raw)  # type: ignore[arg-type]
    with cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
