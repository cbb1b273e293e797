"""The engine round's set-wise writes (`scheduling.rounds`): many rows changed by one statement
over arrays (``UNNEST``), the explanation read and write, the cluster's advisory lock.

Tested by the round tests (``tests/scheduling/test_rounds*.py``: the rows each write leaves are
read back through the ORM) and ``tests/scheduling/test_rounds_array_literal.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import connection

from scheduling.models import Allocation, AuditEvent, Job
from scheduling.queries.binary import binary_rows, bound_cursor


def array_literal(values: Iterable[Any]) -> str:
    """``values`` as one PostgreSQL array literal (``'{1,NULL,"a \\"b\\""}'``), sent as a single
    text parameter and cast in the statement (``%s::varchar[]``).

    Django's psycopg cursor binds parameters client-side and quotes a list element by element
    in Python: 9,700 rows of five columns cost ~60 ms of CPU that way and ~20 ms as literals.
    Strings (and `Choices` members) are always quoted, with backslashes and double quotes
    escaped, so no text is ever read as NULL or split; floats are written with ``repr`` (the
    shortest exact form; ``inf``/``nan`` are PostgreSQL's spellings too); datetimes (aware)
    in ISO 8601; booleans as ``t``/``f``.
    """
    parts: list[str] = []
    append = parts.append
    for value in values:
        if value is None:
            append("NULL")
        elif value is True or value is False:
            append("t" if value else "f")
        elif type(value) is int or type(value) is float:
            append(repr(value))
        elif isinstance(value, datetime):
            append('"' + value.isoformat() + '"')
        else:
            text = value if type(value) is str else str(value)
            append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


@contextmanager
def nested_loops_off() -> Iterator[None]:
    """Plan the statements run inside without nested-loop joins (``enable_nestloop`` off for the
    block, then back to what it was; transaction-local, so a rollback restores it too).

    For a join of an ``UNNEST`` of k rows with a filtered scan of n rows (the pending jobs):
    when the filter's row estimate is far too low (a table not analyzed since its jobs were
    submitted: 7-16 pending rows estimated for 9,623) a nested loop that scans one side once
    per row of the other, k x n steps, costs about as little as a hash join on paper.  Forced
    in ``psql``, 1,000 explanations against 9,623 pending jobs took 875 ms that way; in
    ``bench.round`` the explanation UPDATE of a steady round took 3.0-4.5 s with ~2 s of
    PostgreSQL CPU in some rounds and 20-50 ms in the others.  A hash join is O(k + n)
    whatever the estimate.  Outside a transaction this has no effect.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('enable_nestloop'), set_config('enable_nestloop', 'off', true)"
        )
        previous = cursor.fetchone()[0]
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('enable_nestloop', %s, true)", [previous])


def unnest_update(
    table: str,
    *,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
    assign: str,
    where: str = "",
) -> None:
    """``UPDATE table AS t SET <assign> FROM UNNEST(<arrays>) AS v(id, <columns>) WHERE t.id = v.id``.

    ``columns`` are (name, PostgreSQL type) of the values after the id in each row; ``assign``
    and ``where`` are SQL written by the caller (never user input) reading ``t`` and ``v``.
    """
    if not rows:
        return
    arrays = [array_literal(column) for column in zip(*rows, strict=True)]
    casts = ", ".join(["%s::bigint[]", *(f"%s::{kind}[]" for _, kind in columns)])
    names = ", ".join(["id", *(name for name, _ in columns)])
    with bound_cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS t SET {assign} FROM UNNEST({casts}) AS v({names})"  # noqa: S608 (see above)
            f" WHERE t.id = v.id{(' AND ' + where) if where else ''}",
            arrays,
        )


def audit_events_insert(events: Sequence[AuditEvent]) -> None:
    """Insert unsaved audit events in one statement over array literals (their ``pk`` stays None).

    `audit_events_deferred` collects a round's events (a start is one event per GPU): with
    ``bulk_create`` Django binds them as Python lists that psycopg dumps element by element,
    JSON included (a regular-expression pass per string): the ~1,600 events of the full-size
    bench's first round cost 38 ms of CPU that way and 11 ms as literals (1,700 events alone:
    120-137 against 25 ms).  The ``before`` and ``after`` documents are serialized as
    ``JSONField`` does (`json.dumps`, no encoder; None is SQL NULL).
    """
    if not events:
        return
    rows = [
        (
            e.actor_id,
            str(e.actor_label),
            e.verb,
            e.entity_type,
            e.entity_id,
            None if e.before is None else json.dumps(e.before),
            None if e.after is None else json.dumps(e.after),
            e.at,
        )
        for e in events
    ]
    arrays = [array_literal(column) for column in zip(*rows, strict=True)]
    with bound_cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {AuditEvent._meta.db_table}
                   (actor_id, actor_label, verb, entity_type, entity_id, before, after, at)
            SELECT * FROM UNNEST(%s::integer[], %s::varchar[], %s::varchar[], %s::varchar[],
                                 %s::bigint[], %s::jsonb[], %s::jsonb[], %s::timestamptz[])
            """,  # noqa: S608 (the table name is the model's, every value a parameter)
            arrays,
        )


def job_allocations_insert(
    rows: Sequence[tuple[int, int | None, datetime, datetime | None, bool]], *, state: str, at: datetime
) -> list[int]:
    """Insert job allocations (gpu id, job id, period lower, upper or None for unbounded,
    is_preemptible), all in ``state`` and created ``at``, in one statement over array literals;
    returns their ids in the order of ``rows``.  Periods are ``[lower, upper)``.

    What ``bulk_create`` of the round's starts does (the same rows; an exclusion violation
    raises `IntegrityError` the same way), without binding 7 parameters per row that psycopg
    quotes one by one (~3,500 of them for the 500 allocations of a round that starts 250 jobs).
    """
    if not rows:
        return []
    arrays = [array_literal(column) for column in zip(*rows, strict=True)]
    with bound_cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {Allocation._meta.db_table}
                   (gpu_id, booking_id, job_id, period, is_preemptible, state, created_at)
            SELECT v.gpu, NULL, v.job, tstzrange(v.lower, v.upper, '[)'), v.preemptible, %s, %s
              FROM UNNEST(%s::bigint[], %s::bigint[], %s::timestamptz[], %s::timestamptz[], %s::boolean[])
                   WITH ORDINALITY AS v(gpu, job, lower, upper, preemptible, ord)
             ORDER BY v.ord
            RETURNING id
            """,  # noqa: S608 (the table name is the model's, every value a parameter)
            [state, at, *arrays],
        )
        return [row[0] for row in cursor.fetchall()]


def jobs_requeue_write(rows: Sequence[tuple[Any, ...]], *, at: datetime) -> None:
    """Requeue jobs in one statement: ``rows`` are (id, first_submitted_at, attempt,
    pending_sentence, status_message, predicted_p50_s, predicted_p90_s); every one becomes
    pending again, submitted at ``at``."""
    with bound_cursor() as cursor:
        arrays = [array_literal(column) for column in zip(*rows, strict=True)]
        cursor.execute(
            f"""
            UPDATE {Job._meta.db_table} AS t
               SET status = %s, attempt = v.attempt, first_submitted_at = v.first, submitted_at = %s,
                   started_at = NULL, ended_at = NULL, pending_reason = %s, pending_sentence = v.sentence,
                   eta_p50_at = NULL, eta_p90_at = NULL, status_message = v.message,
                   predicted_p50_s = v.p50, predicted_p90_s = v.p90
              FROM UNNEST(%s::bigint[], %s::timestamptz[], %s::integer[], %s::varchar[], %s::varchar[],
                          %s::double precision[], %s::double precision[])
                   AS v(id, first, attempt, sentence, message, p50, p90)
             WHERE t.id = v.id
            """,  # noqa: S608 (the table name is the model's, every value a parameter)
            [Job.Status.PENDING, at, Job.PendingReason.NONE, *arrays],
        )


def pending_explanations_read(*, cluster_id: int) -> list[tuple[int, str, str, float | None, float | None]]:
    """(id, pending_reason, pending_sentence, eta_p50, eta_p90 in epoch s) of the cluster's
    pending jobs.  Plain columns, ETAs as epoch seconds: 2,000 ids in an ``IN (...)`` list, or in
    an array parameter (psycopg dumps lists in Python), and 4,000 timestamps parsed in Python
    were most of the explanation write."""
    return binary_rows(
        f"""
        SELECT id, pending_reason, pending_sentence,
               date_part('epoch', eta_p50_at), date_part('epoch', eta_p90_at)
          FROM {Job._meta.db_table}
         WHERE cluster_id = %s AND status = %s
        """,  # noqa: S608 (the table name is the model's, every value a parameter)
        [cluster_id, str(Job.Status.PENDING)],
    )


def pending_explanations_write(changed: Sequence[tuple[int, str, str, float | None, float | None]]) -> None:
    """Write (id, reason, sentence, eta_p50, eta_p90 in epoch s) on jobs still pending, in one
    statement, as a hash join whatever PostgreSQL estimates for the pending rows
    (`nested_loops_off`)."""
    if not changed:
        return
    columns = list(zip(*changed, strict=True))
    with nested_loops_off(), bound_cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Job._meta.db_table} AS j
               SET pending_reason = v.reason, pending_sentence = v.sentence,
                   eta_p50_at = to_timestamp(v.p50), eta_p90_at = to_timestamp(v.p90)
              FROM UNNEST(%s::bigint[], %s::varchar[], %s::varchar[],
                          %s::float8[], %s::float8[]) AS v(id, reason, sentence, p50, p90)
             WHERE j.id = v.id AND j.status = %s
            """,  # noqa: S608 (the table name is the model's, every value a parameter)
            [array_literal(c) for c in columns] + [Job.Status.PENDING],
        )


def advisory_lock_try(namespace: int, key: int) -> bool:
    """Take the session advisory lock (namespace, key) if free; whether this session holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [namespace, key])
        row = cursor.fetchone()
        return bool(row[0]) if row is not None else False


def advisory_unlock(namespace: int, key: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [namespace, key])
