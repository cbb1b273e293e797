"""Booking services against real PostgreSQL: placement, validation, cancel/extend/end-early, audit."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import admission, services
from scheduling.models import Allocation, AuditEvent, Booking
from scheduling.services import (
    BookingConflictError,
    booking_cancel,
    booking_create,
    booking_end_early,
    booking_extend,
    placement,
)
from tests.factories import GpuTypeFactory, NodeFactory, QuotaFactory

pytestmark = pytest.mark.django_db


def _gpu_nodes(booking: Booking) -> set[int]:
    return set(
        booking.allocations.exclude(state=Allocation.State.RELEASED).values_list("gpu__node_id", flat=True)
    )


def test_booking_create_places_on_one_node_when_it_fits(member, project, a100, nodes, soon):
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=3, start_at=soon, end_at=soon + timedelta(hours=2)
    )
    allocations = list(booking.allocations.all())
    assert len(allocations) == 3
    assert len({a.gpu_id for a in allocations}) == 3
    assert len(_gpu_nodes(booking)) == 1
    assert all(a.period.lower == soon and a.period.upper == soon + timedelta(hours=2) for a in allocations)
    assert booking.status == Booking.Status.CONFIRMED


def test_booking_create_best_fit_keeps_the_big_hole(member, project, a100, nodes, soon):
    end = soon + timedelta(hours=1)
    first = booking_create(member, project=project, gpu_type=a100, gpu_count=3, start_at=soon, end_at=end)
    # One GPU is left on the first node, four on the other: a 1-GPU booking must take the single one.
    second = booking_create(member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=end)
    assert _gpu_nodes(second) == _gpu_nodes(first)
    # So a 4-GPU booking still fits on one node.
    third = booking_create(member, project=project, gpu_type=a100, gpu_count=4, start_at=soon, end_at=end)
    assert len(_gpu_nodes(third)) == 1


def test_booking_create_spans_nodes_when_no_single_node_fits(member, project, a100, nodes, soon):
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=6, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    assert booking.allocations.count() == 6
    assert len(_gpu_nodes(booking)) == 2


def test_booking_create_conflict_offers_next_free_window(member, project, a100, nodes, soon):
    end = soon + timedelta(hours=2)
    booking_create(member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=end)
    with pytest.raises(BookingConflictError) as info:
        booking_create(member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=end)
    alternatives = info.value.alternatives
    assert alternatives, "a refused booking must be offered an alternative"
    assert alternatives[0].gpu_type == "A100"
    assert alternatives[0].start_at == end  # the earliest instant the 8-GPU booking frees them
    assert alternatives[0].end_at - alternatives[0].start_at == timedelta(hours=2)
    assert Booking.objects.count() == 1


def test_booking_conflict_offers_another_type_when_free(member, project, a100, nodes, cluster, soon):
    h100 = GpuTypeFactory(name="H100", memory_gib=80.0)
    NodeFactory(cluster=cluster, gpu_type=h100, name="h0", gpu_count=2)
    end = soon + timedelta(hours=1)
    booking_create(member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=end)
    with pytest.raises(BookingConflictError) as info:
        booking_create(member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=end)
    by_type = {a.gpu_type: a for a in info.value.alternatives}
    assert by_type["H100"].start_at == soon


def test_back_to_back_bookings_do_not_clash(member, project, a100, nodes, soon):
    for hour in range(3):
        start = soon + timedelta(hours=hour)
        booking_create(
            member,
            project=project,
            gpu_type=a100,
            gpu_count=8,
            start_at=start,
            end_at=start + timedelta(hours=1),
        )
    assert Allocation.objects.count() == 24


@pytest.mark.parametrize(
    ("start_offset", "length", "field"),
    [
        (timedelta(hours=1), timedelta(hours=-1), "end_at"),  # end before start
        (timedelta(hours=1), timedelta(0), "end_at"),  # empty window
        (timedelta(hours=-2), timedelta(hours=1), "start_at"),  # in the past
        (timedelta(days=800), timedelta(hours=1), "start_at"),  # years ahead
        (timedelta(hours=1), timedelta(days=30), "end_at"),  # longer than the maximum
    ],
)
def test_booking_create_rejects_bad_windows(member, project, a100, nodes, start_offset, length, field):
    start = timezone.now() + start_offset
    with pytest.raises(ValidationError) as info:
        booking_create(
            member, project=project, gpu_type=a100, gpu_count=1, start_at=start, end_at=start + length
        )
    assert field in info.value.message_dict
    assert not Booking.objects.exists()
    assert not Allocation.objects.exists()


@pytest.mark.parametrize("gpu_count", [0, -3, 9, 10_000])
def test_booking_create_rejects_impossible_counts(member, project, a100, nodes, soon, gpu_count):
    with pytest.raises(ValidationError) as info:
        booking_create(
            member,
            project=project,
            gpu_type=a100,
            gpu_count=gpu_count,
            start_at=soon,
            end_at=soon + timedelta(hours=1),
        )
    assert "gpu_count" in info.value.message_dict
    assert not Booking.objects.exists()


def test_booking_create_unknown_type_in_cluster(member, project, nodes, soon):
    v100 = GpuTypeFactory(name="V100")
    with pytest.raises(ValidationError) as info:
        booking_create(
            member,
            project=project,
            gpu_type=v100,
            gpu_count=1,
            start_at=soon,
            end_at=soon + timedelta(hours=1),
        )
    assert "gpu_type" in info.value.message_dict


def test_booking_create_requires_membership(outsider, project, a100, nodes, soon):
    with pytest.raises(PermissionDenied):
        booking_create(
            outsider,
            project=project,
            gpu_type=a100,
            gpu_count=1,
            start_at=soon,
            end_at=soon + timedelta(hours=1),
        )
    assert not Booking.objects.exists()


def test_booking_quota_counts_the_peak_not_the_sum(member, project, a100, nodes, soon):
    QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2, borrow_limit_gpus=1)
    hour = timedelta(hours=1)
    booking_create(member, project=project, gpu_type=a100, gpu_count=3, start_at=soon, end_at=soon + hour)
    # A later, non-overlapping window is fine: the peak stays at 3.
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=3, start_at=soon + hour, end_at=soon + 2 * hour
    )
    with pytest.raises(ValidationError) as info:
        booking_create(
            member, project=project, gpu_type=a100, gpu_count=1, start_at=soon + hour / 2, end_at=soon + hour
        )
    assert "gpu_count" in info.value.message_dict


def test_booking_cancel_before_start_releases_gpus(member, project, a100, nodes, soon):
    end = soon + timedelta(hours=1)
    booking = booking_create(member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=end)
    booking_cancel(booking, user=member)
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CANCELLED
    assert set(booking.allocations.values_list("state", flat=True)) == {Allocation.State.RELEASED}
    # The GPUs are bookable again at once.
    again = booking_create(member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=end)
    assert again.allocations.count() == 8
    with pytest.raises(ValidationError):
        booking_cancel(booking, user=member)


def test_booking_end_early_truncates_and_frees_the_rest(member, project, a100, nodes):
    start = timezone.now()
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=start, end_at=start + timedelta(hours=4)
    )
    later = start + timedelta(hours=1)
    booking_end_early(booking, user=member, now=later)
    booking.refresh_from_db()
    assert booking.status == Booking.Status.COMPLETED
    assert booking.ended_at == later
    for allocation in booking.allocations.all():
        assert allocation.state == Allocation.State.ENDED
        assert allocation.period.lower == start
        assert allocation.period.upper == later
    # From `later` on the GPUs are free.
    other = booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=8,
        start_at=later,
        end_at=later + timedelta(hours=1),
        now=later,
    )
    assert other.allocations.count() == 8


def test_booking_end_early_refuses_a_future_booking(member, project, a100, nodes, soon):
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    with pytest.raises(ValidationError) as info:
        booking_end_early(booking, user=member)
    assert "status" in info.value.message_dict


def test_booking_extend_moves_every_allocation(member, project, a100, nodes, soon):
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    new_end = soon + timedelta(hours=3)
    booking_extend(booking, user=member, end_at=new_end)
    booking.refresh_from_db()
    assert booking.end_at == new_end
    assert {a.period.upper for a in booking.allocations.all()} == {new_end}


def test_booking_extend_conflict_offers_the_latest_free_end(member, project, a100, nodes, soon):
    hour = timedelta(hours=1)
    mine = booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + hour
    )
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=soon + 2 * hour, end_at=soon + 3 * hour
    )
    with pytest.raises(BookingConflictError) as info:
        booking_extend(mine, user=member, end_at=soon + 4 * hour)
    assert info.value.alternatives[0].end_at == soon + 2 * hour
    mine.refresh_from_db()
    assert mine.end_at == soon + hour  # nothing changed
    assert {a.period.upper for a in mine.allocations.all()} == {soon + hour}
    # Extending up to the offered end works.
    booking_extend(mine, user=member, end_at=soon + 2 * hour)


def test_other_members_cannot_cancel_but_managers_can(member, manager, project, a100, nodes, soon):
    from tests.factories import MembershipFactory

    peer = MembershipFactory(project=project).user
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    with pytest.raises(PermissionDenied):
        booking_cancel(booking, user=peer)
    booking_cancel(booking, user=manager)
    assert Booking.objects.get(pk=booking.pk).status == Booking.Status.CANCELLED


def test_every_change_is_audited_with_its_actor(member, project, a100, nodes, soon):
    booking = booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=2,
        start_at=soon,
        end_at=soon + timedelta(hours=1),
        actor_label=AuditEvent.Actor.API,
    )
    booking_extend(booking, user=member, end_at=soon + timedelta(hours=2))
    booking_cancel(booking, user=member)
    booking_events = list(
        AuditEvent.objects.filter(entity_type="booking", entity_id=booking.pk).order_by("id")
    )
    assert [e.verb for e in booking_events] == ["booking.create", "booking.extend", "booking.cancel"]
    assert all(e.actor_id == member.pk for e in booking_events)
    assert booking_events[0].actor_label == AuditEvent.Actor.API
    assert booking_events[2].before["status"] == "confirmed"
    assert booking_events[2].after["status"] == "cancelled"
    allocation_ids = set(booking.allocations.values_list("id", flat=True))
    allocation_verbs = AuditEvent.objects.filter(entity_type="allocation", entity_id__in=allocation_ids)
    # Two GPUs, each created, extended and cancelled.
    assert allocation_verbs.count() == 6


def test_no_overlap_in_database_after_many_bookings(member, project, a100, nodes, soon):
    for i in range(12):
        start = soon + timedelta(minutes=20 * i)
        with contextlib.suppress(BookingConflictError):
            booking_create(
                member,
                project=project,
                gpu_type=a100,
                gpu_count=3,
                start_at=start,
                end_at=start + timedelta(hours=1),
            )
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM scheduling_allocation a JOIN scheduling_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
             WHERE a.state <> 'released' AND b.state <> 'released'
            """
        )
        assert cursor.fetchone()[0] == 0


# ---- placement as a pure function (no database) ----

_free_node_lists = st.lists(
    st.tuples(st.integers(min_value=1, max_value=3), st.integers(min_value=0, max_value=8)),
    min_size=1,
    max_size=8,
)


@given(layout=_free_node_lists, gpu_count=st.integers(min_value=1, max_value=24))
@settings(max_examples=300, deadline=None)
def test_pick_gpus_invariants(layout, gpu_count):
    """Any layout of free GPUs: a pick is exactly ``gpu_count`` distinct free GPUs of one
    cluster, on one node whenever some node could hold them all, and None only when no
    cluster has enough."""
    nodes = []
    next_gpu = 0
    for i, (cluster_id, free) in enumerate(layout):
        ids = tuple(range(next_gpu, next_gpu + free))
        next_gpu += free
        if ids:
            nodes.append(admission.FreeNode(i, f"n{i}", cluster_id, ids))
    pick = placement._pick_gpus(nodes, gpu_count=gpu_count)
    by_cluster: dict[int, int] = {}
    for node in nodes:
        by_cluster[node.cluster_id] = by_cluster.get(node.cluster_id, 0) + len(node.gpu_ids)
    if pick is None:
        assert all(total < gpu_count for total in by_cluster.values())
        return
    gpu_ids, cluster_id = pick
    assert len(gpu_ids) == gpu_count == len(set(gpu_ids))
    owner = {g: n for n in nodes for g in n.gpu_ids}
    assert all(owner[g].cluster_id == cluster_id for g in gpu_ids)
    used_nodes = {owner[g].node_id for g in gpu_ids}
    if any(len(n.gpu_ids) >= gpu_count for n in nodes):
        assert len(used_nodes) == 1


def test_booking_goes_to_the_cluster_where_it_fits_one_node(member, project, a100, nodes, soon):
    # alpha has 2x4 free; a second cluster has one 6-GPU node: 6 GPUs fit on one node only there.
    six = NodeFactory(gpu_type=a100, name="big", gpu_count=6)
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=6, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    assert booking.cluster_id == six.cluster_id
    assert _gpu_nodes(booking) == {six.pk}


def test_booking_create_stores_the_row_and_audit_events_the_orm_would(member, project, a100, nodes, soon):
    """The booking, its allocations and their events are one hand-written INSERT: pin what it stores."""
    end = soon + timedelta(hours=2)
    before = timezone.now()
    booking = booking_create(
        member, project=project, gpu_type=a100, gpu_count=2, start_at=soon, end_at=end, note="n"
    )
    stored = Booking.objects.get(pk=booking.pk)
    assert before <= booking.created_at <= timezone.now()
    assert (stored.created_at, stored.updated_at) == (booking.created_at, booking.updated_at)
    assert stored.user_id == member.pk
    assert stored.project_id == project.pk
    assert stored.gpu_type_id == a100.pk
    assert (stored.gpu_count, stored.start_at, stored.end_at, stored.note) == (2, soon, end, "n")
    assert stored.status == Booking.Status.CONFIRMED
    assert stored.ended_at is None
    assert stored.status_message == ""
    assert not booking._state.adding
    allocations = list(booking.allocations.order_by("id"))
    gpu_ids = [a.gpu_id for a in allocations]
    assert gpu_ids == sorted(gpu_ids)
    assert {a.state for a in allocations} == {Allocation.State.PLANNED}
    events = list(AuditEvent.objects.filter(at__gte=before).order_by("id"))
    assert [(e.verb, e.entity_id) for e in events] == [("booking.create", booking.pk)] + [
        ("allocation.create", a.pk) for a in allocations
    ]
    assert all(e.actor_id == member.pk and e.before is None for e in events)
    assert events[0].after == {
        "status": "confirmed",
        "start_at": soon.isoformat(),
        "end_at": end.isoformat(),
        "ended_at": None,
        "gpu_count": 2,
        "gpu_ids": gpu_ids,
        "cluster_id": stored.cluster_id,
    }
    assert [e.after for e in events[1:]] == [services.allocation_state(a) for a in allocations]
