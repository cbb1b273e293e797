"""How to get on a booking's GPUs, per backend (page, API), and the job page's output part.

The booking rows and allocations are real (booking_create places them in PostgreSQL); nothing here
contacts a cluster: what is shown comes from the booking, its GPUs and the cluster's settings.  The
Slurm lines are run for real in tests/scheduling/test_use_and_output_slurm.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.models import Membership
from scheduling.access import booking_access
from scheduling.models import Cluster, GpuType
from scheduling.services import booking_create
from tests.factories import ClusterFactory, GpuTypeFactory, MembershipFactory, NodeFactory, ProjectFactory
from tests.integration import loop
from tests.integration.loop import make_cluster, make_member, set_cluster_settings, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = pytest.mark.django_db


def _lab(backend: str, settings: dict[str, Any] | None = None, *, gpus_per_node: int = 4) -> tuple[Any, ...]:
    gpu_type = GpuType.objects.filter(name="A100").first() or GpuTypeFactory(name="A100")
    cluster = ClusterFactory(backend=backend, settings=settings or {})
    for i in range(2):
        NodeFactory(cluster=cluster, gpu_type=gpu_type, name=f"g{i}", gpu_count=gpus_per_node)
    project = ProjectFactory()
    user = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    return cluster, gpu_type, project, user


def _book(user: Any, project: Any, cluster: Cluster, gpu_type: GpuType, gpus: int) -> Any:
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    return booking_create(
        user,
        project=project,
        gpu_type=gpu_type,
        gpu_count=gpus,
        start_at=start,
        end_at=start + timedelta(hours=2),
        cluster=cluster,
    )


def test_slurm_access_names_the_reservation_and_spans_the_booked_nodes() -> None:
    cluster, gpu_type, project, user = _lab(
        Cluster.Backend.SLURM, {"reservation_prefix": "lab-", "partition": "a100q"}
    )
    first = _book(user, project, cluster, gpu_type, 3)
    one = booking_access(first)
    assert one.reservation == f"lab-booking-{first.pk}"
    [node] = one.nodes
    assert len(one.nodes[node]) == 3
    assert one.commands[0] == (
        f"srun --reservation={one.reservation} --partition=a100q --nodelist={node} --gres=gpu:3 --pty bash"
    )
    wide = booking_access(_book(user, project, cluster, gpu_type, 5))  # 3 GPUs are taken: spans both nodes
    assert sorted(wide.nodes) == ["g0", "g1"]
    assert "--nodes=2 --nodelist=g0,g1" in wide.commands[0]
    assert "--gres=gpu:4" in wide.commands[0]  # Slurm's GRES is per node: the most any node holds


def test_kubernetes_access_gives_the_namespace_and_a_pinned_pod_template() -> None:
    cluster, gpu_type, project, user = _lab(Cluster.Backend.KUBERNETES, {"namespace": "ml-lab"})
    booking = _book(user, project, cluster, gpu_type, 2)
    access = booking_access(booking)
    [node] = access.nodes
    assert access.namespace == "ml-lab"
    assert "namespace: ml-lab\n" in access.template
    assert f"values: [{node}]" in access.template
    assert 'nvidia.com/gpu: "2"' in access.template
    assert f'berth.dev/booking-id: "{booking.pk}"' in access.template
    assert access.commands == (
        "kubectl apply -f pod.yaml",
        f"kubectl exec -it -n ml-lab berth-booking-{booking.pk} -- bash",
    )


def test_access_api_and_page_are_for_those_who_see_the_booking() -> None:
    cluster, gpu_type, project, user = _lab(Cluster.Backend.SLURM)
    booking = _book(user, project, cluster, gpu_type, 2)
    api = APIClient()
    api.force_authenticate(user)
    body = api.get(f"/api/v1/bookings/{booking.pk}/access/").json()
    assert body["booking"] == booking.pk
    assert body["backend"] == "slurm"
    assert body["reservation"] == f"berth-booking-{booking.pk}"
    assert body["commands"][0].startswith(f"srun --reservation=berth-booking-{booking.pk} ")
    page = Client()
    page.force_login(user)
    html = page.get(f"/bookings/{booking.pk}/").content.decode()
    assert body["commands"][0] in html
    stranger = APIClient()
    stranger.force_authenticate(MembershipFactory().user)
    assert stranger.get(f"/api/v1/bookings/{booking.pk}/access/").status_code == 404


def test_job_logs_api_refuses_bad_tails_and_answers_503_when_the_cluster_is_down(
    engine_redis_url: str, run_round: Any, t0: Any
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=600, now=t0)
    api = APIClient()
    api.force_authenticate(user)
    not_yet = api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert (not_yet["stdout"], not_yet["source"]) == ("", "not started yet")
    run_round(cluster, t0)
    for tail in ("0", "2001", "ten"):
        bad = api.get(f"/api/v1/jobs/{job.pk}/logs/", {"tail": tail})
        assert bad.status_code == 400, tail
        assert "tail" in bad.json()["fields"]
    set_cluster_settings(cluster, is_unreachable=True)
    down = api.get(f"/api/v1/jobs/{job.pk}/logs/")
    assert down.status_code == 503
    assert down["Retry-After"] == "30"
    assert "cannot be reached" in down.json()["message"]
    page = Client()
    page.force_login(user)
    html = page.get(f"/jobs/{job.pk}/")
    assert html.status_code == 200
    assert "cannot be reached right now" in html.content.decode()
