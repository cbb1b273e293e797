"""The engine tasks: thin, idempotent, retried on backend errors; the dispatcher and the debounced trigger.

The broker is replaced by a recorder of ``apply_async`` calls here (sending for real is covered
by tests/integration/test_worker.py); Redis (debounce and queued marks) and PostgreSQL are real.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from scheduling import tasks
from scheduling.backends.base import BackendError
from scheduling.models import Job
from tests.integration import loop
from tests.integration.loop import make_cluster, make_member, set_cluster_settings, submit

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
t0 = loop.t0


@pytest.fixture(autouse=True)
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every test here records sends instead of reaching a broker another worker may consume."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(tasks.engine_round, "apply_async", lambda **kwargs: calls.append(kwargs))
    return calls


def test_engine_round_task_options() -> None:
    task = tasks.engine_round
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True
    assert task.time_limit
    assert task.soft_time_limit
    assert task.soft_time_limit < task.time_limit
    assert BackendError in task.autoretry_for
    assert task.max_retries == 3


@pytest.mark.django_db
def test_engine_round_task_runs_a_round_and_raises_for_retry_when_unreachable(
    engine_redis_url, sent, django_capture_on_commit_callbacks, t0
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=600, now=t0)

    with django_capture_on_commit_callbacks(execute=True):
        out = tasks.engine_round.run(cluster.pk)

    job.refresh_from_db()
    assert out["status"] == "ok"
    assert job.status == Job.Status.RUNNING
    set_cluster_settings(cluster, is_unreachable=True)
    with pytest.raises(BackendError, match="unreachable"):
        tasks.engine_round.run(cluster.pk)
    assert tasks.engine_round.run(10**9) == {"cluster_id": 10**9, "status": "missing"}


@pytest.mark.django_db
def test_dispatch_enqueues_one_round_per_active_cluster_until_it_runs(engine_redis_url, sent) -> None:
    first = make_cluster(nodes=1)
    second = make_cluster(nodes=1)
    inactive = make_cluster(nodes=1)
    inactive.is_active = False
    inactive.save(update_fields=["is_active"])

    assert tasks.engine_rounds_dispatch.run() == [first.pk, second.pk]
    # Beat fires again before the rounds ran: nothing piles up.
    assert tasks.engine_rounds_dispatch.run() == []
    assert [c["args"] for c in sent] == [(first.pk,), (second.pk,)]
    # Once a round starts it clears its mark, and the next beat enqueues it again.
    tasks.engine_round.run(first.pk)
    assert tasks.engine_rounds_dispatch.run() == [first.pk]


@pytest.mark.django_db
def test_trigger_enqueues_after_commit_and_debounces(
    engine_redis_url, sent, django_capture_on_commit_callbacks, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.BERTH_ENGINE_TRIGGER_DEBOUNCE_S = 30.0
    monkeypatch.setattr(tasks, "engine_round_trigger", loop.REAL_TRIGGER)  # the fixture mutes it
    cluster = make_cluster(nodes=1)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        tasks.engine_round_trigger(cluster.pk)
    assert sent == []  # nothing before the commit
    for callback in callbacks:
        callback()
    with django_capture_on_commit_callbacks(execute=True):
        tasks.engine_round_trigger(cluster.pk)  # a burst: joins the round already due
        tasks.engine_round_trigger(cluster.pk)

    assert sent == [{"args": (cluster.pk, True), "countdown": 30.0}]


def test_trigger_never_breaks_the_caller_when_redis_is_down(sent, settings) -> None:
    settings.BERTH_ENGINE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    assert tasks._enqueue_debounced(1) is False
    assert sent == []


@pytest.mark.django_db
def test_triggered_round_that_finds_the_lock_taken_tries_once_more(engine_redis_url, sent, settings) -> None:
    from django.db import connections

    settings.BERTH_ENGINE_TRIGGER_DEBOUNCE_S = 1.0
    cluster = make_cluster(nodes=1)
    other = connections.create_connection("default")  # another worker's session holds the round lock
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [0x4265, cluster.pk])
            assert cursor.fetchone()[0] is True

        assert tasks.engine_round.run(cluster.pk)["status"] == "locked"
        assert sent == []  # a beat round just gives up: the next beat comes in 15 s
        assert tasks.engine_round.run(cluster.pk, True)["status"] == "locked"
        assert sent == [{"args": (cluster.pk,), "countdown": 2.0}]
    finally:
        other.close()  # the session ends: PostgreSQL releases its lock
    _wait_advisory_lock_released(0x4265, cluster.pk)
    assert tasks.engine_round.run(cluster.pk)["status"] == "ok"


def _wait_advisory_lock_released(key1: int, key2: int, *, timeout_s: float = 10.0) -> None:
    """The server releases a closed session's locks when its backend exits, a moment after the
    client hung up (CI once ran the next round while the lock was still held)."""
    from django.db import connection

    deadline = time.monotonic() + timeout_s
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s",
                [key1, key2],
            )
            if cursor.fetchone()[0] == 0:
                return
        assert time.monotonic() < deadline, "the closed session's advisory lock was never released"
        time.sleep(0.05)


def test_a_round_the_engine_wants_before_the_next_beat_is_scheduled(sent, settings) -> None:
    settings.BERTH_ENGINE_ROUND_INTERVAL_S = 15
    now = time.time()
    tasks._schedule_wake(3, now + 5)  # e.g. a booking's reclaim signal is due in 5 s
    tasks._schedule_wake(4, now + 60)  # the beat comes first
    tasks._schedule_wake(5, now - 1)  # due now: the round that just ran handled it
    tasks._schedule_wake(6, None)
    assert [c["args"] for c in sent] == [(3,)]
    assert 3.5 < sent[0]["countdown"] <= 5


@pytest.mark.django_db
def test_the_task_holds_the_collector_paused_around_the_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collection a round leaves runs after `engine_round_run` has returned, not at its
    exit (where the first allocation after the round re-enabled the collector started it)."""
    import gc

    from scheduling.rounds import RoundResult

    cluster = make_cluster(nodes=1)
    seen: list[bool] = []

    def round_run(*, cluster_id: int) -> RoundResult:
        seen.append(gc.isenabled())
        return RoundResult(cluster_id=cluster_id)

    monkeypatch.setattr(tasks, "engine_round_run", round_run)
    assert gc.isenabled()
    assert tasks.engine_round.run(cluster.pk)["cluster_id"] == cluster.pk
    assert seen == [False]
    assert gc.isenabled()
