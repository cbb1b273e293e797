"""A guard around a kombu Redis-transport failure that otherwise kills the worker on a Redis outage.

When the broker connection drops while the worker holds an unacknowledged message, Celery closes
the connection (``on_connection_error_after_connected``); closing the channel restores the
unacknowledged messages, which builds a new Redis pool from ``channel.connection.client``, which
the close has already set to ``None``.  kombu 5.7 then raises ``AttributeError`` (``'NoneType'
object has no attribute 'hostname'``), which Celery treats as unrecoverable: the worker exits
instead of reconnecting (seen in the fault suite, ``tests/faults``, and reported upstream for
several kombu versions, e.g. celery/kombu#582 and #970).

The guard turns that one state into what it is, a lost broker connection (``redis``'s
``ConnectionError``), which kombu's close path ignores and Celery's consumer answers by
reconnecting.  The messages are not lost: Redis still holds them in the unacked index, and the
visibility timeout redelivers them.  Any other use of ``_connparams`` is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

_original_connparams: Callable[..., dict[str, Any]] = kombu_redis.Channel._connparams  # type: ignore[attr-defined]


def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
    if getattr(self.connection, "client", None) is None:
        raise RedisConnectionError("the broker connection is already closed")
    return _original_connparams(self, asynchronous=asynchronous)


def install() -> None:
    """Install the guard once (idempotent)."""
    if kombu_redis.Channel._connparams is not _connparams:  # type: ignore[attr-defined]
        kombu_redis.Channel._connparams = _connparams  # type: ignore[attr-defined]  # private, not in the stubs
