"""The round's speed work (issue 13, bench.round): what a round keeps from the last one is
still what it would compute afresh.

Real PostgreSQL and the live simulator on a real Redis (tests.integration.loop).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from scheduling import rounds, snapshots
from scheduling.engine.outcome import fmt_s
from scheduling.engine.startability import enforces_guarantees, unstartable_jobs
from scheduling.models import Job
from scheduling.snapshot import jobs as snapshot_jobs
from scheduling.snapshots import cluster_snapshot_build, epoch, policy_config_for_cluster
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = pytest.mark.django_db

STEM = "Needs 4 GPUs of type A100; 0 are free; the next free GPUs go to the job first in line, 7."


def _said(p50: float, p90: float, now_s: float) -> str:
    return f"{STEM} Expected start in {fmt_s(p50 - now_s)} (p90 {fmt_s(p90 - now_s)})."


def test_a_sentence_that_differs_only_in_its_eta_text_is_kept_with_its_etas() -> None:
    now_s = 1_800_000_000.0
    old = (now_s + 5.4 * 86_400, now_s + 10.6 * 86_400)
    new = (old[0] - 0.2 * 86_400, old[1] - 0.2 * 86_400)  # within 10 % of the wait
    stored = ("priority", _said(*old, now_s), *old)
    row = (1, "priority", _said(*new, now_s), *new)
    assert row[2] != stored[1], "the engine's text differs: the test needs it to"
    assert not rounds._explanation_changed(row, stored, now_s=now_s)
    # The stored text must be what the engine says now for the stored ETAs, else it is rewritten:
    # time passing moves the relative text even when the absolute ETA is kept.
    stale = ("priority", _said(*old, now_s - 86_400), *old)
    assert rounds._explanation_changed(row, stale, now_s=now_s)
    # Another stem, another reason, or an ETA outside the slack: written.
    other = (1, "priority", _said(*new, now_s).replace("line, 7.", "line, 8."), *new)
    assert rounds._explanation_changed(other, stored, now_s=now_s)
    assert rounds._explanation_changed((1, "resources", *row[2:]), stored, now_s=now_s)
    far = (old[0] + 3 * 86_400, old[1])
    assert rounds._explanation_changed((1, "priority", _said(*far, now_s), *far), stored, now_s=now_s)
    # A sentence without the ETA text is compared as it is.
    assert rounds._explanation_changed(
        (1, "priority", "Held.", *new), ("priority", "Held!", *old), now_s=now_s
    )
    assert not rounds._explanation_changed(
        (1, "priority", "Held.", *new), ("priority", "Held.", *old), now_s=now_s
    )


def test_stored_sentences_agree_with_stored_etas_round_after_round(
    engine_redis_url, run_round, t0: datetime
) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    submit(user, project, cluster, gpus=4, runtime_s=7_200, now=t0)
    waiting = [submit(user, project, cluster, gpus=4, runtime_s=600 * (i + 1), now=t0) for i in range(4)]
    checked = 0
    for step in range(4):
        at = later(t0, 15 * step)
        run_round(cluster, at)
        for job in Job.objects.filter(pk__in=[j.pk for j in waiting]):
            assert job.status == Job.Status.PENDING
            assert job.pending_sentence
            if job.eta_p50_at is None or "Expected start in" not in job.pending_sentence:
                continue
            tail = (
                f" Expected start in {fmt_s(epoch(job.eta_p50_at) - epoch(at))}"
                f" (p90 {fmt_s(epoch(job.eta_p90_at) - epoch(at))})."
            )
            assert job.pending_sentence.endswith(tail), (job.pending_sentence, tail)
            checked += 1
    assert checked >= 4, "the engine gave no ETA sentence to check"


def test_startability_memo_follows_the_inventory(t0: datetime) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user, project = make_member()
    for gpus in (1, 2, 4, 8, 8):
        submit(user, project, cluster, gpus=gpus, runtime_s=600, now=t0)
    policy = policy_config_for_cluster(cluster=cluster)
    enforced = enforces_guarantees(policy.name)

    def both() -> tuple[dict, dict]:
        snapshot = cluster_snapshot_build(cluster=cluster, now=t0, policy=policy)
        per_job = unstartable_jobs(snapshot, snapshot.pending, is_guarantee_enforced=enforced)
        return per_job, rounds._unstartable_by_shape(
            snapshot, snapshot.pending, is_guarantee_enforced=enforced
        )

    per_job, memo = both()
    assert per_job == memo == {}
    cluster.nodes.filter(name="n1").update(status="down")  # 4 usable GPUs left: the 8s never start
    per_job, memo = both()
    assert memo == per_job
    assert len(per_job) == 2
    cluster.nodes.filter(name="n1").update(status="up")
    per_job, memo = both()
    assert memo == per_job == {}


def test_a_changed_job_gets_a_new_request_in_the_next_snapshot(t0: datetime) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=600, now=t0)
    Job.objects.filter(pk=job.pk).update(predicted_p50_s=100.0, predicted_p90_s=200.0)
    first = snapshots._open_jobs(cluster=cluster, now=t0)
    again = snapshots._open_jobs(cluster=cluster, now=t0)
    assert again[0].request is first[0].request  # kept: nothing changed
    Job.objects.filter(pk=job.pk).update(predicted_p50_s=300.0, priority=5)
    changed = snapshots._open_jobs(cluster=cluster, now=t0)[0].request
    assert (changed.predicted_p50_s, changed.priority) == (300.0, 5)
    fresh = snapshots._job_request_from_row(job.pk, _columns(job.pk))
    assert changed == fresh == dataclasses.replace(first[0].request, predicted_p50_s=300.0, priority=5)


def _columns(pk: int) -> tuple:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(snapshots._OPEN_JOBS_BY_ID_SQL, [[pk], ["pending", "starting", "running"]])
        return cursor.fetchone()[1:19]


def test_the_open_jobs_read_follows_every_row_a_request_is_built_from(t0: datetime) -> None:
    """Kept requests are re-read when the job, its user or its project row was written, and a
    job that is no longer open leaves the snapshot; nothing else is re-read."""
    from django.db import connection

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=600, now=t0)
    other = submit(user, project, cluster, gpus=2, runtime_s=600, now=t0)
    first = {j.pk: j.request for j in snapshots._open_jobs(cluster=cluster, now=t0)}
    assert set(first) == {job.pk, other.pk}

    with connection.cursor() as cursor:  # a write no Django model method sees
        cursor.execute("UPDATE scheduling_job SET priority = 7 WHERE id = %s", [job.pk])
    again = {j.pk: j.request for j in snapshots._open_jobs(cluster=cluster, now=t0)}
    assert again[job.pk].priority == 7
    assert again[other.pk] is first[other.pk]  # not re-read: nothing of it changed

    user.username = "renamed"
    user.save(update_fields=["username"])
    project.slug = "moved"
    project.save(update_fields=["slug"])
    renamed = {j.pk: j.request for j in snapshots._open_jobs(cluster=cluster, now=t0)}
    assert {(r.user, r.project) for r in renamed.values()} == {("renamed", "moved")}

    Job.objects.filter(pk=other.pk).update(status=Job.Status.CANCELLED)
    left = snapshots._open_jobs(cluster=cluster, now=t0)
    assert [j.pk for j in left] == [job.pk]
    assert left[0].request == snapshots._job_request_from_row(job.pk, _columns(job.pk))


def test_the_first_read_of_a_cluster_is_one_statement_and_builds_what_two_do(t0: datetime) -> None:
    """With nothing known of the cluster (a new process), versions and rows come in one read;
    the requests are the ones the two-step read builds, and the next read is two-step again."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    jobs = [
        submit(user, project, cluster, gpus=1 + i % 2, runtime_s=600, now=t0, name=f"j{i}") for i in range(3)
    ]
    snapshot_jobs._KNOWN.pop(cluster.pk, None)
    with CaptureQueriesContext(connection) as first_read:
        first = snapshots._open_jobs(cluster=cluster, now=t0)
    assert len(first_read.captured_queries) == 1
    assert [j.pk for j in first] == [j.pk for j in jobs]  # submission order
    assert [j.request for j in first] == [snapshots._job_request_from_row(j.pk, _columns(j.pk)) for j in jobs]

    Job.objects.filter(pk=jobs[1].pk).update(priority=3)
    with CaptureQueriesContext(connection) as second_read:
        second = snapshots._open_jobs(cluster=cluster, now=t0)
    assert len(second_read.captured_queries) == 2  # versions, then the changed job's row
    assert second[1].request.priority == 3
    assert second[0].request is first[0].request


def test_a_written_explanation_does_not_make_the_next_read_take_the_row_again(t0: datetime) -> None:
    """A round rewrites the explanation of most pending jobs; the request is built from none of
    those columns, so the next snapshot keeps it without reading the row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    job = submit(user, project, cluster, gpus=1, runtime_s=600, now=t0)
    first = snapshots._open_jobs(cluster=cluster, now=t0)
    Job.objects.filter(pk=job.pk).update(
        pending_reason=Job.PendingReason.PRIORITY, pending_sentence="Behind 3 jobs.", eta_p50_at=t0
    )
    with CaptureQueriesContext(connection) as read:
        again = snapshots._open_jobs(cluster=cluster, now=t0)
    assert len(read.captured_queries) == 1  # the versions only
    assert again[0].request is first[0].request
    Job.objects.filter(pk=job.pk).update(precisions=["fp16"])  # one of the request's columns
    changed = snapshots._open_jobs(cluster=cluster, now=t0)[0].request
    assert changed.precisions == frozenset({"fp16"})
    assert changed == snapshots._job_request_from_row(job.pk, _columns(job.pk))
