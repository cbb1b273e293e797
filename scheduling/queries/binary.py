"""Statements with their parameters sent apart (`bound_cursor`), and reads of many rows in
PostgreSQL's binary format (`binary_rows`).

Django's PostgreSQL cursor binds parameters client-side: it quotes each into the statement's
text in Python, and reads results only as text (PostgreSQL formats every float, integer and
timestamp as text and psycopg parses it back).  A round reads ~12,000 open jobs of 22 columns
(and their versions every round, the explanations, the running GPUs, the node inventory
twice) and writes its explanations, starts and audit events as a few array parameters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connection
from psycopg import Cursor, pq


@contextmanager
def bound_cursor() -> Iterator[Any]:
    """A cursor on Django's connection (in its transaction, through Django's cursor wrapper:
    database errors become Django's, debug and test query logging see it) that sends the
    parameters apart from the statement (server-side binding; a list is an array parameter).

    Django's own cursor quotes every parameter into the statement's text in Python: a round's
    one-statement writes send ~1 MB of array literals (9,700 explanations, their sentences),
    which cost ~5-10 ms of CPU to escape and are sent as they are here.
    """
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw: Cursor[tuple[Any, ...]] = Cursor(connection.connection)
    # the stubs type the wrappers' argument as a wrapper; Django passes the database cursor
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    with wrap(raw) as cursor:  # type: ignore[arg-type]
        yield cursor


def binary_rows(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (``%s`` placeholders) with ``params``, read in binary format
    (`bound_cursor`).

    The values are the same Python values a text read gives (floats, integers, strings,
    booleans, lists; `tests/scheduling/test_queries_binary.py`); a timestamp column would come
    in the connection's time zone, so the round's reads compute epochs in SQL instead.
    """
    with bound_cursor() as cursor:
        cursor.cursor.format = pq.Format.BINARY
        cursor.execute(sql, params)
        return list(cursor.fetchall())
