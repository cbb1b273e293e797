"""A persistent connection that died (PostgreSQL restarted) is replaced at the next request,
also when that request's first query is a prepared hot-path read (``selectors.prepared_fetchall``).

The fault suite saw it: after the PostgreSQL restart, an availability GET with a cached token
answered 503 "database is unreachable" because ``ensure_connection()`` skipped Django's
per-request health check.  Real PostgreSQL: the backend is terminated with pg_terminate_backend.
"""

from __future__ import annotations

import psycopg
import pytest
from django.core.signals import request_started
from django.db import connection

from scheduling.selectors import prepared_execute, prepared_fetchall

pytestmark = pytest.mark.django_db(transaction=True)


def _kill_django_backend() -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"],
        dbname=s["NAME"],
        autocommit=True,
    ) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0] is True


@pytest.mark.parametrize("run", [prepared_fetchall, prepared_execute])
def test_a_dead_persistent_connection_is_replaced_at_the_next_request(run):
    assert connection.settings_dict["CONN_HEALTH_CHECKS"] is True
    max_age = connection.settings_dict["CONN_MAX_AGE"]
    connection.settings_dict["CONN_MAX_AGE"] = 60  # persistent, as in production
    try:
        _kill_django_backend()
        request_started.send(sender=None)  # a new request: Django's per-request connection upkeep
        result = run("SELECT 1", [])
        if run is prepared_fetchall:
            assert result == [(1,)]
        assert connection.connection.info.backend_pid  # a new, live backend
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = max_age
