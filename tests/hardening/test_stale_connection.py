"""A raw prepared read (the availability hot path) after PostgreSQL dropped the connection.

Django health-checks a persistent connection before its own cursors use it in a new request
(``CONN_HEALTH_CHECKS``).  ``prepared_fetchall`` bypasses Django's cursors, so it must run the same
check: otherwise the first availability request on each web thread after a PostgreSQL restart is
answered 503 although the database is back (seen in the fault suite, tests/faults).
"""

from __future__ import annotations

import psycopg
import pytest
from django.core.signals import request_started
from django.db import connection

from scheduling.selectors import prepared_fetchall


def _drop_server_side(pid: int) -> None:
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.django_db(transaction=True)
def test_prepared_read_reconnects_when_the_server_dropped_the_connection() -> None:
    assert connection.settings_dict["CONN_HEALTH_CHECKS"]
    assert prepared_fetchall("SELECT 1", []) == [(1,)]
    old_pid = connection.connection.info.backend_pid
    _drop_server_side(old_pid)
    request_started.send(sender=None)  # a new request: Django marks the health check as due
    assert prepared_fetchall("SELECT %s::int", [2]) == [(2,)]
    assert connection.connection.info.backend_pid != old_pid


@pytest.mark.django_db(transaction=True)
def test_health_check_runs_once_per_request_not_per_query() -> None:
    assert prepared_fetchall("SELECT 1", []) == [(1,)]
    request_started.send(sender=None)
    prepared_fetchall("SELECT 1", [])  # health-checked here
    assert connection.health_check_done
    pid = connection.connection.info.backend_pid
    assert prepared_fetchall("SELECT 1", []) == [(1,)]
    assert connection.connection.info.backend_pid == pid
