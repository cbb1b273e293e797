"""The bench database of `bench.round`: created, migrated and dropped on the server of
``DATABASE_URL``, and the simulator's Redis keys cleared."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def _database_url(base_url: str, name: str) -> str:
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _admin_connect(base_url: str) -> Any:
    """An autocommit connection to the server's ``postgres`` database (CREATE/DROP DATABASE)."""
    import psycopg

    parts = urlsplit(base_url)
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username,
        password=parts.password,
        dbname="postgres",
        autocommit=True,
    )


def database_create(base_url: str, name: str) -> str:
    """Create (after dropping any leftover) the bench database; returns its URL."""
    from psycopg import sql

    if not name.replace("_", "").isalnum():
        raise SystemExit(f"--db-name {name!r}: letters, digits and underscores only")
    with _admin_connect(base_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _database_url(base_url, name)


def database_drop(base_url: str, name: str) -> None:
    from psycopg import sql

    with _admin_connect(base_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def django_setup(database_url: str) -> None:
    """Point Django at the bench database (before any model import) and migrate it."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    # A worker runs without DEBUG: with it, every query goes through Django's debug cursor (its
    # text decoded and kept in ``connection.queries``), which a round of 10,000 rows pays for.
    os.environ.setdefault("DJANGO_DEBUG", "0")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def redis_keys_delete(pattern: str) -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.BERTH_ENGINE_REDIS_URL)
    keys = list(client.scan_iter(match=pattern, count=1_000))
    if keys:
        client.delete(*keys)
