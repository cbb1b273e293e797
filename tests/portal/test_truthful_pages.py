"""The ops and researcher pages say what is true in words people read: reason labels, "–" for
no record (not 0), the capacity chart cut at 3x capacity (said), the no-signal forecast flag,
the what-if GET, durations in words, the job list that fits the page."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.template import Context, Template
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from forecasting.models import ForecastPoint, ForecastRun
from ops import selectors
from ops.selectors import Range
from scheduling.engine.types import IdleReason, PendingReason
from scheduling.labels import IDLE_REASON_LABELS, idle_reason_label, pending_reason_label
from scheduling.models import Allocation, Cluster, EngineRound, GpuType, Job, Node
from scheduling.templatetags.berth_ui import span
from tests.factories import JobFactory, MembershipFactory, ProjectFactory

pytestmark = pytest.mark.django_db

# Two weeks before the wall clock at midnight: the utilization page's 30-day window (read at the
# wall clock) must hold the records and days before them, whatever day the suite runs on.
DAY = (datetime.now(UTC) - timedelta(days=14)).replace(hour=0, minute=0, second=0, microsecond=0)


def _ran(cluster: Cluster, gpu_type: GpuType, node: Node, start: datetime, hours: float) -> Job:
    end = start + timedelta(hours=hours)
    job = JobFactory(
        project=ProjectFactory(),
        cluster=cluster,
        gpu_type=gpu_type,
        status=Job.Status.COMPLETED,
        submitted_at=start,
        started_at=start,
        ended_at=end,
    )
    Allocation.objects.create(
        gpu=node.gpus.get(index=0), job=job, period=DateTimeTZRange(start, end, "[)"), state="ended"
    )
    return job


# ---- labels ----


def test_every_idle_and_pending_reason_has_a_label_that_is_not_its_key() -> None:
    for reason in IdleReason:
        assert idle_reason_label(reason.value) != reason.value
        assert "_" not in idle_reason_label(reason.value)
    for reason in PendingReason:
        assert pending_reason_label(reason.value) != reason.value
    assert idle_reason_label("quota_blocked") == "Quota-blocked"
    assert idle_reason_label("fragmentation") == "Fragmented"
    assert idle_reason_label("someday_new") == "someday new"


def test_idle_page_and_drill_show_labels_and_the_csv_keeps_the_keys(
    staff_web: Client, cluster: Cluster, nodes: list[Node]
) -> None:
    at = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    EngineRound.objects.create(
        cluster=cluster,
        started_at=at,
        decisions={
            "idle": {"quota_blocked": 3, "fragmentation": 2},
            "idle_nodes": {"a0": {"quota_blocked": 3}, "a1": {"fragmentation": 2}},
        },
    )
    JobFactory(cluster=cluster, status=Job.Status.PENDING, submitted_at=at - timedelta(hours=1))
    Job.objects.update(pending_reason="priority")
    params = {"cluster": cluster.pk, "days": 1, "bucket": "hour"}
    body = staff_web.get(reverse("ops:idle"), params).content.decode()
    assert "Quota-blocked" in body
    assert "Fragmented" in body
    assert ">quota_blocked<" not in body
    assert ">quota blocked<" not in body
    chart = selectors.idle_get(cluster_id=cluster.pk, rng=selectors.range_get(days=1, bucket="hour"))
    legend = [s["label"] for s in chart.chart_data()["series"]]
    assert "Quota-blocked" in legend
    assert "quota_blocked" not in legend
    drill = staff_web.get(
        reverse("ops:idle-drill"), {**params, "period": f"{at:%Y-%m-%d %H:00}"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "<strong>Quota-blocked</strong> 3" in drill
    assert ">Fragmented<" in drill
    assert ">Behind higher priority<" in drill
    assert ">fragmentation<" not in drill
    csv_body = staff_web.get(reverse("ops:idle"), {**params, "csv": "idle-by-reason"}).content.decode()
    assert csv_body.splitlines()[0].startswith("Period,quota_blocked") or "quota_blocked" in csv_body


def test_labels_cover_every_idle_reason_key() -> None:
    assert {r.value for r in IdleReason} <= set(IDLE_REASON_LABELS)


# ---- "–" before the first record ----


def test_days_before_the_first_work_are_no_data_not_zero(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    _ran(cluster, a100, nodes[0], DAY + timedelta(days=3, hours=2), 4)
    _ran(cluster, a100, nodes[0], DAY + timedelta(days=5, hours=2), 4)
    rng = Range(DAY, DAY + timedelta(days=7), "day")
    by_type, by_project, _ = selectors.utilization_get(
        cluster_id=cluster.pk, rng=rng, now=DAY + timedelta(days=7)
    )
    assert [row[1] for row in by_type.rows[:3]] == [None, None, None]
    assert by_type.rows[3][1] == 4.0
    assert by_type.rows[4][1] == 0.0  # after the first record an idle day is a real 0
    assert by_type.rows[0][-1] is None  # utilization % too
    assert all(v is None for v in by_project.rows[0][1:])
    assert f"{DAY + timedelta(days=3, hours=2):%Y-%m-%d %H:%M} UTC" in by_type.note
    assert "not the same as 0" in by_type.note
    body = staff_web.get(reverse("ops:utilization"), {"cluster": cluster.pk, "days": 30}).content.decode()
    assert "not the same as 0" in body
    assert '"data": [null' in body.replace("\n", "") or "null" in body


def test_idle_hours_before_the_first_round_are_no_data(cluster: Cluster, nodes: list[Node]) -> None:
    EngineRound.objects.create(
        cluster=cluster, started_at=DAY + timedelta(days=2), decisions={"idle": {"no_demand": 4}}
    )
    rng = Range(DAY, DAY + timedelta(days=4), "day")
    table = selectors.idle_get(cluster_id=cluster.pk, rng=rng, now=DAY + timedelta(days=4))
    assert table.rows[0][1] is None
    assert table.rows[1][1] is None
    assert table.rows[2][1] is not None
    assert "first engine round" in table.note


def test_a_cluster_without_any_work_keeps_its_empty_reason(cluster: Cluster, nodes: list[Node]) -> None:
    rng = Range(DAY, DAY + timedelta(days=3), "day")
    by_type, _, _ = selectors.utilization_get(cluster_id=cluster.pk, rng=rng, now=DAY + timedelta(days=3))
    assert by_type.is_blank
    assert not by_type.note
    assert "no job or booking" in by_type.blank_reason


# ---- capacity chart: 3x capacity cut, no-signal flag ----


def _forecast(cluster: Cluster, a100: GpuType, *, upper: float, flag: str = "") -> ForecastRun:
    issued = timezone.now().replace(minute=0, second=0, microsecond=0)
    run = ForecastRun.objects.create(
        cluster=cluster,
        kind=ForecastRun.Kind.GPU_TYPE,
        key=a100.name,
        gpu_type=a100,
        model_name="berth",
        issued_at=issued,
        train_start_at=issued - timedelta(days=7),
        train_end_at=issued,
        horizon_h=2,
        flag=flag,
    )
    for h in range(2):
        ForecastPoint.objects.create(
            run=run, ts=issued + timedelta(hours=h), yhat=upper / 2, lower80=0.0, upper80=upper
        )
    return run


def test_capacity_chart_is_cut_at_three_times_capacity_and_says_so(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    _forecast(cluster, a100, upper=100.0)  # 8 A100s: 3x is 24
    response = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk})
    band = next(t for t in response.context["bands"] if t.name == "forecast-A100")
    assert band.extra["y_max"] == 24
    body = html.unescape(response.content.decode())
    assert "reaches 100.0 GPUs, above 3× this type's 8 GPUs" in body
    assert '"y_max": 24' in body


def test_capacity_chart_within_three_times_capacity_is_not_cut(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    _forecast(cluster, a100, upper=20.0)
    response = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk})
    band = next(t for t in response.context["bands"] if t.name == "forecast-A100")
    assert "y_max" not in band.extra
    assert "clip-forecast-A100" not in response.content.decode()


def test_no_signal_forecast_says_it_is_empirical(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType
) -> None:
    _forecast(cluster, a100, upper=2.0, flag="no_signal")
    body = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).content.decode()
    assert "Too little history to model: empirical last-week forecast" in body


# ---- what-if GET ----


def test_whatif_get_redirects_to_the_form(staff_web: Client, cluster: Cluster, nodes: list[Node]) -> None:
    response = staff_web.get(reverse("ops:whatif-new"), {"cluster": cluster.pk})
    assert response.status_code == 303
    assert response["Location"].startswith(reverse("ops:capacity"))
    assert response["Location"].endswith("#h-whatif")


# ---- durations in words ----


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 seconds"),
        (1, "1 second"),
        (45, "45 seconds"),
        (60, "1 minute"),
        (12 * 60, "12 minutes"),
        (3600, "1 hour"),
        (2 * 3600 + 6 * 60, "2 hours 6 minutes"),
        (86_400, "1 day"),
        (3 * 86_400 + 4 * 3600, "3 days 4 hours"),
        (None, "–"),
    ],
)
def test_span_says_durations_in_words(seconds: float | None, words: str) -> None:
    assert span(seconds) == words


def test_span_between_two_instants_and_as_a_filter() -> None:
    start = DAY
    out = Template("{% load berth_ui %}{{ a|span:b }}|{{ a|span:c }}").render(
        Context({"a": start, "b": start + timedelta(hours=1, minutes=30), "c": None})
    )
    assert out == "1 hour 30 minutes|–"
    assert span(timedelta(minutes=2)) == "2 minutes"


# ---- My jobs ----


def test_my_jobs_names_do_not_wrap_and_finished_rows_are_short(client: Client, cluster: Cluster) -> None:
    membership = MembershipFactory()
    long_name = "climate-era5-emulator-with-a-very-long-name-0001"
    started = timezone.now() - timedelta(hours=3)
    JobFactory(
        user=membership.user,
        project=membership.project,
        cluster=cluster,
        name=long_name,
        status=Job.Status.COMPLETED,
        submitted_at=started - timedelta(minutes=5),
        started_at=started,
        ended_at=started + timedelta(hours=2, minutes=6),
        predicted_p50_s=600,
        predicted_p90_s=900,
    )
    client.force_login(membership.user)
    body = client.get(reverse("my-jobs")).content.decode()
    assert 'class="jobs-table"' in body
    assert f'title="{long_name}"' in body  # the full name on hover; the cell is cut with an ellipsis
    assert 'title="Ran 2 hours 6 minutes">2 h 6 min<' in body  # compact, in words on hover
    assert "Predicted runtime" not in body  # a finished job's row is its outcome, not a prediction


def test_whatif_form_defaults_to_the_largest_type_and_adds_gpus(
    staff_web: Client, cluster: Cluster, nodes: list[Node]
) -> None:
    from tests.factories import GpuTypeFactory, NodeFactory

    NodeFactory(cluster=cluster, gpu_type=GpuTypeFactory(name="A10"), name="small", gpu_count=1)
    form = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).context["whatif_form"]
    assert form["gpu_type"].value() == "A100"  # 8 GPUs, not the 1-GPU A10 first in name order
    assert form["gpu_delta"].value() > 0  # never a pointless +0


def test_job_page_says_how_long_it_waited_and_ran_in_words(client: Client, cluster: Cluster) -> None:
    membership = MembershipFactory()
    started = timezone.now() - timedelta(hours=3)
    job = JobFactory(
        user=membership.user,
        project=membership.project,
        cluster=cluster,
        status=Job.Status.COMPLETED,
        submitted_at=started - timedelta(minutes=12),
        started_at=started,
        ended_at=started + timedelta(hours=2, minutes=6),
    )
    client.force_login(membership.user)
    body = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    assert "after waiting 12 minutes" in body
    assert "after running 2 hours 6 minutes" in body


def test_idle_drill_prefers_the_round_that_stored_idle_gpus_per_node(
    staff_web: Client, cluster: Cluster, nodes: list[Node]
) -> None:
    at = DAY + timedelta(hours=5)
    EngineRound.objects.create(
        cluster=cluster,
        started_at=at + timedelta(minutes=10),
        decisions={"idle": {"no_demand": 8}, "idle_nodes": {"a0": {"no_demand": 4}, "a1": {"no_demand": 4}}},
    )
    EngineRound.objects.create(
        cluster=cluster, started_at=at + timedelta(minutes=50), decisions={"idle": {"no_demand": 8}}
    )
    JobFactory(
        cluster=cluster, status=Job.Status.COMPLETED, submitted_at=at, started_at=at + timedelta(hours=2)
    )
    drill = selectors.idle_drill_get(cluster_id=cluster.pk, start_at=at, end_at=at + timedelta(hours=1))
    assert drill.at == at + timedelta(minutes=10)
    assert {row[3] for row in drill.gpus.rows} == {"no_demand"}  # not "not recorded"
    assert drill.jobs.rows[0][6].startswith("Not stored")  # no reason kept for a job that has started


def test_audit_instants_read_as_utc_times_not_iso_dumps() -> None:
    (change,) = selectors.audit_changes({"ended_at": None}, {"ended_at": "2026-12-02T13:57:57.808945+00:00"})
    assert (change.before, change.after) == ("none", "2026-12-02 13:57:57 UTC")
    (other,) = selectors.audit_changes({"note": "a"}, {"note": "2026-12-02 is the day"})
    assert other.after == "2026-12-02 is the day"
