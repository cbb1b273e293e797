"""Ops charts that tell the truth when there is little to show: empty series say why in words,
the node heatmap starts at the history and is coloured (no wall of numbers), the idle
drill-down is grouped by node and reason and paged, and the what-if explains its utilization."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.test import Client
from django.urls import reverse

from ops import selectors
from ops.selectors import Range
from ops.views_capacity import _whatif_notes
from portal.accounts.models import Project
from scheduling.models import Allocation, Cluster, EngineRound, GpuType, Job, Node
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

DAY = datetime(2026, 11, 2, tzinfo=UTC)


def _ran(
    project: Project, cluster: Cluster, gpu_type: GpuType, node: Node, start: datetime, hours: float
) -> Job:
    job = JobFactory(
        project=project,
        cluster=cluster,
        gpu_type=gpu_type,
        status=Job.Status.COMPLETED,
        submitted_at=start,
        started_at=start,
        ended_at=start + timedelta(hours=hours),
    )
    Allocation.objects.create(
        gpu=node.gpus.get(index=0),
        job=job,
        period=DateTimeTZRange(start, start + timedelta(hours=hours), "[)"),
        state=Allocation.State.ENDED,
    )
    return job


def _week() -> Range:
    return Range(start_at=DAY - timedelta(days=6), end_at=DAY + timedelta(days=1), bucket="day")


def test_every_ops_chart_of_an_idle_cluster_says_why_it_is_empty(
    staff_web: Client, cluster: Cluster, nodes: list[Node]
) -> None:
    now = DAY + timedelta(days=2)
    tables = [
        *selectors.utilization_get(cluster_id=cluster.pk, rng=_week(), now=now),
        *selectors.fairness_get(cluster_id=cluster.pk, rng=_week(), now=now),
        selectors.runtime_accuracy_get(cluster_id=cluster.pk, rng=_week()),
        selectors.idle_get(cluster_id=cluster.pk, rng=_week(), now=now),
    ]
    for table in tables:
        assert table.is_blank, table.name
        assert len(table.blank_reason) > 30, table.name
    reasons = {t.name: t.blank_reason for t in tables}
    assert "has run no work yet" in reasons["utilization-by-type"]
    assert "no shares" in reasons["fairness-shares"]
    assert "No job started" in reasons["fairness-waits"]
    assert "runtime prediction" in reasons["runtime-accuracy"]
    assert "No engine round was recorded" in reasons["idle-by-reason"]

    # The pages print the sentence where the chart would be, and draw no canvas for it.
    for name in ("ops:utilization", "ops:fairness", "ops:idle"):
        body = staff_web.get(reverse(name), {"cluster": cluster.pk}).content.decode()
        assert 'class="chart-empty"' in body, name
        assert "data-chart=" not in body, name
    body = staff_web.get(reverse("ops:capacity"), {"cluster": cluster.pk}).content.decode()
    assert "No A100 demand in the last 3 days" in body
    assert "no forecast is stored yet" in body
    assert "data-chart=" not in body


def test_an_empty_range_after_the_history_names_when_the_work_was(
    cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    _ran(project, cluster, a100, nodes[0], DAY - timedelta(days=20), 2)
    now = DAY + timedelta(days=2)
    by_type = selectors.utilization_get(cluster_id=cluster.pk, rng=_week(), now=now)[0]
    assert by_type.is_blank
    assert "the latest work started 2026-10-13" in by_type.blank_reason
    assert "Choose more days" in by_type.blank_reason
    # With work in the range the chart is drawn and no reason is given.
    _ran(project, cluster, a100, nodes[1], DAY - timedelta(days=1), 2)
    by_type = selectors.utilization_get(cluster_id=cluster.pk, rng=_week(), now=now)[0]
    assert not by_type.is_blank
    assert by_type.blank_reason == ""


def test_idle_chart_of_a_fully_busy_cluster_says_nothing_was_idle(
    cluster: Cluster, nodes: list[Node]
) -> None:
    EngineRound.objects.create(cluster=cluster, started_at=DAY + timedelta(hours=3), decisions={"idle": {}})
    table = selectors.idle_get(cluster_id=cluster.pk, rng=_week(), now=DAY + timedelta(days=2))
    assert table.is_blank
    assert "every round found every GPU in use" in table.blank_reason


def test_heatmap_starts_at_the_history_and_shows_colours_not_numbers(
    staff_web: Client, cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    start = DAY + timedelta(hours=10)
    _ran(project, cluster, a100, nodes[0], start, 3)
    rng = Range(start_at=DAY - timedelta(days=3), end_at=DAY + timedelta(days=1), bucket="hour")
    heat = selectors.utilization_get(cluster_id=cluster.pk, rng=rng, now=DAY + timedelta(days=2))[2]
    assert heat.headers[1] == "2026-11-02 10:00"  # not three days of empty columns before it
    assert len(heat.headers) == 1 + 14
    assert heat.extra["short_labels"][0] == "02 10h"
    row = dict(zip(heat.headers, heat.rows[0], strict=True))
    assert row["2026-11-02 10:00"] == 0.25

    from django.utils import timezone

    recent = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=20)
    _ran(project, cluster, a100, nodes[0], recent, 3)
    body = staff_web.get(
        reverse("ops:utilization"), {"cluster": cluster.pk, "days": 4, "bucket": "hour"}
    ).content.decode()
    heatmap = body[body.index('id="table-node-heatmap"') :]
    heatmap = heatmap[: heatmap.index("</table>")]
    # Coloured cells, the value only for screen readers and on hover: no visible wall of digits.
    import re

    cells = re.findall(r'<td class="heat heat-(\d+)" title="(\w+): ([\d.]+)">(.*?)</td>', heatmap)
    assert cells
    assert any(float(v) > 0 for _, _, v, _ in cells)
    for level, _, value, inner in cells:
        assert inner == f'<span class="visually-hidden">{value}</span>'
        assert int(level) == round(float(value) * 10)  # the template's widthratio rounds the same way
    assert ">0.0<" not in heatmap.replace('<span class="visually-hidden">0.0</span>', "")
    assert f"From {recent:%Y-%m-%d}" in body  # the first column is the first busy one


def test_idle_drill_groups_by_node_and_reason_and_pages(
    staff_web: Client, cluster: Cluster, a100: GpuType
) -> None:
    for i in range(30):
        NodeFactory(cluster=cluster, gpu_type=a100, name=f"n{i:02d}", gpu_count=4)
    at = DAY + timedelta(hours=5, minutes=30)
    by_node = {f"n{i:02d}": {"no_demand": 3, "fragmentation": 1} for i in range(30)}
    EngineRound.objects.create(
        cluster=cluster,
        started_at=at,
        decisions={"idle": {"no_demand": 90, "fragmentation": 30}, "idle_nodes": by_node},
    )
    params = {"cluster": cluster.pk, "days": 7, "bucket": "hour", "period": "2026-11-02 05:00"}
    response = staff_web.get(reverse("ops:idle-drill"), params, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    drill = response.context["drill"]
    assert len(drill.gpus.rows) == 60  # one row per node and reason
    assert drill.gpus.rows[0] == ("n00", "A100", "up", "no_demand", 3, "0-3")
    assert drill.gpus.rows[1][3:5] == ("fragmentation", 1)
    assert "120 idle GPU(s) on 30 node(s)" in drill.gpus.caption
    page = response.context["page"]
    assert page.paginator.num_pages == 3
    assert len(response.context["gpus_table"].rows) == 20
    body = response.content.decode()
    assert "Nodes page 1 of 3" in body
    assert "page=2" in body
    second = staff_web.get(reverse("ops:idle-drill"), {**params, "page": 2}, HTTP_HX_REQUEST="true")
    assert second.context["gpus_table"].rows[0][0] == "n10"
    # The CSV still has every row.
    csv_body = staff_web.get(reverse("ops:idle-drill"), {**params, "csv": "idle-gpus"}).content.decode()
    assert len(csv_body.strip().splitlines()) == 61


def test_whatif_explains_utilization_relative_to_its_own_gpus() -> None:
    state = {
        "results": {
            "baseline": {
                "policy": "fifo",
                "gpus": 104,
                "utilization": 0.081,
                "useful_gpu_hours": 900.0,
                "span_h": 106.0,
                "unfinished_jobs": 0,
                "too_large_jobs": 0,
            },
            "whatif": {
                "policy": "fifo",
                "gpus": 8,
                "utilization": 0.025,
                "useful_gpu_hours": 21.0,
                "span_h": 105.0,
                "unfinished_jobs": 40,
                "too_large_jobs": 38,
            },
        }
    }
    notes = _whatif_notes(state["results"])
    assert "relative to their own capacity" in notes[0]
    assert "40 job(s) never ran" in notes[1]
    assert "38 ask for more than its 8 GPUs" in notes[1]
    assert "879.0 GPU-hours" in notes[1]
    # More GPUs and lower utilization needs no excuse: only the definition is given.
    state["results"]["whatif"].update(gpus=208, unfinished_jobs=0)
    assert len(_whatif_notes(state["results"])) == 1


def test_whatif_replay_reports_jobs_too_large_for_the_smaller_cluster(
    staff: User, cluster: Cluster, nodes: list[Node], a100: GpuType, project: Project
) -> None:
    """A real replay: an 8-GPU job cannot run on one 4-GPU node, so the what-if never runs it."""
    from django.utils import timezone

    from forecasting.services import capacity_study_create, capacity_study_execute

    base = timezone.now() - timedelta(days=1)
    for k in range(6):
        job = _ran(project, cluster, a100, nodes[k % 2], base + timedelta(hours=k), 1)
        Job.objects.filter(pk=job.pk).update(gpu_count=8 if k == 0 else 1)
    study = capacity_study_create(
        cluster=cluster, gpu_type="A100", gpu_delta=-4, policy="fifo", requested_by=staff, enqueue=False
    )
    done = capacity_study_execute(study_id=study.pk)
    what, baseline = done.results["whatif"], done.results["baseline"]
    assert what["gpus"] == 4
    assert what["too_large_jobs"] == 1
    assert what["unfinished_jobs"] >= 1
    assert baseline["too_large_jobs"] == 0
    assert what["useful_gpu_hours"] < baseline["useful_gpu_hours"]
