"""The cluster's nodes and GPU types as the engine sees them."""

from __future__ import annotations

from collections import defaultdict

from scheduling.engine import types as et
from scheduling.models import Cluster, Gpu, GpuType, Node

_NODE_STATUS = {
    Node.Status.UP: et.NodeStatus.UP,
    Node.Status.DRAINING: et.NodeStatus.DRAINING,
    Node.Status.DOWN: et.NodeStatus.DOWN,
}


def engine_nodes_for_cluster(*, cluster: Cluster) -> tuple[et.Node, ...]:
    """The cluster's nodes as the engine sees them; GPU ids in index order."""
    # Two queries of plain values: model instances of every GPU cost seconds on a large cluster.
    gpus: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for node_id, index, gpu_id in Gpu.objects.filter(node__cluster=cluster).values_list(
        "node_id", "index", "id"
    ):
        gpus[node_id].append((index, gpu_id))
    nodes = (
        Node.objects.filter(cluster=cluster)
        .order_by("name")
        .values_list("pk", "name", "gpu_type__name", "status", "domain")
    )
    return tuple(
        et.Node(
            id=name,
            gpu_type=gpu_type,
            gpu_ids=tuple(gpu_id for _, gpu_id in sorted(gpus.get(pk, ()))),
            status=_NODE_STATUS[Node.Status(status)],
            domain=domain,
        )
        for pk, name, gpu_type, status, domain in nodes
    )


def gpu_ids_by_node_name(*, cluster: Cluster) -> dict[str, tuple[int, ...]]:
    """Node name -> Berth GPU ids by index (what the Slurm and Kubernetes backends map to)."""
    return {node.id: node.gpu_ids for node in engine_nodes_for_cluster(cluster=cluster)}


def _engine_gpu_type(gpu_type: GpuType) -> et.GpuType:
    return et.GpuType(
        name=gpu_type.name,
        memory_gib=gpu_type.memory_gib,
        precisions=frozenset(gpu_type.precisions),
        relative_speed=gpu_type.relative_speed,
        value=gpu_type.value,
    )
