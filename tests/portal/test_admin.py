"""The Django admin pages for every model render for staff, with filters and search, in bounded queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.urls import reverse

from scheduling.models import Booking, Node
from scheduling.services import booking_create, job_submit
from tests.factories import QuotaFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def filled(member, project, a100, nodes, soon):
    for i in range(5):
        start = soon + timedelta(hours=i)
        booking_create(
            member,
            project=project,
            gpu_type=a100,
            gpu_count=2,
            start_at=start,
            end_at=start + timedelta(hours=1),
        )
        job_submit(member, project=project, name=f"job-{i}", gpu_count=1)
    QuotaFactory(project=project, gpu_type=a100)


def _changelist_urls() -> list[str]:
    return [
        reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for model in admin.site._registry
        if model._meta.app_label in {"scheduling", "accounts"}
    ]


def test_every_changelist_renders_with_search_in_bounded_queries(
    superuser_client, filled, django_assert_max_num_queries
):
    urls = _changelist_urls()
    assert len(urls) == 14  # 10 scheduling models + project, membership, quota, OIDC identity
    for url in urls:
        with django_assert_max_num_queries(25):
            response = superuser_client.get(url, {"q": "vision"})
        assert response.status_code == 200, url


def test_bookings_are_read_only_in_admin(superuser_client, filled):
    booking = Booking.objects.first()
    url = reverse("admin:scheduling_booking_change", args=[booking.pk])
    response = superuser_client.get(url)
    assert response.status_code == 200
    response = superuser_client.post(url, {"status": "cancelled"})
    assert response.status_code == 403
    assert Booking.objects.get(pk=booking.pk).status == Booking.Status.CONFIRMED
    assert superuser_client.get(reverse("admin:scheduling_booking_add")).status_code == 403


def test_researchers_are_kept_out(client, member):
    client.force_login(member)
    response = client.get(reverse("admin:scheduling_booking_changelist"))
    assert response.status_code == 302  # to the admin login


def test_adding_a_node_in_admin_creates_its_gpus(superuser_client, cluster, a100):
    response = superuser_client.post(
        reverse("admin:scheduling_node_add"),
        {
            "cluster": cluster.pk,
            "name": "new",
            "gpu_type": a100.pk,
            "gpu_count": 3,
            "status": "up",
            "domain": "",
            "gpus-TOTAL_FORMS": 0,
            "gpus-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 302, response.content[:2000]
    node = Node.objects.get(name="new")
    assert sorted(node.gpus.values_list("index", flat=True)) == [0, 1, 2]


def test_admin_refuses_to_shrink_below_allocated_gpus(superuser_client, member, project, a100, nodes, soon):
    node = nodes[0]
    booking_create(
        member, project=project, gpu_type=a100, gpu_count=8, start_at=soon, end_at=soon + timedelta(hours=1)
    )
    response = superuser_client.post(
        reverse("admin:scheduling_node_change", args=[node.pk]),
        {
            "cluster": node.cluster_id,
            "name": node.name,
            "gpu_type": a100.pk,
            "gpu_count": 2,
            "status": "up",
            "domain": "",
            "gpus-TOTAL_FORMS": 0,
            "gpus-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert b"cannot be removed" in response.content
    node.refresh_from_db()
    assert node.gpu_count == 4
    assert node.gpus.count() == 4


def test_nodes_added_inline_on_a_cluster_get_their_gpus(superuser_client, a100):
    response = superuser_client.post(
        reverse("admin:scheduling_cluster_add"),
        {
            "name": "beta",
            "backend": "simulator",
            "settings": "{}",
            "is_active": "on",
            "status_message": "",
            "nodes-TOTAL_FORMS": 1,
            "nodes-INITIAL_FORMS": 0,
            "nodes-0-name": "b0",
            "nodes-0-gpu_type": a100.pk,
            "nodes-0-gpu_count": 2,
            "nodes-0-status": "up",
            "nodes-0-domain": "",
        },
    )
    assert response.status_code == 302, response.content[:3000]
    node = Node.objects.get(cluster__name="beta", name="b0")
    assert sorted(node.gpus.values_list("index", flat=True)) == [0, 1]
