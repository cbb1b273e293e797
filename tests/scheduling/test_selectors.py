"""Selectors: availability against a brute-force count, alternatives, visibility scopes."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404

from scheduling import selectors
from scheduling.models import Allocation, Gpu, Node
from scheduling.services import booking_create, job_submit
from tests.factories import AllocationFactory, MembershipFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _brute_force_free(gpus: list[int], allocations: list[tuple[int, datetime, datetime | None]], s, e) -> int:
    busy = {g for g, lo, hi in allocations if lo < e and (hi is None or hi > s)}
    return len([g for g in gpus if g not in busy])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_availability_matches_brute_force(nodes, soon, seed):
    rng = random.Random(seed)
    gpus = list(Gpu.objects.values_list("id", flat=True))
    created: list[tuple[int, datetime, datetime | None]] = []
    for gpu in gpus:
        t = soon - timedelta(hours=3)
        for _ in range(rng.randint(0, 4)):
            t += timedelta(minutes=rng.randrange(0, 300, 10))
            end = None if rng.random() < 0.05 else t + timedelta(minutes=rng.randrange(10, 400, 10))
            state = rng.choice([Allocation.State.PLANNED, Allocation.State.ACTIVE, Allocation.State.ENDED])
            AllocationFactory(gpu_id=gpu, period=DateTimeTZRange(t, end, "[)"), state=state)
            created.append((gpu, t, end))
            if end is None:
                break
            t = end
    # Released allocations never count.
    AllocationFactory(
        gpu_id=gpus[0],
        period=DateTimeTZRange(soon, soon + timedelta(hours=50), "[)"),
        state=Allocation.State.RELEASED,
    )
    start, end, step = soon, soon + timedelta(hours=30), 1800
    result = selectors.availability_get(gpu_type_name="A100", start_at=start, end_at=end, step_s=step)
    assert result.capacity == 8
    assert len(result.slots) == 60
    for slot in result.slots:
        assert slot.free_gpus == _brute_force_free(gpus, created, slot.start_at, slot.end_at), slot


def test_availability_ignores_down_nodes_and_other_types(nodes, cluster, soon):
    Node.objects.filter(pk=nodes[1].pk).update(status=Node.Status.DOWN)
    NodeFactory(cluster=cluster, name="h0", gpu_count=8)  # another type
    result = selectors.availability_get(
        gpu_type_name="A100", start_at=soon, end_at=soon + timedelta(hours=2), step_s=3600
    )
    assert result.capacity == 4
    assert [s.free_gpus for s in result.slots] == [4, 4]


def test_availability_per_cluster(member, project, a100, nodes, soon):
    other = NodeFactory(gpu_type=a100, name="b0", gpu_count=2)  # in a second cluster
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=2,
        cluster=other.cluster,
        start_at=soon,
        end_at=soon + timedelta(hours=1),
    )
    window = {"gpu_type_name": "A100", "start_at": soon, "end_at": soon + timedelta(hours=1), "step_s": 3600}
    assert [s.free_gpus for s in selectors.availability_get(**window).slots] == [8]
    only_other = selectors.availability_get(**window, cluster_name=other.cluster.name)
    assert (only_other.capacity, [s.free_gpus for s in only_other.slots]) == (2, [0])
    only_alpha = selectors.availability_get(**window, cluster_name="alpha")
    assert (only_alpha.capacity, [s.free_gpus for s in only_alpha.slots]) == (8, [8])


def test_availability_after_bookings(member, project, a100, nodes, soon):
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=3,
        start_at=soon,
        end_at=soon + timedelta(minutes=90),
    )
    result = selectors.availability_get(
        gpu_type_name="A100", start_at=soon, end_at=soon + timedelta(hours=3), step_s=3600
    )
    # The second hour is still partly held, so only 5 GPUs are free for the whole of it.
    assert [s.free_gpus for s in result.slots] == [5, 5, 8]
    assert result.slots[-1].end_at == soon + timedelta(hours=3)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpu_type_name": "TPUv9"}, "gpu_type"),
        ({"end_delta": timedelta(hours=-1)}, "end"),
        ({"step_s": 1}, "step"),
        ({"end_delta": timedelta(days=3650)}, "step"),  # too many steps
        ({"cluster_name": "nowhere"}, "cluster"),
    ],
)
def test_availability_rejects_bad_queries(nodes, soon, kwargs, field):
    end = soon + kwargs.pop("end_delta", timedelta(hours=2))
    params = {"gpu_type_name": "A100", "start_at": soon, "end_at": end, "step_s": 3600, **kwargs}
    with pytest.raises(ValidationError) as info:
        selectors.availability_get(**params)
    assert field in info.value.message_dict


def test_availability_api(member_client, nodes, soon):
    response = member_client.get(
        "/api/v1/availability/",
        {
            "gpu_type": "A100",
            "start": soon.isoformat(),
            "end": (soon + timedelta(hours=4)).isoformat(),
            "step": 7200,
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert data["capacity"] == 8
    assert [s["free_gpus"] for s in data["slots"]] == [8, 8]
    for params in (
        {"gpu_type": "A100"},
        {"gpu_type": "A100", "start": "soon", "end": "later"},
        {"gpu_type": "A100", "start": soon.isoformat(), "end": soon.isoformat()},
        {"gpu_type": "A100", "start": soon.isoformat(), "end": "2099-01-01T00:00:00Z", "step": 60},
        {
            "gpu_type": "A100",
            "start": soon.isoformat(),
            "end": (soon + timedelta(hours=1)).isoformat(),
            "step": -1,
        },
    ):
        bad = member_client.get("/api/v1/availability/", params)
        assert bad.status_code == 400, (params, bad.content)
        assert bad.json()["fields"]


def test_availability_at_the_end_of_time_does_not_overflow(member_client, nodes):
    response = member_client.get(
        "/api/v1/availability/",
        {"gpu_type": "A100", "start": "9999-12-31T22:30:00Z", "end": "9999-12-31T23:59:59Z", "step": 3600},
    )
    assert response.status_code == 200
    assert response.json()["slots"][-1]["end_at"] == "9999-12-31T23:59:59Z"


def test_alternatives_are_truly_free_and_earliest(member, project, a100, nodes, soon):
    hour = timedelta(hours=1)
    booking_create(member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + 2 * hour)
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=6, start_at=soon + 2 * hour, end_at=soon + 4 * hour
    )
    # 4 GPUs for 2 h: not at 0 h (all taken), not at 2 h (only 2 free); free from 4 h.
    [alternative] = selectors.booking_alternatives(
        gpu_type=a100, gpu_count=4, start_at=soon, end_at=soon + 2 * hour
    )
    assert alternative.start_at == soon + 4 * hour
    # 2 GPUs for 2 h fit at 2 h next to the 6-GPU booking.
    [alternative] = selectors.booking_alternatives(
        gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + 2 * hour
    )
    assert alternative.start_at == soon + 2 * hour
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=2,
        start_at=alternative.start_at,
        end_at=alternative.end_at,
    )


def test_visibility_scopes(member, manager, outsider, staff, project, a100, nodes, soon):
    mine = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    job = job_submit(member, project=project, name="x", gpu_count=1)
    assert list(selectors.booking_list(member)) == [mine]
    assert list(selectors.booking_list(manager)) == [mine]
    assert list(selectors.booking_list(manager, mine_only=True)) == []
    assert list(selectors.booking_list(outsider)) == []
    assert list(selectors.booking_list(staff)) == [mine]
    assert list(selectors.job_list(manager)) == [job]
    peer = MembershipFactory(project=project).user
    assert list(selectors.job_list(peer)) == []
    with pytest.raises(Http404):
        selectors.booking_get(outsider, booking_id=mine.pk)
    with pytest.raises(Http404):
        selectors.job_get(peer, job_id=job.pk)
    with pytest.raises(PermissionDenied):
        selectors.audit_event_list(member)
    assert selectors.audit_event_list(staff).filter(entity_type="booking").count() == 1


def test_peak_concurrent_gpus(member, project, a100, nodes, soon):
    hour = timedelta(hours=1)
    for offset, count in ((0, 2), (1, 3), (2, 1)):
        booking_create(
            member,
            project=project,
            gpu_type=a100,
            gpu_count=count,
            start_at=soon + offset * hour,
            end_at=soon + (offset + 1.5) * hour,
        )
    peak = selectors.peak_concurrent_gpus(
        project=project, gpu_type=a100, start_at=soon, end_at=soon + 5 * hour
    )
    assert peak == 5  # 2+3 during [1 h, 1.5 h), 3+1 during [2 h, 2.5 h)
