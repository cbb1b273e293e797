"""Inventory services: a node's GPU rows follow its GPU count, never dropping allocation history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from scheduling.models import Gpu, Node
from scheduling.services import booking_create, node_create, node_gpus_sync

pytestmark = pytest.mark.django_db


def _indexes(node: Node) -> list[int]:
    return list(Gpu.objects.filter(node=node).order_by("index").values_list("index", flat=True))


def test_node_create_makes_bookable_gpus(member, project, cluster, a100, soon):
    node = node_create(cluster=cluster, name="fresh", gpu_type=a100, gpu_count=4)
    assert _indexes(node) == [0, 1, 2, 3]
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=4, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    assert booking.allocations.count() == 4
    with pytest.raises(ValidationError) as info:
        node_create(cluster=cluster, name="fresh", gpu_type=a100, gpu_count=2)
    assert "name" in info.value.message_dict


def test_resize_adds_and_removes_unused_gpus(cluster, a100):
    node = node_create(cluster=cluster, name="n", gpu_type=a100, gpu_count=2)
    Node.objects.filter(pk=node.pk).update(gpu_count=5)
    assert node_gpus_sync(node) == (3, 0)
    assert _indexes(node) == [0, 1, 2, 3, 4]
    Node.objects.filter(pk=node.pk).update(gpu_count=3)
    assert node_gpus_sync(node) == (0, 2)
    assert _indexes(node) == [0, 1, 2]
    assert node_gpus_sync(node) == (0, 0)  # idempotent


def test_resize_never_drops_gpus_with_history(member, project, cluster, a100, soon):
    node = node_create(cluster=cluster, name="n", gpu_type=a100, gpu_count=2)
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    Node.objects.filter(pk=node.pk).update(gpu_count=1)
    with pytest.raises(ValidationError) as info:
        node_gpus_sync(node)
    assert "gpu_count" in info.value.message_dict
    assert _indexes(node) == [0, 1]
