"""The kombu guard (portal/broker.py): a channel whose connection was closed reports a lost broker
connection, which kombu's close path ignores, instead of an AttributeError that kills the worker.

The whole behaviour (Redis killed under a real worker, rounds resume) is tests/faults; this checks
the guard itself against a real Redis, quickly.
"""

from __future__ import annotations

import os

import pytest
from kombu import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

import portal.celery  # noqa: F401  (installs the guard as the worker does)
from portal import broker


def _broker_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0")


def test_guard_is_installed_by_the_celery_app() -> None:
    from kombu.transport import redis as kombu_redis

    assert kombu_redis.Channel._connparams is broker._connparams
    broker.install()  # idempotent
    assert kombu_redis.Channel._connparams is broker._connparams


def test_open_channel_still_builds_its_pool() -> None:
    with Connection(_broker_url()) as conn:
        channel = conn.default_channel
        params = channel._connparams()
        assert params["host"] == "127.0.0.1"
        channel.client.ping()


def test_closed_connection_is_a_connection_error_and_close_survives_it() -> None:
    conn = Connection(_broker_url())
    channel = conn.default_channel
    channel.client.ping()
    channel._pool = None  # what the outage leaves behind
    channel.connection.client = None
    with pytest.raises(RedisConnectionError):
        channel._connparams()
    # kombu's own close path treats that as a connection error and ignores it.
    assert isinstance(RedisConnectionError(), conn.connection_errors)
