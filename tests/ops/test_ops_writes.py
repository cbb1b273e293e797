"""Staff (operations) pages, the writes: quota and policy edits audited, the audit log, what-if
replays to done.  Split from test_ops.py (house rule: files under 600 lines)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from forecasting.services import capacity_study_create, capacity_study_execute
from ops import views
from portal.accounts.models import Project
from scheduling.models import AuditEvent, Cluster, GpuType, Job, Node
from scheduling.snapshots import policy_config_for_cluster
from tests.factories import QuotaFactory, UserFactory
from tests.ops.ops_helpers import csv_rows as _csv_rows
from tests.ops.ops_helpers import ran as _ran

pytestmark = pytest.mark.django_db

# ---- quotas and policy ----


def test_quota_edit_writes_an_audit_event(
    staff_web: Client, staff: User, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    quota = QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2, borrow_limit_gpus=2)
    url = reverse("ops:quota-edit", args=[quota.pk])
    response = staff_web.post(
        url, {f"q{quota.pk}-guaranteed_gpus": 4, f"q{quota.pk}-borrow_limit_gpus": ""}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert "Saved" in response.content.decode()
    quota.refresh_from_db()
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (4, None)
    event = AuditEvent.objects.get(entity_type="quota", entity_id=quota.pk)
    assert event.verb == "quota.update"
    assert event.actor == staff
    assert event.before == {"guaranteed_gpus": 2, "borrow_limit_gpus": 2}
    assert event.after == {"guaranteed_gpus": 4, "borrow_limit_gpus": None}


def test_quota_edit_refusal_is_a_form_error(
    staff_web: Client, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    quota = QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2)
    url = reverse("ops:quota-edit", args=[quota.pk])
    response = staff_web.post(url, {f"q{quota.pk}-guaranteed_gpus": 99}, HTTP_HX_REQUEST="true")
    assert response.status_code == 422
    assert "Only 8 A100 GPUs exist." in response.content.decode()
    response = staff_web.post(url, {f"q{quota.pk}-guaranteed_gpus": -1})
    assert response.status_code == 422
    quota.refresh_from_db()
    assert quota.guaranteed_gpus == 2
    assert not AuditEvent.objects.filter(entity_type="quota").exists()


def test_policy_edit_reaches_the_engine_config_and_is_audited(
    staff_web: Client, cluster: Cluster, nodes: list[Node]
) -> None:
    cluster.settings = {"policy": {"name": "berth", "backfill_depth": 50}, "partition": "gpu"}
    cluster.save()
    url = f"{reverse('ops:policy')}?cluster={cluster.pk}"
    data = {
        "name": "easy",
        "grace_s": 60,
        "min_runtime_s": 600,
        "booking_lead_s": 0,
        "interactive_headroom": "A100:2",
    }
    assert staff_web.post(url, data).status_code == 200
    cluster.refresh_from_db()
    assert cluster.settings["partition"] == "gpu"
    config = policy_config_for_cluster(cluster=cluster)
    assert (config.name, config.grace_s, config.min_runtime_s, config.backfill_depth) == (
        "easy",
        60.0,
        600.0,
        50,
    )
    assert config.interactive_headroom == (("A100", 2),)
    event = AuditEvent.objects.get(verb="cluster.policy_update")
    assert event.before == {"name": "berth"}
    assert event.after["name"] == "easy"
    bad = staff_web.post(url, {**data, "interactive_headroom": "H100:1"})
    assert bad.status_code == 422
    assert "no H100 GPUs" in bad.content.decode()
    bad = staff_web.post(url, {**data, "interactive_headroom": "two"})
    assert bad.status_code == 422
    assert AuditEvent.objects.filter(verb="cluster.policy_update").count() == 1


# ---- audit log ----


def test_audit_log_filters_and_pages(staff_web: Client, staff: User) -> None:
    other = UserFactory(username="root-cause")
    at = datetime(2026, 11, 3, 12, tzinfo=UTC)
    for k in range(60):
        AuditEvent.objects.create(
            actor_label="engine", verb="job.start", entity_type="job", entity_id=k, at=at
        )
    AuditEvent.objects.create(
        actor=other,
        actor_label="user",
        verb="quota.update",
        entity_type="quota",
        entity_id=1,
        at=at - timedelta(days=2),
    )
    page = staff_web.get(reverse("ops:audit")).context["page"]
    assert page.paginator.count == 61
    assert len(page.object_list) == views.AUDIT_PAGE_SIZE == 25
    assert (
        staff_web.get(reverse("ops:audit"), {"page": 2}).context["page"].object_list[0].entity_id is not None
    )
    by_actor = staff_web.get(reverse("ops:audit"), {"actor": "root-cause"}).context["page"]
    assert [e.verb for e in by_actor] == ["quota.update"]
    assert staff_web.get(reverse("ops:audit"), {"verb": "job."}).context["page"].paginator.count == 60
    assert staff_web.get(reverse("ops:audit"), {"entity_type": "quota"}).context["page"].paginator.count == 1
    dated = staff_web.get(reverse("ops:audit"), {"start": "2026-11-01", "end": "2026-11-01"}).context["page"]
    assert [e.verb for e in dated] == ["quota.update"]
    assert staff_web.get(reverse("ops:audit"), {"start": "not a date"}).status_code == 200


# ---- what-if ----


def test_whatif_runs_to_done_with_baseline_and_whatif(
    staff_web: Client, staff: User, cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    base = timezone.now() - timedelta(days=1)
    for k in range(12):  # bursts of 4-GPU jobs: with more GPUs the waits can only shrink
        start = base + timedelta(hours=2 * (k // 8))
        _ran(project, cluster, a100, nodes[k % 2], start, 1, index=(k // 2) % 4, wait_s=0)
        Job.objects.filter(pk=Job.objects.latest("id").pk).update(gpu_count=4, submitted_at=base)
    study = capacity_study_create(
        cluster=cluster, gpu_type="A100", gpu_delta=8, policy="berth", requested_by=staff, enqueue=False
    )
    assert study.status == "queued"
    assert study.current_gpus == 8
    response = staff_web.get(reverse("ops:whatif", args=[study.pk]), HTTP_HX_REQUEST="true")
    assert 'hx-trigger="every 1s"' in response.content.decode()  # still polling
    done = capacity_study_execute(study_id=study.pk)
    assert done.status == "done"
    assert done.progress == 1.0
    assert done.jobs == 12
    assert done.results["baseline"]["gpus"] == 8
    assert done.results["whatif"]["gpus"] == 16
    assert done.results["whatif"]["wait_p95_s"] <= done.results["baseline"]["wait_p95_s"]
    response = staff_web.get(reverse("ops:whatif", args=[study.pk]), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert "every 1s" not in body
    assert 'value="100"' in body
    assert "Wait p95 (min)" in body
    rows = _csv_rows(staff_web.get(reverse("ops:whatif", args=[study.pk]), {"csv": "whatif"}))
    assert rows[2] == ["GPUs", "8", "16"]


def test_whatif_form_errors(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    url = f"{reverse('ops:whatif-new')}?cluster={cluster.pk}"
    response = staff_web.post(
        url,
        {"gpu_type": "A100", "gpu_delta": -8, "policy": "berth", "history_days": 14},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 422
    assert "Keep at least one node" in response.content.decode()
    response = staff_web.post(
        url,
        {"gpu_type": "A100", "gpu_delta": 4, "policy": "magic", "history_days": 14},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 422


def test_whatif_new_queues_the_task_after_commit(
    staff_web: Client,
    cluster: Cluster,
    nodes: list[Node],
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    sent: list[int] = []
    from forecasting import tasks

    monkeypatch.setattr(
        tasks.capacity_study_run, "delay", lambda study_id: sent.append(study_id)
    )  # no worker here
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_web.post(
            f"{reverse('ops:whatif-new')}?cluster={cluster.pk}",
            {"gpu_type": "A100", "gpu_delta": 4, "policy": "easy", "history_days": 7},
            HTTP_HX_REQUEST="true",
        )
    assert response.status_code == 200
    assert len(sent) == 1
    assert f'hx-get="{reverse("ops:whatif", args=[sent[0]])}"' in response.content.decode()
