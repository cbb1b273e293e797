"""Backups restore to the same data; migrations keep a populated database intact.

Runs the real scripts (scripts/backup.sh, scripts/restore.sh) against the test database filled
by ``manage.py demo_lab`` (committed: pg_dump sees only committed rows, hence transaction=True).
"""

from __future__ import annotations

import os
import subprocess
import time
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

ROOT = Path(__file__).resolve().parents[2]


def _url(dbname: str) -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{dbname}"


def _table_digests(url: str) -> dict[str, tuple[int, str]]:
    """Row count and an order-independent digest of every row of every table in ``public``."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
            )
        ]
        digests = {}
        for table in tables:
            digest_sql = "md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), ''))"
            count, digest = conn.execute(
                f'SELECT count(*), {digest_sql} FROM "{table}" t'  # noqa: S608 (names from the catalog)
            ).fetchone()
            digests[table] = (count, digest)
        return digests


def _drop(dbname: str, *, attempts: int = 5) -> None:
    """Drop a scratch database; robust to a busy server, never silent about a real failure.

    ``WITH (FORCE)`` terminates the database's sessions first, but under load it was refused
    once ("being accessed by other users": a backend still starting, e.g. pg_restore's last
    connection closing): terminate them explicitly and retry with a short backoff.  The last
    attempt's error is raised, so a drop that really cannot happen still fails the test.
    Only client backends are terminated here: an autovacuum worker analysing the freshly
    restored tables advertises no role, so PostgreSQL (before 18) refuses to let a non-superuser
    signal it ("must be a superuser to terminate superuser process", seen under load); the
    drop itself stops autovacuum workers in the database.
    """
    for attempt in range(attempts):
        try:
            with psycopg.connect(_url("postgres"), autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                    [dbname],
                )
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            return
        except psycopg.errors.ObjectInUse:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * 2**attempt)


@pytest.fixture
def demo_data(transactional_db, settings, tmp_path):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command(
        "demo_lab",
        "--traces",
        str(tmp_path),
        "--scale",
        "0.01",
        "--history-days",
        "7",
        "--no-forecasts",
        stdout=StringIO(),
    )


def test_backup_then_restore_into_a_fresh_database_gives_the_same_rows(demo_data, tmp_path):
    source = _url(connection.settings_dict["NAME"])
    restored_name = f"{connection.settings_dict['NAME']}_restore_{os.getpid()}"
    dump = tmp_path / "berth.dump"
    env = {**os.environ, "DATABASE_URL": source}
    _drop(restored_name)
    try:
        backup = subprocess.run(
            ["scripts/backup.sh", str(dump)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert backup.returncode == 0, backup.stderr
        assert dump.stat().st_mode & 0o077 == 0  # not readable by others: it holds password hashes
        restore = subprocess.run(
            ["scripts/restore.sh", str(dump), _url(restored_name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert restore.returncode == 0, restore.stderr

        before, after = _table_digests(source), _table_digests(_url(restored_name))
        assert before == after
        assert before["scheduling_job"][0] > 100  # demo-like: months of history, not an empty shell
        assert before["scheduling_auditevent"][0] > 0
        assert before["authtoken_token"][0] >= 0

        # Never over existing data.
        again = subprocess.run(
            ["scripts/restore.sh", str(dump), _url(restored_name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert again.returncode == 3
        assert "fresh database" in again.stderr
    finally:
        _drop(restored_name)


def test_migrations_are_complete_and_a_no_op_on_a_populated_database(demo_data):
    before = _table_digests(_url(connection.settings_dict["NAME"]))
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
    call_command("migrate", "--noinput", stdout=StringIO())
    assert _table_digests(_url(connection.settings_dict["NAME"])) == before
