"""Fixtures and helpers shared by the engine-loop tests (rounds, tasks, metrics, worker faults).

Import the fixtures you use into the test module (``from tests.integration.loop import ...``).
Redis is real (db ``ENGINE_REDIS_DB`` for the simulator state, triggers and metrics, so other
checkouts' runs on db 0 are untouched); PostgreSQL is real.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.utils import timezone

from portal.accounts.models import Membership, Project
from scheduling import tasks
from scheduling.backend_registry import engine_redis, live_sim_key_prefix
from scheduling.backends.live_sim import LiveSimBackend, LiveSimConfig
from scheduling.models import Cluster, GpuType, Job, Node
from scheduling.rounds import RoundResult, engine_round_run
from scheduling.services import job_submit
from scheduling.snapshots import engine_nodes_for_cluster
from tests.factories import ClusterFactory, GpuTypeFactory, MembershipFactory, NodeFactory, ProjectFactory


def _redis_host_url() -> str:
    """The Redis server the settings use (``REDIS_URL``), without its db number."""
    from urllib.parse import urlsplit

    from django.conf import settings

    parts = urlsplit(settings.REDIS_URL)
    return f"{parts.scheme}://{parts.netloc}"


REDIS_HOST_URL = _redis_host_url()
# Two checkouts testing on one Redis server set these to dbs of their own (they clear their keys).
ENGINE_REDIS_DB = int(os.environ.get("BERTH_TEST_ENGINE_REDIS_DB", "7"))
ENGINE_REDIS_URL = f"{REDIS_HOST_URL}/{ENGINE_REDIS_DB}"
# A db of its own: no other worker consumes these tasks.
BROKER_REDIS_URL = f"{REDIS_HOST_URL}/{int(os.environ.get('BERTH_TEST_BROKER_REDIS_DB', '11'))}"


def clear_engine_keys(url: str = ENGINE_REDIS_URL) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match="berth:*", count=500))
    if keys:
        client.delete(*keys)


REAL_TRIGGER = tasks.engine_round_trigger


@pytest.fixture
def engine_redis_url(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the simulator, triggers and metrics at a private Redis db, empty before and after.

    The services' round trigger (after submits, cancels, bookings) becomes a no-op: these tests
    run rounds themselves, and a committed trigger would otherwise send a task to the shared
    broker for some other worker to run.  Tests of the trigger restore `REAL_TRIGGER`.
    """
    settings.BERTH_ENGINE_REDIS_URL = ENGINE_REDIS_URL
    monkeypatch.setattr(tasks, "engine_round_trigger", lambda cluster_id: None)
    clear_engine_keys()
    yield ENGINE_REDIS_URL
    clear_engine_keys()


@pytest.fixture
def t0() -> datetime:
    return timezone.now().replace(microsecond=0)


def make_cluster(
    *, nodes: int = 2, gpus_per_node: int = 4, settings: dict[str, Any] | None = None
) -> Cluster:
    """A simulator cluster of ``nodes`` A100 nodes; policy berth with a short grace and minimum runtime."""
    a100: GpuType = GpuTypeFactory(name="A100", memory_gib=80.0, precisions=["fp64", "tf32", "bf16", "fp16"])
    cluster_settings = {"policy": {"name": "berth", "grace_s": 30.0, "min_runtime_s": 60.0}}
    cluster_settings.update(settings or {})
    cluster = ClusterFactory(backend=Cluster.Backend.SIMULATOR, settings=cluster_settings)
    for i in range(nodes):
        NodeFactory(cluster=cluster, gpu_type=a100, name=f"n{i}", gpu_count=gpus_per_node)
    return cluster


def make_member() -> tuple[User, Project]:
    project = ProjectFactory()
    user = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    return user, project


def submit(
    user: User,
    project: Project,
    cluster: Cluster,
    *,
    gpus: int,
    runtime_s: float,
    now: datetime,
    requested_s: int | None = None,
    **kwargs: Any,
) -> Job:
    """A job whose true simulated runtime is ``runtime_s``."""
    return job_submit(
        user,
        project=project,
        cluster=cluster,
        name=kwargs.pop("name", f"job-{gpus}x{int(runtime_s)}"),
        gpu_count=gpus,
        requested_s=requested_s if requested_s is not None else int(runtime_s * 2),
        payload={"sim_runtime_s": runtime_s},
        now=now,
        **kwargs,
    )


def set_cluster_settings(cluster: Cluster, **changes: Any) -> None:
    cluster.refresh_from_db()
    cluster.settings = {**cluster.settings, **changes}
    cluster.save(update_fields=["settings"])


def sim_backend(cluster: Cluster, *, at: datetime | None = None) -> LiveSimBackend:
    """The simulator as the rounds see it (same Redis keys), for assertions."""
    now = at or timezone.now()
    return LiveSimBackend(
        engine_nodes_for_cluster(cluster=cluster),
        redis=engine_redis(ENGINE_REDIS_URL),
        config=LiveSimConfig.from_mapping(cluster.settings, key_prefix=live_sim_key_prefix(cluster)),
        clock=lambda: now.timestamp(),
    )


RoundRunner = Callable[..., RoundResult]


@pytest.fixture
def run_round(django_capture_on_commit_callbacks: Any) -> RoundRunner:
    """Run one round at ``now`` and execute its after-commit apply (the test wraps a transaction)."""

    def run(cluster: Cluster, now: datetime) -> RoundResult:
        with django_capture_on_commit_callbacks(execute=True):
            return engine_round_run(cluster_id=cluster.pk, now=now)

    return run


def later(at: datetime, seconds: float) -> datetime:
    return at + timedelta(seconds=seconds)


__all__ = [
    "BROKER_REDIS_URL",
    "ENGINE_REDIS_URL",
    "REAL_TRIGGER",
    "Node",
    "clear_engine_keys",
    "engine_redis_url",
    "later",
    "make_cluster",
    "make_member",
    "run_round",
    "set_cluster_settings",
    "sim_backend",
    "submit",
    "t0",
]
