"""A real Celery worker (prefork, one process) on a real Redis runs engine rounds against the test database.

The worker is a subprocess of the test with the test database's name, a private broker db and
the private engine Redis db in its environment, so it consumes only this test's tasks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from portal.celery import app
from scheduling.models import Allocation, AuditEvent, Cluster, EngineRound, Job
from scheduling.tasks import engine_round, engine_rounds_dispatch
from tests.integration import loop
from tests.integration.loop import (
    BROKER_REDIS_URL,
    ENGINE_REDIS_URL,
    make_cluster,
    make_member,
    sim_backend,
)

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url

pytestmark = [pytest.mark.celery, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")


def _wait_for(predicate: Callable[[], object], *, timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def worker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """`celery -A portal worker --pool=prefork --concurrency=1` on the test database and a private broker."""
    redis.Redis.from_url(BROKER_REDIS_URL).flushdb()
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": BROKER_REDIS_URL,
        "CELERY_RESULT_BACKEND": BROKER_REDIS_URL,
        "BERTH_ENGINE_REDIS_URL": ENGINE_REDIS_URL,
        "C_FORCE_ROOT": "1",
        "LOG_LEVEL": "WARNING",
    }
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(CELERY),
                "-A",
                "portal",
                "worker",
                "--pool=prefork",
                "--concurrency=1",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--hostname=berth-loop-test@%h",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(
            lambda: b" ready." in log.read_bytes() or proc.poll() is not None, timeout_s=60, what="worker"
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.log_path = log  # type: ignore[attr-defined]
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        redis.Redis.from_url(BROKER_REDIS_URL).flushdb()


def _send(task, *args: object) -> None:
    with app.connection_for_write(BROKER_REDIS_URL) as conn:
        task.apply_async(args=list(args), connection=conn)


def _job_status(job_id: int) -> str:
    connection.close()  # see the worker's commits, not a stale snapshot
    return Job.objects.get(pk=job_id).status


def test_worker_runs_dispatched_engine_rounds(worker, engine_redis_url) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    from scheduling.services import job_submit

    job = job_submit(
        user, project=project, cluster=cluster, name="j", gpu_count=2, payload={"sim_runtime_s": 600}
    )

    _send(engine_rounds_dispatch)  # what beat sends every 15 s

    _wait_for(lambda: _job_status(job.pk) == Job.Status.RUNNING, timeout_s=60, what="the job to run")
    job.refresh_from_db()
    assert job.allocations.filter(state=Allocation.State.ACTIVE).count() == 2
    assert EngineRound.objects.filter(cluster=cluster, error="").count() == 1
    running = sim_backend(cluster).running_on()
    assert sorted(g for g, j in running.items() if j == str(job.pk)) == sorted(
        job.allocations.values_list("gpu_id", flat=True)
    )


@pytest.mark.parametrize("where", ["snapshot", "apply"])
def test_kill_9_mid_round_loses_and_duplicates_nothing(
    worker, engine_redis_url, tmp_path: Path, where: str
) -> None:
    """The worker process dies inside the round: before anything was written (``snapshot``), or after
    the plan committed and before the backend heard of it (``apply``).  acks_late redelivers the task
    and the repeated round repairs the state."""
    marker = tmp_path / f"blocked-in-{where}"
    cluster: Cluster = make_cluster(
        nodes=1,
        gpus_per_node=4,
        settings={"block_in": where, "block_s": 120.0, "block_marker": str(marker)},
    )
    user, project = make_member()
    from scheduling.services import job_submit

    job = job_submit(
        user, project=project, cluster=cluster, name="j", gpu_count=2, payload={"sim_runtime_s": 600}
    )

    _send(engine_round, cluster.pk)
    _wait_for(lambda: marker.exists() and marker.read_text().strip(), timeout_s=60, what="the round to block")
    child_pid = int(marker.read_text())
    # In apply: the plan is committed and the backend has not been told yet.
    assert _job_status(job.pk) == (Job.Status.STARTING if where == "apply" else Job.Status.PENDING)
    assert not sim_backend(cluster).running_on()

    os.kill(child_pid, signal.SIGKILL)

    # acks_late + reject_on_worker_lost: the message is redelivered and the round runs again.
    _wait_for(lambda: _job_status(job.pk) == Job.Status.RUNNING, timeout_s=90, what="the repaired round")
    job.refresh_from_db()
    active = list(job.allocations.filter(state=Allocation.State.ACTIVE))
    released = list(job.allocations.filter(state=Allocation.State.RELEASED))
    assert len(active) == 2  # no duplicated allocation
    # In apply: the unconfirmed first start was rolled back (released), not left half-started.
    assert len(released) == (2 if where == "apply" else 0)
    assert job.attempt == 0
    running = sim_backend(cluster).running_on()
    assert sorted(running) == sorted(a.gpu_id for a in active)  # exactly one run, where the DB says
    assert set(running.values()) == {str(job.pk)}
    rollbacks = AuditEvent.objects.filter(entity_type="job", entity_id=job.pk, verb="job.start_rollback")
    assert rollbacks.count() == (1 if where == "apply" else 0)
    assert worker.poll() is None  # the worker itself survived and replaced its process


def test_a_submit_triggers_a_round_on_the_worker(worker, engine_redis_url, monkeypatch) -> None:
    """job_submit -> (commit) -> engine_round_trigger -> the worker runs a round: no beat needed."""
    from scheduling import tasks
    from scheduling.services import job_submit

    original = tasks.engine_round.apply_async

    def via_test_broker(*args, **kwargs):
        with app.connection_for_write(BROKER_REDIS_URL) as conn:
            return original(*args, connection=conn, **kwargs)

    monkeypatch.setattr(tasks, "engine_round_trigger", loop.REAL_TRIGGER)
    monkeypatch.setattr(tasks.engine_round, "apply_async", via_test_broker)
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()

    job = job_submit(
        user, project=project, cluster=cluster, name="j", gpu_count=1, payload={"sim_runtime_s": 600}
    )

    _wait_for(lambda: _job_status(job.pk) == Job.Status.RUNNING, timeout_s=60, what="the triggered round")
