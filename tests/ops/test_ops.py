"""Staff (operations) pages: access, the numbers behind the charts, CSV = table, writes audited,
what-if replay to done, query-count bounds."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ops import selectors
from ops.selectors import Range
from portal.accounts.models import Project, Quota
from scheduling.models import Allocation, AuditEvent, Cluster, EngineRound, GpuType, Job, Node
from tests.factories import JobFactory, ProjectFactory, QuotaFactory
from tests.ops.ops_helpers import DAY, PAGES
from tests.ops.ops_helpers import csv_rows as _csv_rows
from tests.ops.ops_helpers import day_range as _day_range
from tests.ops.ops_helpers import ran as _ran

pytestmark = pytest.mark.django_db

# ---- access ----


@pytest.mark.parametrize(("name", "kwargs"), PAGES)
def test_pages_are_staff_only(
    client: Client, member: User, staff: User, nodes: list[Node], name: str, kwargs: dict[str, Any]
) -> None:
    url = reverse(name, kwargs=kwargs)
    anonymous = client.get(url)
    assert anonymous.status_code == 302
    assert "/login/" in anonymous["Location"]
    client.force_login(member)
    assert client.get(url).status_code == 403
    client.force_login(staff)
    assert client.get(url).status_code == 200


def test_writes_are_staff_only(
    client: Client, member: User, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    quota = QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2)
    client.force_login(member)
    response = client.post(reverse("ops:quota-edit", args=[quota.pk]), {f"q{quota.pk}-guaranteed_gpus": 0})
    assert response.status_code == 403
    assert client.post(reverse("ops:policy"), {"name": "fifo"}).status_code == 403
    assert client.post(reverse("ops:whatif-new"), {"gpu_type": "A100"}).status_code == 403
    assert client.post(reverse("ops:quota-new"), {"new-project": project.pk}).status_code == 403
    weight = {f"p{project.pk}-fair_share_weight": 9}
    assert client.post(reverse("ops:project-weight", args=[project.pk]), weight).status_code == 403
    project.refresh_from_db()
    assert project.fair_share_weight == 1.0
    quota.refresh_from_db()
    assert quota.guaranteed_gpus == 2
    assert not AuditEvent.objects.filter(entity_type="quota").exists()


# ---- utilization ----


def test_utilization_counts_busy_gpu_hours_by_type_project_and_node(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    vision, nlp = ProjectFactory(slug="vision"), ProjectFactory(slug="nlp")
    # 02:30-04:30 on one GPU of a0 (splits over three hours), 03:00-04:00 on two GPUs of a1.
    _ran(vision, cluster, a100, nodes[0], DAY + timedelta(hours=2, minutes=30), 2)
    _ran(nlp, cluster, a100, nodes[1], DAY + timedelta(hours=3), 1, index=0)
    _ran(nlp, cluster, a100, nodes[1], DAY + timedelta(hours=3), 1, index=1)
    by_type, by_project, heat = selectors.utilization_get(
        cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(days=2)
    )
    rows = {r[0]: r for r in by_type.rows}
    assert by_type.headers == ("Period", "A100", "Utilization %")
    assert rows["2026-11-02 02:00"][1] == 0.5
    assert rows["2026-11-02 03:00"][1] == 3.0
    assert rows["2026-11-02 03:00"][2] == pytest.approx(37.5)
    assert rows["2026-11-02 04:00"][1] == 0.5
    assert sum(r[1] or 0 for r in by_type.rows) == pytest.approx(4.0)  # None ("–"): before any work
    project_totals = {
        h: sum(r[i] or 0 for r in by_project.rows) for i, h in enumerate(by_project.headers) if i
    }
    assert project_totals == {"nlp": pytest.approx(2.0), "vision": pytest.approx(2.0)}
    heat_rows = {r[0]: r for r in heat.rows}
    three = heat.headers.index("2026-11-02 03:00")
    assert heat_rows["a0"][three] == 0.25
    assert heat_rows["a1"][three] == 0.5


def test_heatmap_goes_daily_beyond_a_week_of_hours(
    cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    _ran(project, cluster, a100, nodes[0], DAY + timedelta(hours=6), 12)
    rng = Range(start_at=DAY - timedelta(days=9), end_at=DAY + timedelta(days=1), bucket="hour")
    by_type, _, heat = selectors.utilization_get(cluster_id=cluster.pk, rng=rng, now=DAY + timedelta(days=2))
    assert len(by_type.rows) == 240
    # Days, starting at the first busy day (nothing to colour before the history).
    assert heat.headers[1:] == ("2026-11-02",)
    assert dict(zip(heat.headers, heat.rows[0], strict=True))["2026-11-02"] == pytest.approx(
        round(12 / 96, 2)
    )


def test_utilization_ignores_released_and_the_future(
    cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    job = _ran(project, cluster, a100, nodes[0], DAY + timedelta(hours=1), 1)
    Allocation.objects.filter(job=job).update(state=Allocation.State.RELEASED)
    # Running from 22:00 with no known end: counted up to "now" (23:00) only.
    _ran(project, cluster, a100, nodes[0], DAY + timedelta(hours=22), 5, index=1)
    by_type = selectors.utilization_get(
        cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(hours=23)
    )[0]
    assert sum(r[1] or 0 for r in by_type.rows) == pytest.approx(1.0)


def test_utilization_csv_matches_the_table(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    _ran(project, cluster, a100, nodes[0], timezone.now() - timedelta(hours=5), 2)
    page = staff_web.get(reverse("ops:utilization"), {"cluster": cluster.pk, "days": 1, "bucket": "hour"})
    tables = {t.name: t for t in page.context["tables"]}
    for name in ("utilization-by-type", "utilization-by-project", "node-heatmap"):
        response = staff_web.get(
            reverse("ops:utilization"), {"cluster": cluster.pk, "days": 1, "bucket": "hour", "csv": name}
        )
        rows = _csv_rows(response)
        assert rows[0] == list(tables[name].headers)
        assert rows[1:] == [["" if v is None else str(v) for v in row] for row in tables[name].rows]
    # The page prints the same numbers: the busy hours appear in the HTML table.
    assert sum(r[1] or 0 for r in tables["utilization-by-type"].rows) == pytest.approx(2.0)
    assert 'id="table-utilization-by-type"' in page.content.decode()
    assert 'id="chart-utilization-by-type" type="application/json"' in page.content.decode()
    assert staff_web.get(reverse("ops:utilization"), {"csv": "nope"}).status_code == 404


def test_hourly_is_limited_to_a_week(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    response = staff_web.get(
        reverse("ops:utilization"), {"cluster": cluster.pk, "days": 30, "bucket": "hour"}
    )
    assert response.context["rng"].bucket == "day"
    assert len(response.context["tables"][0].rows) == 30
    assert "hourly covers up to 7 days" in response.content.decode()
    response = staff_web.get(reverse("ops:utilization"), {"cluster": cluster.pk, "days": 7, "bucket": "hour"})
    assert len(response.context["tables"][0].rows) == 7 * 24


def test_range_page_renders_the_partial_for_htmx(staff_web: Client, nodes: list[Node]) -> None:
    response = staff_web.get(reverse("ops:fairness"), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="ops-report"')
    assert "HX-Request" in response["Vary"]


# ---- fairness ----


def test_fairness_weights_by_gpu_value_and_compares_with_entitlement(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    h100 = GpuType.objects.create(name="H100", value=3.0)
    fast = Node.objects.create(cluster=cluster, name="h0", gpu_type=h100, gpu_count=1)
    fast.gpus.create(index=0)
    vision = ProjectFactory(slug="vision", fair_share_weight=1.0)
    nlp = ProjectFactory(slug="nlp", fair_share_weight=3.0)
    QuotaFactory(project=nlp, gpu_type=a100, guaranteed_gpus=3)
    QuotaFactory(project=vision, gpu_type=a100, guaranteed_gpus=1)
    # One hour each: vision on an A100 (value 1), nlp on the H100 (value 3) -> 25% / 75%.
    _ran(vision, cluster, a100, nodes[0], DAY + timedelta(hours=5), 1, wait_s=120)
    _ran(nlp, cluster, h100, fast, DAY + timedelta(hours=5), 1, kind="interactive", wait_s=60)
    summary, shares, jain, waits = selectors.fairness_get(
        cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(days=1)
    )
    by_slug = {r[0]: r for r in summary.rows}
    assert by_slug["vision"][2] == 25.0
    assert by_slug["nlp"][2] == 75.0
    assert by_slug["vision"][3] == 25.0
    assert by_slug["nlp"][3] == 75.0
    assert by_slug["vision"][4] == 25.0
    assert by_slug["nlp"][4] == 75.0
    share_at = {r[0]: r[1:] for r in shares.rows}
    assert share_at["2026-11-02 05:00"] == (75.0, 25.0)  # nlp, vision
    assert share_at["2026-11-02 06:00"] == (None, None)  # nothing ran: no shares
    jain_at = dict(jain.rows)
    assert jain_at["2026-11-02 05:00"] == pytest.approx(1.0)  # everyone exactly at entitlement
    assert jain_at["2026-11-02 06:00"] is None
    wait_rows = {r[0]: r for r in waits.rows}
    assert wait_rows["vision / batch"][1:] == (1, 2.0, 2.0)
    assert wait_rows["nlp / interactive"][1:] == (1, 1.0, 1.0)


def test_jain_drops_when_one_project_takes_everything(
    cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    vision, nlp = ProjectFactory(slug="vision"), ProjectFactory(slug="nlp")
    _ran(vision, cluster, a100, nodes[0], DAY + timedelta(hours=1), 1)
    _ran(vision, cluster, a100, nodes[0], DAY + timedelta(hours=2), 1, index=1)
    _ran(nlp, cluster, a100, nodes[1], DAY + timedelta(hours=2), 1, index=0)
    _ran(nlp, cluster, a100, nodes[1], DAY + timedelta(hours=2), 1, index=1)
    _ran(nlp, cluster, a100, nodes[1], DAY + timedelta(hours=2), 1, index=2)
    _, _, jain, _ = selectors.fairness_get(
        cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(days=1)
    )
    at = dict(jain.rows)
    assert at["2026-11-02 01:00"] == pytest.approx(1.0)  # one project alone: index of one value
    assert at["2026-11-02 02:00"] == pytest.approx(
        (0.5 + 1.5) ** 2 / (2 * (0.25 + 2.25))
    )  # 1:3 for equal weights


# ---- idle reasons ----


def _round(cluster: Cluster, at: datetime, idle: dict[str, int]) -> EngineRound:
    return EngineRound.objects.create(cluster=cluster, started_at=at, decisions={"idle": idle})


def test_idle_hours_reconstructed_from_rounds(cluster: Cluster, nodes: list[Node]) -> None:
    t = DAY + timedelta(hours=4)
    _round(cluster, t, {"no_demand": 6})
    _round(cluster, t + timedelta(minutes=2), {"no_demand": 4, "fragmentation": 2})
    # The last round holds for at most 5 minutes (a stopped loop must not paint hours of idleness).
    EngineRound.objects.create(cluster=cluster, started_at=t + timedelta(minutes=3), error="backend down")
    table = selectors.idle_get(cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(days=1))
    row = dict(zip(table.headers, next(r for r in table.rows if r[0] == "2026-11-02 04:00"), strict=True))
    assert row["no_demand"] == pytest.approx(round(6 * 2 / 60 + 4 * 5 / 60, 2))
    assert row["fragmentation"] == pytest.approx(round(2 * 5 / 60, 2))
    assert sum(r[1] or 0 for r in table.rows) == pytest.approx(row["no_demand"])


def test_idle_drill_lists_free_gpus_and_pending_jobs(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    at = now - timedelta(hours=2, minutes=-10)
    _round(cluster, at, {"fragmentation": 7})
    _ran(project, cluster, a100, nodes[0], at - timedelta(minutes=30), 1)  # GPU a0:0 busy then
    JobFactory(
        project=project,
        cluster=cluster,
        name="waiting",
        gpu_count=8,
        submitted_at=at - timedelta(minutes=5),
        pending_reason="fragmentation",
    )
    JobFactory(project=project, cluster=cluster, name="later", submitted_at=at + timedelta(minutes=5))
    period = (now - timedelta(hours=2)).strftime("%Y-%m-%d %H:00")
    response = staff_web.get(
        reverse("ops:idle-drill"),
        {"cluster": cluster.pk, "days": 1, "bucket": "hour", "period": period},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    drill = response.context["drill"]
    assert drill.idle == {"fragmentation": 7}
    # This round stored counts per reason only: the free GPUs are grouped by node, reason unknown.
    groups = {r[0]: r for r in drill.gpus.rows}
    assert groups["a0"][3:] == ("not recorded", 3, "1-3")  # a0:0 was busy then
    assert groups["a1"][3:] == ("not recorded", 4, "0-3")
    assert [r[1] for r in drill.jobs.rows] == ["waiting"]
    rows = _csv_rows(
        staff_web.get(
            reverse("ops:idle-drill"),
            {"cluster": cluster.pk, "days": 1, "bucket": "hour", "period": period, "csv": "idle-jobs"},
        )
    )
    assert rows[1][1] == "waiting"
    assert rows[1][5] == "fragmentation"
    assert staff_web.get(reverse("ops:idle-drill"), {"period": "yesterday"}).status_code == 404


# ---- query counts ----


@pytest.mark.parametrize("name", ["ops:utilization", "ops:fairness", "ops:idle", "ops:audit", "ops:quotas"])
def test_aggregate_pages_have_bounded_queries(
    staff_web: Client,
    django_assert_max_num_queries: Any,
    cluster: Cluster,
    nodes: list[Node],
    a100: GpuType,
    name: str,
) -> None:
    start = timezone.now() - timedelta(days=2)
    for k in range(12):
        project = ProjectFactory()
        QuotaFactory(project=project, gpu_type=a100)
        _ran(project, cluster, a100, nodes[k % 2], start + timedelta(hours=3 * k), 2, index=k % 4)
        _round(cluster, start + timedelta(hours=k), {"no_demand": k})
        AuditEvent.objects.create(
            actor_label="engine", verb="job.start", entity_type="job", entity_id=k, at=start
        )
    with django_assert_max_num_queries(14):
        response = staff_web.get(reverse(name), {"cluster": cluster.pk, "days": 7, "bucket": "hour"})
    assert response.status_code == 200


# ---- bad input never produces a 500 ----


def test_pages_without_any_cluster(staff_web: Client) -> None:
    for name in ("ops:utilization", "ops:fairness", "ops:idle", "ops:capacity", "ops:quotas", "ops:audit"):
        assert staff_web.get(reverse(name)).status_code == 200, name
    assert staff_web.get(reverse("ops:policy")).status_code == 404


@pytest.mark.parametrize(
    "params",
    [
        {"cluster": "abc", "days": "x", "bucket": "minute"},
        {"cluster": "999999"},
        {"days": "-3"},
        {"csv": ""},
    ],
)
def test_bad_range_parameters_fall_back(
    staff_web: Client, cluster: Cluster, nodes: list[Node], params: dict[str, str]
) -> None:
    for name in ("ops:utilization", "ops:fairness", "ops:idle"):
        response = staff_web.get(reverse(name), params)
        assert response.status_code == 200, (name, params)
        assert response.context["rng"].bucket == "day"


def test_whatif_unknown_type_and_cluster(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    data = {"gpu_type": "H100", "gpu_delta": 4, "policy": "berth", "history_days": 14}
    response = staff_web.post(f"{reverse('ops:whatif-new')}?cluster={cluster.pk}", data)
    assert response.status_code == 422
    response = staff_web.post(f"{reverse('ops:whatif-new')}?cluster=999999", {**data, "gpu_type": "A100"})
    assert response.status_code == 422
    assert "Choose a cluster" in response.content.decode()
    # Policy writes never fall back to another cluster either.
    response = staff_web.post(
        f"{reverse('ops:policy')}?cluster=999999", {"name": "fifo", "grace_s": 1, "min_runtime_s": 1}
    )
    assert response.status_code == 404
    cluster.refresh_from_db()
    assert "policy" not in cluster.settings
    assert staff_web.get(reverse("ops:whatif", args=["nope"])).status_code == 404


def test_quota_create_and_weight_edit_are_audited(
    staff_web: Client, staff: User, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    data = {
        "new-project": project.pk,
        "new-gpu_type": a100.pk,
        "new-guaranteed_gpus": 3,
        "new-borrow_limit_gpus": "",
    }
    response = staff_web.post(reverse("ops:quota-new"), data, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("ops:quotas")
    quota = Quota.objects.get(project=project, gpu_type=a100)
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (3, None)
    assert AuditEvent.objects.get(verb="quota.create").entity_id == quota.pk
    again = staff_web.post(reverse("ops:quota-new"), data, HTTP_HX_REQUEST="true")
    assert again.status_code == 422
    assert "already has a quota" in again.content.decode()
    assert AuditEvent.objects.filter(verb="quota.create").count() == 1

    url = reverse("ops:project-weight", args=[project.pk])
    response = staff_web.post(url, {f"p{project.pk}-fair_share_weight": 2.5}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    project.refresh_from_db()
    assert project.fair_share_weight == 2.5
    event = AuditEvent.objects.get(verb="project.weight_update")
    assert (event.before, event.after, event.actor) == (
        {"fair_share_weight": 1.0},
        {"fair_share_weight": 2.5},
        staff,
    )
    bad = staff_web.post(url, {f"p{project.pk}-fair_share_weight": 0}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 422
    project.refresh_from_db()
    assert project.fair_share_weight == 2.5


def test_capacity_exceed_without_history(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    params = {"cluster": cluster.pk, "horizon_days": 7}
    # The fits run on a worker (issue 14): the button POSTs a run, the worker's half runs here.
    from forecasting.models import CapacityExceedRun
    from forecasting.services import capacity_exceed_run_execute

    staff_web.post(f"{reverse('ops:capacity-exceed')}?cluster={cluster.pk}", {"horizon_days": 7})
    capacity_exceed_run_execute(run_id=CapacityExceedRun.objects.get(cluster=cluster).pk)
    fragment = staff_web.get(reverse("ops:capacity-exceed"), params, HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="capacity-exceed"')
    assert "not within the horizon" in body
    page = staff_web.get(reverse("ops:capacity-exceed"), params)
    assert "<h1>Capacity planning</h1>" in page.content.decode()
    rows = _csv_rows(staff_web.get(reverse("ops:capacity-exceed"), {**params, "csv": "capacity-exceed"}))
    assert rows[1][:2] == ["A100", "8"]


def test_idle_round_just_before_the_range_counts_inside_it(cluster: Cluster, nodes: list[Node]) -> None:
    _round(cluster, DAY - timedelta(minutes=2), {"down": 3})
    _round(cluster, DAY + timedelta(minutes=1), {})
    table = selectors.idle_get(cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(days=1))
    first = dict(zip(table.headers, table.rows[0], strict=True))
    assert first["down"] == pytest.approx(round(3 * 1 / 60, 2))  # only the minute inside the range


def test_runtime_accuracy_per_project_counts_completed_jobs_with_predictions(
    cluster: Cluster, nodes: list[Node], a100: GpuType, staff_web: Client
) -> None:
    vision = ProjectFactory(slug="vision")
    nlp = ProjectFactory(slug="nlp")
    # vision: 2 h runs predicted 1.5 h (within 2x, p90 2.5 h covers) and 0.5 h (off by 4x).
    for i, p50_h in enumerate((1.5, 0.5)):
        job = _ran(vision, cluster, a100, nodes[0], DAY + timedelta(hours=2 + 3 * i), 2)
        Job.objects.filter(pk=job.pk).update(predicted_p50_s=p50_h * 3600, predicted_p90_s=2.5 * 3600)
    job = _ran(nlp, cluster, a100, nodes[0], DAY + timedelta(hours=8), 1, index=1)
    Job.objects.filter(pk=job.pk).update(predicted_p50_s=3000.0, predicted_p90_s=3000.0)
    # Not counted: failed, preempted-and-requeued, no prediction, ended outside the range.
    for i, extra in enumerate(({"status": Job.Status.FAILED}, {"attempt": 1}, {"predicted_p50_s": None})):
        job = _ran(nlp, cluster, a100, nodes[0], DAY + timedelta(hours=12 + 2 * i), 1, index=1)
        Job.objects.filter(pk=job.pk).update(**{"predicted_p50_s": 60.0, **extra})
    job = _ran(nlp, cluster, a100, nodes[0], DAY + timedelta(days=2), 1, index=1)
    Job.objects.filter(pk=job.pk).update(predicted_p50_s=60.0)
    table = selectors.runtime_accuracy_get(cluster_id=cluster.pk, rng=_day_range())
    rows = {r[0]: r[1:] for r in table.rows}
    assert rows["vision"] == (2, 50.0, 100.0, 50.0)
    assert rows["nlp"] == (1, 100.0, 0.0, 0.0)  # 3,600 s > p90 3,000 s, within 2x of p50
    page = staff_web.get(
        reverse("ops:fairness"), {"start": DAY.date().isoformat(), "days": 1}, HTTP_HX_REQUEST="true"
    )
    assert page.status_code == 200
    assert "Runtime predictions of completed jobs by project" in page.content.decode()


def test_a_replayed_round_holds_until_the_next_replayed_round(cluster: Cluster, nodes: list[Node]) -> None:
    """History rounds replayed at load time carry ``hold_s`` (nothing happened until the next
    round), so a quiet night of idleness counts in full; live rounds still hold 5 minutes."""
    t = DAY + timedelta(hours=4)
    EngineRound.objects.create(
        cluster=cluster, started_at=t, decisions={"idle": {"no_demand": 3}, "replayed": True, "hold_s": 7200}
    )
    _round(cluster, t + timedelta(hours=2), {"no_demand": 1})
    table = selectors.idle_get(cluster_id=cluster.pk, rng=_day_range(), now=DAY + timedelta(days=1))
    hours = {r[0]: r[1] for r in table.rows}
    assert hours["2026-11-02 04:00"] == pytest.approx(3.0)
    assert hours["2026-11-02 05:00"] == pytest.approx(3.0)
    assert hours["2026-11-02 06:00"] == pytest.approx(round(5 / 60, 2))  # the live round: 5 min


def test_refresh_forecasts_now_queues_a_worker_task_and_shows_its_progress(
    staff_web: Client,
    cluster: Cluster,
    nodes: list[Node],
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from forecasting import services as forecasting_services
    from forecasting import tasks as forecasting_tasks

    sent: list[list[int]] = []
    # No Celery worker in this test: record what would be sent, then run the task body like one.
    monkeypatch.setattr(
        forecasting_tasks.forecast_refresh_now, "apply_async", lambda args, **_kw: sent.append(args)
    )
    url = reverse("ops:forecast-refresh") + f"?cluster={cluster.pk}"
    with_htmx = {"HTTP_HX_REQUEST": "true"}
    with django_capture_on_commit_callbacks(execute=True):
        queued = staff_web.post(url, **with_htmx)
    assert queued.status_code == 200
    assert "queued" in queued.content.decode()
    assert 'hx-trigger="every 1s"' in queued.content.decode()
    assert sent == [[cluster.pk]]
    forecasting_services.forecast_refresh_run_now(cluster_id=cluster.pk)  # what the worker runs
    done = staff_web.get(url, **with_htmx).content.decode()
    assert "done" in done
    assert "every 1s" not in done
    page = staff_web.get(reverse("ops:capacity") + f"?cluster={cluster.pk}").content.decode()
    assert "Refresh forecasts now" in page
    # another cluster id than the URL's: no fallback to the first cluster
    assert staff_web.post(reverse("ops:forecast-refresh") + "?cluster=999999", **with_htmx).status_code == 404


def test_audit_log_shows_only_changed_fields_before_and_after(staff_web: Client, staff: User) -> None:
    AuditEvent.objects.create(
        actor=staff,
        verb="quota.update",
        entity_type="quota",
        entity_id=1,
        before={"guaranteed_gpus": 2, "borrow_limit_gpus": 4, "project": "vision"},
        after={"guaranteed_gpus": 3, "borrow_limit_gpus": 4, "project": "vision"},
        at=timezone.now(),
    )
    page = staff_web.get(reverse("ops:audit")).content.decode()
    assert "guaranteed_gpus" in page
    assert "<del>2</del> → <ins>3</ins>" in page
    assert "borrow_limit_gpus" not in page  # unchanged: not shown
    assert "{&#x27;" not in page  # no raw dict dumps
    created = selectors.audit_changes(None, {"status": "pending"})
    assert [(c.field, c.before, c.after) for c in created] == [("status", "", "pending")]


def test_whatif_refuses_a_pointless_plus_zero_and_defaults_to_a_real_change() -> None:
    from ops.forms import WhatIfForm

    assert WhatIfForm(gpu_types=["A100"]).fields["gpu_delta"].initial != 0
    form = WhatIfForm(
        {"gpu_type": "A100", "gpu_delta": "0", "policy": "berth", "history_days": "14"}, gpu_types=["A100"]
    )
    assert not form.is_valid()
    assert "compare the cluster with itself" in str(form.errors["gpu_delta"])


def test_dashboard_is_not_marked_active_on_the_operations_home(staff_web: Client, nodes: list[Node]) -> None:
    page = staff_web.get(reverse("ops:home")).content.decode()
    assert page.count('aria-current="page"') >= 1
    assert 'aria-current="page">Dashboard' not in page
