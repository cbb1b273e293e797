"""The cluster's nodes and GPU types as the engine sees them."""

from __future__ import annotations

from scheduling import queries
from scheduling.engine import types as et
from scheduling.models import Cluster, GpuType, Node

_NODE_STATUS = {
    Node.Status.UP: et.NodeStatus.UP,
    Node.Status.DRAINING: et.NodeStatus.DRAINING,
    Node.Status.DOWN: et.NodeStatus.DOWN,
}


def engine_nodes_for_cluster(*, cluster: Cluster) -> tuple[et.Node, ...]:
    """The cluster's nodes as the engine sees them, by name; GPU ids in index order."""
    # Plain values in one statement: model instances of every GPU cost seconds on a large cluster.
    return tuple(
        et.Node(
            id=name,
            gpu_type=gpu_type,
            gpu_ids=tuple(gpu_ids),
            status=_NODE_STATUS[Node.Status(status)],
            domain=domain,
        )
        for name, gpu_type, status, domain, gpu_ids in queries.cluster_nodes_read(cluster_id=cluster.pk)
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
