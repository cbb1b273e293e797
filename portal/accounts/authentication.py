"""API token authentication with a short per-process cache of token -> user.

DRF's ``TokenAuthentication`` reads the token and its user from the database on every
request: on a hot read endpoint (availability) that lookup was the largest single cost of a
request.  ``CachedTokenAuthentication`` keeps what that lookup found for at most
``BERTH_API_TOKEN_CACHE_S`` seconds (0 turns the cache off) in the process's memory.

Revocation bound: deleting a token (``token_revoke``, ``token_create``, the admin) and saving
or deleting its user (deactivation, a staff flag) drops the cached entries of this process at
once and again when the transaction commits; other web processes drop theirs when the entry
expires, so a revoked token or a deactivated user is refused everywhere within
``BERTH_API_TOKEN_CACHE_S`` seconds (5 by default).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from cachetools import TLRUCache
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

# Entries beyond this are evicted least recently used first.
_MAX_ENTRIES = 10_000


def _expires_at(_key: str, value: tuple[float, Any, Token], now: float) -> float:
    return now + value[0]  # each entry keeps the TTL in force when it was cached


_lock = threading.Lock()  # cachetools caches are not thread-safe; gunicorn threads share this one
# key -> (ttl, user, token), expiring on time.monotonic().
_cache: TLRUCache[str, tuple[float, Any, Token]] = TLRUCache(
    maxsize=_MAX_ENTRIES, ttu=_expires_at, timer=lambda: time.monotonic()
)


def token_cache_clear() -> None:
    """Forget every cached token (tests, and a user or token change of unknown extent)."""
    with _lock:
        _cache.clear()


def _forget(*, key: str | None = None, user_id: int | None = None) -> None:
    with _lock:
        if key is not None:
            _cache.pop(key, None)
        if user_id is not None:
            for k in [k for k, (_, user, _) in _cache.items() if user.pk == user_id]:
                _cache.pop(k, None)


class CachedTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``, as DRF's, with the lookup cached (see the module docstring)."""

    def authenticate_credentials(self, key: str) -> tuple[Any, Token]:
        ttl = float(settings.BERTH_API_TOKEN_CACHE_S)
        if ttl <= 0:
            return super().authenticate_credentials(key)
        with _lock:
            hit = _cache.get(key)
        if hit is not None:
            # A copy per request: a view may set attributes on request.user.
            return copy.copy(hit[1]), hit[2]
        user, token = super().authenticate_credentials(key)  # raises for unknown keys / inactive users
        with _lock:
            _cache[key] = (ttl, copy.copy(user), token)
        return user, token


def _token_changed(sender: Any, instance: Token, **kwargs: Any) -> None:
    key = str(instance.key)
    _forget(key=key)
    # Again after the commit: a request that read the old row before it was deleted may have
    # cached it in between.
    transaction.on_commit(lambda: _forget(key=key))


def _user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    user_id = instance.pk
    if user_id is None:
        return
    _forget(user_id=user_id)
    transaction.on_commit(lambda: _forget(user_id=user_id))


def token_cache_connect() -> None:
    """Drop cached entries when a token or a user changes (called once from AccountsConfig.ready)."""
    post_delete.connect(_token_changed, sender=Token, dispatch_uid="berth-token-cache-token")
    post_save.connect(_token_changed, sender=Token, dispatch_uid="berth-token-cache-token-save")
    user_model = get_user_model()
    post_save.connect(_user_changed, sender=user_model, dispatch_uid="berth-token-cache-user")
    post_delete.connect(_user_changed, sender=user_model, dispatch_uid="berth-token-cache-user-del")
