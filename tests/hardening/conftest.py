"""Fixtures for the hardening suite."""

from __future__ import annotations


def clear_local_cache() -> None:
    """Empty the cache between tests, but only a local-memory one: on Redis, clear() is FLUSHDB."""
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    backend = caches["default"]
    if isinstance(backend, LocMemCache):
        backend.clear()
