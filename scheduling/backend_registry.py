"""The backend instance for a `Cluster` row: its ``backend`` kind plus its ``settings`` JSON.

``Cluster.settings`` holds connection settings only (never secrets; those come from the
environment through each backend's ``from_env``).  The keys per kind, their types and ranges
are the models in `scheduling.backends.settings` (unknown keys are ignored and logged; a bad
value is a `BackendError`):

* ``simulator`` (`LiveSimBackend`): ``speedup`` (default ``BERTH_SIM_SPEEDUP``), ``fail_rate``,
  ``seed``, ``runtime_fraction_lo``/``_hi``, ``default_runtime_s``, ``retention_s`` and the fault
  switches of `LiveSimConfig` (`SimulatorSettings`).  Its state lives in Redis at
  ``BERTH_ENGINE_REDIS_URL`` under a key per database and cluster.
* ``slurm`` (`SlurmBackend`): ``url``, ``user``, ``partition``, ``job_name_prefix``,
  ``reservation_prefix``, ``default_time_limit_s``, ``dry_run``, ``timeout_s`` over
  `SlurmConfig.from_env` (`SlurmSettings`).
* ``kubernetes`` (`KubernetesBackend`): ``namespace``, ``host``, ``gpu_types``, ``dry_run``,
  ``termination_grace_s``, ``timeout_s``, ``verify_ssl`` over `KubernetesConfig.from_env`
  (`KubernetesSettings`).

GPU ids for Slurm and Kubernetes come from the database (node name -> GPU pks by index), so
the ids the backends report are the ones allocations use.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from scheduling.backends.base import BackendError, ClusterBackend
from scheduling.backends.live_sim import LiveSimBackend, LiveSimConfig
from scheduling.backends.settings import cluster_settings, unknown_keys
from scheduling.models import Cluster
from scheduling.snapshots import engine_nodes_for_cluster, gpu_ids_by_node_name

logger = logging.getLogger(__name__)


@cache
def engine_redis(url: str) -> redis.Redis:
    """One client (connection pool) per URL and process."""
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


@cache
def _warn_once(cluster_name: str, keys: tuple[str, ...]) -> None:
    """Log settings nobody reads once per process and cluster (a round builds its backend every time)."""
    logger.warning("cluster %s: settings no part of Berth reads (ignored): %s", cluster_name, ", ".join(keys))


def live_sim_key_prefix(cluster: Cluster) -> str:
    """Per database and cluster, so test databases and the demo never share simulated state."""
    return f"berth:livesim:{connection.settings_dict['NAME']}:{cluster.pk}"


def backend_for_cluster(cluster: Cluster, *, clock: Callable[[], float] | None = None) -> ClusterBackend:
    """Build the backend for ``cluster``; ``clock`` (epoch seconds) drives the simulator only.

    The settings are checked against the kind's model (`scheduling.backends.settings`). Raises
    `BackendError` when they are unusable, so the caller treats it like an unreachable backend
    (the cluster is marked degraded, nothing else breaks).
    """
    raw: Mapping[str, Any] = cluster.settings or {}
    kind = str(cluster.backend)
    if kind not in {Cluster.Backend.SIMULATOR, Cluster.Backend.SLURM, Cluster.Backend.KUBERNETES}:
        raise BackendError(f"cluster {cluster.name}: unknown backend kind {cluster.backend!r}")
    try:
        if kind == Cluster.Backend.SIMULATOR:
            raw = {"speedup": settings.BERTH_SIM_SPEEDUP, **raw}
        given = cluster_settings(kind, raw)
    except ValueError as exc:
        raise BackendError(f"cluster {cluster.name}: unusable backend settings: {exc}") from exc
    if unread := unknown_keys(kind, raw):
        _warn_once(cluster.name, tuple(unread))
    if kind == Cluster.Backend.SIMULATOR:
        return LiveSimBackend(
            engine_nodes_for_cluster(cluster=cluster),
            redis=engine_redis(settings.BERTH_ENGINE_REDIS_URL),
            config=LiveSimConfig(key_prefix=live_sim_key_prefix(cluster), **given),
            clock=clock or time.time,
        )
    if kind == Cluster.Backend.SLURM:
        from scheduling.backends.slurm import SlurmBackend, SlurmConfig

        return SlurmBackend(
            dataclasses.replace(
                SlurmConfig.from_env(), gpu_ids=gpu_ids_by_node_name(cluster=cluster), **given
            )
        )
    from scheduling.backends.k8s import KubernetesBackend, KubernetesConfig

    return KubernetesBackend(
        dataclasses.replace(
            KubernetesConfig.from_env(), gpu_ids=gpu_ids_by_node_name(cluster=cluster), **given
        )
    )
