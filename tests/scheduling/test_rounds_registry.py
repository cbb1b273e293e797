"""The backend a round uses for a cluster row: kind + settings, GPU ids from the database."""

from __future__ import annotations

import pytest

from scheduling.backend_registry import backend_for_cluster
from scheduling.backends.base import BackendError
from scheduling.backends.k8s import KubernetesBackend
from scheduling.backends.live_sim import LiveSimBackend
from scheduling.backends.slurm import SlurmBackend
from scheduling.models import Cluster, Gpu
from tests.factories import ClusterFactory, GpuTypeFactory, NodeFactory

pytestmark = [pytest.mark.django_db]


def _cluster(backend: str, settings: dict[str, object]) -> Cluster:
    cluster = ClusterFactory(backend=backend, settings=settings)
    a100 = GpuTypeFactory(name="A100")
    for name in ("n2", "n10"):
        NodeFactory(cluster=cluster, gpu_type=a100, name=name, gpu_count=2)
    return cluster


def _gpu_ids(cluster: Cluster) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for gpu in Gpu.objects.filter(node__cluster=cluster).order_by("index").select_related("node"):
        out.setdefault(gpu.node.name, []).append(gpu.pk)
    return {k: tuple(v) for k, v in out.items()}


def test_slurm_cluster_gets_its_settings_and_database_gpu_ids() -> None:
    cluster = _cluster(
        Cluster.Backend.SLURM, {"url": "http://127.0.0.1:1", "partition": "gpu-a", "dry_run": True}
    )
    backend = backend_for_cluster(cluster)
    assert isinstance(backend, SlurmBackend)
    assert backend.config.url == "http://127.0.0.1:1"
    assert backend.config.partition == "gpu-a"
    assert backend.config.dry_run is True
    assert dict(backend.config.gpu_ids or {}) == _gpu_ids(cluster)


def test_kubernetes_cluster_gets_its_settings_and_database_gpu_ids() -> None:
    cluster = _cluster(Cluster.Backend.KUBERNETES, {"host": "http://127.0.0.1:1", "namespace": "lab"})
    backend = backend_for_cluster(cluster)
    assert isinstance(backend, KubernetesBackend)
    assert backend.config.namespace == "lab"
    assert dict(backend.config.gpu_ids) == _gpu_ids(cluster)
    backend.close()


def test_simulator_and_bad_settings(settings) -> None:
    settings.BERTH_SIM_SPEEDUP = 12.0
    sim = backend_for_cluster(_cluster(Cluster.Backend.SIMULATOR, {"fail_rate": 0.5}))
    assert isinstance(sim, LiveSimBackend)
    assert sim.config.speedup == 12.0
    assert sim.config.fail_rate == 0.5
    with pytest.raises(BackendError, match="unusable backend settings"):
        backend_for_cluster(_cluster(Cluster.Backend.SIMULATOR, {"speedup": -1}))
    with pytest.raises(BackendError, match="unusable backend settings"):
        backend_for_cluster(_cluster(Cluster.Backend.SLURM, {"no_such_field": 1, "timeout_s": "soon"}))
