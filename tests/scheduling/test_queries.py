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
from django.db.models import Model, Q
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.models import Membership, Project
from scheduling import queries, services
from scheduling.api.bookings import _resolve_refs, booking_data
from scheduling.models import Booking, Cluster, GpuType
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


def test_resolved_refs_are_the_instances_the_orm_loads(refs_data: dict[str, Any]) -> None:
    resolved = _resolve_refs({"project": "vision", "gpu_type": "H100", "cluster": "alpha", "gpu_count": 1})
    assert resolved["gpu_count"] == 1
    for field, model, key in (("project", Project, "vision"), ("gpu_type", GpuType, "H100")):
        lookup = {"slug": key} if model is Project else {"name": key}
        expected = model._default_manager.get(**lookup)
        assert type(resolved[field]) is model
        assert resolved[field] == expected  # same primary key
        assert _fields(resolved[field]) == _fields(expected)
    assert _fields(resolved["cluster"]) == _fields(Cluster.objects.get(name="alpha"))
    assert "cluster" not in _resolve_refs({"project": "vision", "gpu_type": "A100"})


def _fields(instance: Model) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


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
