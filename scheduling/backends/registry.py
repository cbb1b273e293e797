"""The backend instance for a `Cluster` row: its ``backend`` kind plus its ``settings`` JSON.

``Cluster.settings`` holds connection settings only (never secrets; those come from the
environment through each backend's ``from_env``).  Keys per kind:

* ``simulator`` (`LiveSimBackend`): ``speedup`` (default ``BERTH_SIM_SPEEDUP``), ``fail_rate``,
  ``seed``, ``runtime_fraction_lo``/``_hi``, ``default_runtime_s``, ``retention_s`` and the fault
  switches of `LiveSimConfig`.  Its state lives in Redis at ``BERTH_ENGINE_REDIS_URL`` under a key
  per database and cluster.
* ``slurm`` (`SlurmBackend`): ``url``, ``user``, ``partition``, ``job_name_prefix``,
  ``reservation_prefix``, ``default_time_limit_s``, ``dry_run`` over `SlurmConfig.from_env`.
* ``kubernetes`` (`KubernetesBackend`): ``namespace``, ``host``, ``gpu_types``, ``dry_run``,
  ``termination_grace_s`` over `KubernetesConfig.from_env`.

GPU ids for Slurm and Kubernetes come from the database (node name -> GPU pks by index), so
the ids the backends report are the ones allocations use.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from scheduling.backends.base import BackendError, ClusterBackend
from scheduling.backends.live_sim import LiveSimBackend, LiveSimConfig
from scheduling.models import Cluster
from scheduling.snapshots import engine_nodes_for_cluster, gpu_ids_by_node_name

_SLURM_KEYS = (
    "url",
    "user",
    "partition",
    "job_name_prefix",
    "reservation_prefix",
    "default_time_limit_s",
    "dry_run",
    "timeout_s",
)
_K8S_KEYS = ("namespace", "host", "gpu_types", "dry_run", "termination_grace_s", "timeout_s", "verify_ssl")


@cache
def engine_redis(url: str) -> redis.Redis:
    """One client (connection pool) per URL and process."""
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def live_sim_key_prefix(cluster: Cluster) -> str:
    """Per database and cluster, so test databases and the demo never share simulated state."""
    return f"berth:livesim:{connection.settings_dict['NAME']}:{cluster.pk}"


def _overrides(raw: Mapping[str, Any], keys: tuple[str, ...], base: object) -> dict[str, Any]:
    """The settings among ``keys``, checked against the type of ``base``'s value (ValueError if wrong)."""
    out: dict[str, Any] = {}
    for key in keys:
        if key not in raw:
            continue
        value, default = raw[key], getattr(base, key)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
        elif isinstance(default, int | float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            value = type(default)(value)
        elif isinstance(default, Mapping):
            if not isinstance(value, Mapping):
                raise ValueError(f"{key} must be a mapping")
            value = dict(value)
        elif (default is None or isinstance(default, str)) and not (value is None or isinstance(value, str)):
            raise ValueError(f"{key} must be a string")
        out[key] = value
    return out


def backend_for_cluster(cluster: Cluster, *, clock: Callable[[], float] | None = None) -> ClusterBackend:
    """Build the backend for ``cluster``; ``clock`` (epoch seconds) drives the simulator only.

    Raises `BackendError` when the settings are unusable, so the caller treats it like an
    unreachable backend (the cluster is marked degraded, nothing else breaks).
    """
    raw: Mapping[str, Any] = cluster.settings or {}
    try:
        if cluster.backend == Cluster.Backend.SIMULATOR:
            config = LiveSimConfig.from_mapping(
                {"speedup": settings.BERTH_SIM_SPEEDUP, **raw}, key_prefix=live_sim_key_prefix(cluster)
            )
            return LiveSimBackend(
                engine_nodes_for_cluster(cluster=cluster),
                redis=engine_redis(settings.BERTH_ENGINE_REDIS_URL),
                config=config,
                clock=clock or time.time,
            )
        if cluster.backend == Cluster.Backend.SLURM:
            from scheduling.backends.slurm import SlurmBackend, SlurmConfig

            slurm_base = SlurmConfig.from_env()
            slurm_config = dataclasses.replace(
                slurm_base,
                gpu_ids=gpu_ids_by_node_name(cluster=cluster),
                **_overrides(raw, _SLURM_KEYS, slurm_base),
            )
            return SlurmBackend(slurm_config)
        if cluster.backend == Cluster.Backend.KUBERNETES:
            from scheduling.backends.k8s import KubernetesBackend, KubernetesConfig

            k8s_base = KubernetesConfig.from_env()
            k8s_config = dataclasses.replace(
                k8s_base,
                gpu_ids=gpu_ids_by_node_name(cluster=cluster),
                **_overrides(raw, _K8S_KEYS, k8s_base),
            )
            return KubernetesBackend(k8s_config)
    except (TypeError, ValueError) as exc:
        raise BackendError(f"cluster {cluster.name}: unusable backend settings: {exc}") from exc
    raise BackendError(f"cluster {cluster.name}: unknown backend kind {cluster.backend!r}")
