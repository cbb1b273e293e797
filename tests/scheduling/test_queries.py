"""scheduling/queries.py against the ORM on the same data: every row field for field.

Also the booking API's two renderings of a booking against each other: the list (plain values,
`booking list` pages) and the detail (a model instance, `booking_data`), over several bookings,
filters and the edges of a cursor page, so the representations cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Count, Model, Q
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.models import Membership, Project, Quota
from scheduling import queries, services
from scheduling.admission import FreeNode
from scheduling.api.bookings import _resolve_refs, booking_data
from scheduling.models import Allocation, AuditEvent, Booking, Cluster, Gpu, GpuType, Node
from scheduling.services.audit import _booking_state, allocation_state
from tests.factories import ClusterFactory, GpuTypeFactory, MembershipFactory, NodeFactory, ProjectFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/bookings/"


def _orm(model: type[Model], **lookup: Any) -> dict[str, Any]:
    """Every concrete column of one row as the ORM reads it, by attribute name."""
    return model._default_manager.values(*(f.attname for f in model._meta.concrete_fields)).get(**lookup)


def _row(row: Any) -> dict[str, Any]:
    return dataclasses.asdict(row)


@pytest.fixture
def refs_data() -> dict[str, Any]:
    """Several projects, GPU types and clusters (one inactive, one with nested settings)."""
    projects = [
        ProjectFactory(slug="vision", name="Vision", description="eyes", fair_share_weight=2.5),
        ProjectFactory(slug="speech", name="Speech", is_active=False),
    ]
    types = [
        GpuTypeFactory(name="A100", memory_gib=80.0, precisions=["fp64", "bf16"], relative_speed=1.0),
        GpuTypeFactory(name="H100", memory_gib=80.0, precisions=[], relative_speed=2.1, value=3.5),
    ]
    clusters = [
        ClusterFactory(
            name="alpha", settings={"policy": {"name": "berth", "interactive_headroom": [["A100", 1]]}}
        ),
        ClusterFactory(name="beta", is_active=False),
        ClusterFactory(name="gamma", is_degraded=True, status_message="slurmrestd: timeout", settings={}),
    ]
    return {"projects": projects, "types": types, "clusters": clusters}


@pytest.mark.parametrize(
    ("project", "gpu_type", "cluster"),
    [
        ("vision", "A100", None),
        ("speech", "H100", "alpha"),
        ("vision", "H100", "gamma"),
        ("vision", "A100", "beta"),  # inactive: not found
        ("nobody", "A100", "alpha"),
        ("vision", "V100", None),
        ("nobody", "V100", "nowhere"),
        ("Vision", "a100", "ALPHA"),  # names are exact, as the ORM's lookups
    ],
)
def test_booking_refs_are_the_orms_rows(
    refs_data: dict[str, Any], project: str, gpu_type: str, cluster: str | None
) -> None:
    refs = queries.booking_refs_get(project_slug=project, gpu_type_name=gpu_type, cluster_name=cluster)
    orm_project = Project.objects.filter(slug=project).first()
    orm_type = GpuType.objects.filter(name=gpu_type).first()
    orm_cluster = Cluster.objects.filter(name=cluster, is_active=True).first() if cluster else None
    assert (refs.project is None) == (orm_project is None)
    assert (refs.gpu_type is None) == (orm_type is None)
    assert (refs.cluster is None) == (orm_cluster is None)
    if orm_project is not None:
        assert _row(refs.project) == _orm(Project, pk=orm_project.pk)
    if orm_type is not None:
        assert _row(refs.gpu_type) == _orm(GpuType, pk=orm_type.pk)
    if orm_cluster is not None:
        assert _row(refs.cluster) == _orm(Cluster, pk=orm_cluster.pk)


def test_every_model_column_has_a_row_field() -> None:
    for row, model in (
        (queries.ProjectRow, Project),
        (queries.GpuTypeRow, GpuType),
        (queries.ClusterRow, Cluster),
    ):
        assert [f.name for f in dataclasses.fields(row)] == [f.attname for f in model._meta.concrete_fields]


def test_resolved_refs_are_the_rows_and_read_as_the_instances(refs_data: dict[str, Any]) -> None:
    """The API hands the service the rows it read (no model instance built from them); what the
    service reads of each (the `queries.*Ref` protocols) is what it reads of the ORM's instance."""
    resolved = _resolve_refs({"project": "vision", "gpu_type": "H100", "cluster": "alpha", "gpu_count": 1})
    assert resolved["gpu_count"] == 1
    refs = queries.booking_refs_get(project_slug="vision", gpu_type_name="H100", cluster_name="alpha")
    assert (resolved["project"], resolved["gpu_type"], resolved["cluster"]) == (
        refs.project,
        refs.gpu_type,
        refs.cluster,
    )
    for field, protocol, instance in (
        ("project", queries.ProjectRef, Project.objects.get(slug="vision")),
        ("gpu_type", queries.GpuTypeRef, GpuType.objects.get(name="H100")),
        ("cluster", queries.ClusterRef, Cluster.objects.get(name="alpha")),
    ):
        row = resolved[field]
        assert not isinstance(row, Model)
        attributes = [name for name in dir(protocol) if not name.startswith("_")]
        assert attributes  # the protocol names what the services read
        assert {a: getattr(row, a) for a in attributes} == {a: getattr(instance, a) for a in attributes}
    assert "cluster" not in _resolve_refs({"project": "vision", "gpu_type": "A100"})


@pytest.mark.parametrize(
    ("member", "quota"),
    [(True, (2, 3)), (True, (4, None)), (False, (0, 1)), (True, None), (False, None)],
)
def test_member_quota_is_the_orms_row(
    refs_data: dict[str, Any], member: bool, quota: tuple[int, int | None] | None
) -> None:
    vision, speech = refs_data["projects"]
    a100, h100 = refs_data["types"]
    user: User = MembershipFactory(project=vision if member else speech).user
    Quota.objects.create(
        project=vision, gpu_type=h100, guaranteed_gpus=9, borrow_limit_gpus=1
    )  # not this one
    Quota.objects.create(project=speech, gpu_type=a100, guaranteed_gpus=7, borrow_limit_gpus=None)
    if quota is not None:
        Quota.objects.create(
            project=vision, gpu_type=a100, guaranteed_gpus=quota[0], borrow_limit_gpus=quota[1]
        )
    found = queries.member_quota_get(user_id=user.pk, project_id=vision.pk, gpu_type_id=a100.pk)
    assert found.is_member == Membership.objects.filter(user=user, project=vision).exists() == member
    orm = Quota.objects.filter(project=vision, gpu_type=a100).first()
    assert (found.quota is None) == (orm is None) == (quota is None)
    if orm is not None:
        assert found.quota is not None
        assert _row(found.quota) == _orm(Quota, pk=orm.pk)
        assert found.quota.max_gpus == orm.max_gpus
    assert [f.name for f in dataclasses.fields(queries.QuotaRow)] == [
        f.attname for f in Quota._meta.concrete_fields
    ]


@pytest.fixture
def placed(refs_data: dict[str, Any]) -> dict[str, Any]:
    """A100 nodes on two clusters (one node down), some GPUs held by bookings, one released."""
    alpha, _, gamma = refs_data["clusters"]
    a100, h100 = refs_data["types"]
    nodes = [
        NodeFactory(cluster=alpha, gpu_type=a100, name="a1", gpu_count=4),
        NodeFactory(cluster=alpha, gpu_type=a100, name="a2", gpu_count=2),
        NodeFactory(cluster=alpha, gpu_type=a100, name="a3", gpu_count=4, status=Node.Status.DOWN),
        NodeFactory(cluster=gamma, gpu_type=a100, name="g1", gpu_count=8),
        NodeFactory(cluster=alpha, gpu_type=h100, name="h1", gpu_count=8),
    ]
    vision = refs_data["projects"][0]
    user: User = MembershipFactory(project=vision).user
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    kept = services.booking_create(
        user, project=vision, gpu_type=a100, gpu_count=3, start_at=start, end_at=start + timedelta(hours=2)
    )
    gone = services.booking_create(
        user, project=vision, gpu_type=a100, gpu_count=2, start_at=start, end_at=start + timedelta(hours=1)
    )
    services.booking_cancel(gone, user=user)
    return {"nodes": nodes, "start": start, "kept": kept, "a100": a100, "clusters": [alpha.pk, gamma.pk]}


@pytest.mark.parametrize("hours", [(0, 1), (1, 3), (2, 3), (4, 5)])
@pytest.mark.parametrize("which", ["both", "alpha", "gamma"])
def test_free_nodes_are_the_orms_free_gpus(
    placed: dict[str, Any], hours: tuple[int, int], which: str
) -> None:
    clusters = {"both": placed["clusters"], "alpha": placed["clusters"][:1], "gamma": placed["clusters"][1:]}
    cluster_ids = clusters[which]
    start = placed["start"]
    period = DateTimeTZRange(start + timedelta(hours=hours[0]), start + timedelta(hours=hours[1]), "[)")
    a100 = placed["a100"]
    found = queries.free_nodes_get(gpu_type_id=a100.pk, cluster_ids=cluster_ids, period=period)
    held = Allocation.objects.filter(period__overlap=period).exclude(state=Allocation.State.RELEASED)
    free = (
        Gpu.objects.filter(node__gpu_type=a100, node__cluster_id__in=cluster_ids, node__status=Node.Status.UP)
        .exclude(pk__in=held.values("gpu_id"))
        .select_related("node")
        .order_by("node_id", "index")
    )
    expected: dict[int, list[Gpu]] = {}
    for gpu in free:
        expected.setdefault(gpu.node_id, []).append(gpu)
    assert found == [
        FreeNode(
            node_id,
            gpus[0].node.name,
            gpus[0].node.cluster_id,
            tuple(g.pk for g in gpus),
            tuple(g.index for g in gpus),
        )
        for node_id, gpus in expected.items()
    ]
    if hours == (0, 1) and which != "gamma":
        assert (
            sum(len(n.gpu_ids) for n in found if n.cluster_id == placed["clusters"][0]) == 3
        )  # 6 up - 3 held


def test_capacity_and_node_lock_are_the_orms(placed: dict[str, Any]) -> None:
    a100 = placed["a100"]
    ids = placed["clusters"]
    capacity = dict(
        Gpu.objects.filter(node__gpu_type=a100, node__cluster_id__in=ids)
        .values("node__cluster_id")
        .annotate(n=Count("id"))
        .values_list("node__cluster_id", "n")
    )
    assert (
        queries.capacity_by_cluster(gpu_type_id=a100.pk, cluster_ids=ids)
        == capacity
        == {ids[0]: 10, ids[1]: 8}
    )
    assert queries.nodes_lock(gpu_type_id=a100.pk, cluster_ids=ids[:1]) == list(
        Node.objects.filter(gpu_type=a100, cluster_id=ids[0]).order_by("id").values_list("pk", flat=True)
    )


def test_the_audited_insert_writes_what_the_orm_path_records(placed: dict[str, Any]) -> None:
    """The allocations and events of `booking_allocations_insert_audited` are those the ORM's
    writers would record: ``allocation_state`` of each allocation, the booking's event first."""
    booking = placed["kept"]
    allocations = list(Allocation.objects.filter(booking=booking).order_by("gpu_id"))
    assert len(allocations) == 3
    for allocation in allocations:
        assert (allocation.job_id, allocation.is_preemptible, allocation.state) == (None, False, "planned")
        assert (allocation.period.lower, allocation.period.upper) == (booking.start_at, booking.end_at)
    events = list(
        AuditEvent.objects.filter(
            Q(entity_type="booking", entity_id=booking.pk)
            | Q(entity_type="allocation", entity_id__in=[a.pk for a in allocations])
        ).order_by("id")
    )
    assert [(e.verb, e.entity_id) for e in events] == [("booking.create", booking.pk)] + [
        ("allocation.create", a.pk) for a in allocations
    ]
    assert events[0].after == {
        **_booking_state(booking),
        "gpu_ids": [a.gpu_id for a in allocations],
        "cluster_id": booking.cluster_id,
    }
    assert [e.after for e in events[1:]] == [allocation_state(a) for a in allocations]
    assert all(e.actor_id == booking.user_id and e.before is None for e in events)


def test_a_created_booking_answers_what_its_detail_shows(
    placed: dict[str, Any], refs_data: dict[str, Any]
) -> None:
    """The 201 is built from the resolved rows, not read back: it equals the booking's detail,
    with a cluster named and without."""
    client = APIClient()
    client.force_authenticate(placed["kept"].user)
    start = placed["start"] + timedelta(hours=6)
    for cluster in ({"cluster": "gamma"}, {}):
        body = {"project": "vision", "gpu_type": "A100", "gpu_count": 2, "start_at": start.isoformat(),
                "end_at": (start + timedelta(hours=1)).isoformat(), **cluster}  # fmt: skip
        created = client.post(URL, body, format="json")
        assert created.status_code == 201, created.content
        assert created.json() == client.get(f"{URL}{created.json()['id']}/").json()
        assert created.json()["cluster"] == cluster.get("cluster", created.json()["cluster"])


# ---- a booking list row is the booking's detail ----


@pytest.fixture
def booked(refs_data: dict[str, Any]) -> dict[str, Any]:
    """Eleven bookings of two users in two projects, on two types, some cancelled or ended early."""
    alpha: Cluster = refs_data["clusters"][0]
    a100, h100 = refs_data["types"]
    for i, gpu_type in enumerate((a100, a100, h100)):
        NodeFactory(cluster=alpha, gpu_type=gpu_type, name=f"n{i}", gpu_count=4)
    vision = refs_data["projects"][0]
    other = ProjectFactory(slug="robots")
    member: User = MembershipFactory(project=vision, role=Membership.Role.MEMBER).user
    Membership.objects.create(user=member, project=other, role=Membership.Role.MEMBER)
    colleague: User = MembershipFactory(project=vision, role=Membership.Role.MANAGER).user
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=3)
    made = []
    for i in range(11):
        user = member if i % 3 else colleague
        booking = services.booking_create(
            user,
            project=other if i % 4 == 0 and user == member else vision,
            gpu_type=h100 if i % 2 else a100,
            gpu_count=1 + i % 3,
            start_at=start + timedelta(hours=i),
            end_at=start + timedelta(hours=i + 2),
            note=f"run {i}" if i % 2 else "",
        )
        made.append(booking)
    services.booking_cancel(made[2], user=colleague)
    services.booking_cancel(made[5], user=member)
    return {"member": member, "colleague": colleague, "bookings": made}


def _pages(client: APIClient, params: dict[str, Any]) -> list[list[dict[str, Any]]]:
    pages = []
    response = client.get(URL, params)
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append(body["results"])
        if not body.get("next"):
            return pages
        response = client.get(body["next"])


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"mine": "true"},
        {"status": "cancelled"},
        {"status": "confirmed,cancelled", "project": "vision"},
        {"project": "robots"},
        {"project": "nothing-here"},
        {"page_size": 1},
        {"page_size": 4},  # 11 bookings: a short last page
        {"page_size": 11},  # exactly one full page
        {"page_size": 200, "mine": "true"},
    ],
)
@pytest.mark.parametrize("who", ["member", "colleague"])
def test_a_list_row_is_the_bookings_detail(booked: dict[str, Any], params: dict[str, Any], who: str) -> None:
    user: User = booked[who]
    client = APIClient()
    client.force_authenticate(user)
    pages = _pages(client, params)
    rows = [row for page in pages for row in page]
    size = int(params.get("page_size", 50))
    assert all(0 < len(page) <= size for page in pages) or rows == []
    for row in rows:
        booking = Booking.objects.select_related("user", "project", "cluster", "gpu_type").get(pk=row["id"])
        assert row == booking_data(booking)
        assert row == client.get(f"{URL}{row['id']}/").json()
    # The same bookings the ORM finds: your own, and every booking of a project you manage.
    managed = Membership.objects.filter(user=user, role=Membership.Role.MANAGER).values("project_id")
    visible = Booking.objects.filter(Q(user=user) | Q(project_id__in=managed))
    if params.get("mine") == "true":
        visible = Booking.objects.filter(user=user)
    if "status" in params:
        visible = visible.filter(status__in=params["status"].split(","))
    if "project" in params:
        visible = visible.filter(project__slug=params["project"])
    assert [row["id"] for row in rows] == list(visible.order_by("-id").values_list("pk", flat=True))
