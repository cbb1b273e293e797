"""Inventory: nodes and their GPU rows."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from scheduling.models import (
    Cluster,
    Gpu,
    GpuType,
    Node,
)


def node_gpus_sync(node: Node) -> tuple[int, int]:
    """Make the node's ``Gpu`` rows match ``gpu_count`` (indexes ``0 .. gpu_count-1``).

    Adds missing GPUs and deletes surplus ones that were never allocated.  Refuses (field
    error on ``gpu_count``) to drop a GPU with allocation history: that history must stay.
    Returns ``(added, removed)``.
    """
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        surplus = Gpu.objects.filter(node=node, index__gte=node.gpu_count)
        if surplus.filter(allocations__isnull=False).exists():
            raise ValidationError(
                {"gpu_count": "GPUs above this count have allocations (history or future); keep them."}
            )
        removed, _ = surplus.delete()
        have = set(Gpu.objects.filter(node=node).values_list("index", flat=True))
        added = Gpu.objects.bulk_create(
            Gpu(node=node, index=i) for i in range(node.gpu_count) if i not in have
        )
        return len(added), removed


def node_create(
    *,
    cluster: Cluster,
    name: str,
    gpu_type: GpuType,
    gpu_count: int,
    status: str = Node.Status.UP,
    domain: str = "",
) -> Node:
    """Add a node and its GPU rows (the GPUs are what bookings and jobs are placed on)."""
    if gpu_count < 1:
        raise ValidationError({"gpu_count": "A node has at least one GPU."})
    if status not in Node.Status.values:
        raise ValidationError({"status": f"Unknown status {status!r}."})
    with transaction.atomic():
        if Node.objects.filter(cluster=cluster, name=name).exists():
            raise ValidationError({"name": f"{cluster.name} already has a node {name!r}."})
        node = Node.objects.create(
            cluster=cluster, name=name, gpu_type=gpu_type, gpu_count=gpu_count, status=status, domain=domain
        )
        node_gpus_sync(node)
        return node
