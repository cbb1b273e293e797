"""Round speed VII: the round's audit events and allocations written over array literals, and
first explanations that stay on their heap page (HOT) on the job table."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduling.models import Allocation, AuditEvent, Gpu, Job
from scheduling.queries import audit_events_insert, job_allocations_insert, pending_explanations_write
from scheduling.services import audit_event_record, audit_events_deferred
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

_FIELDS = ("actor_id", "actor_label", "verb", "entity_type", "entity_id", "before", "after", "at")


def _events(at, *, actor_id=None) -> list[AuditEvent]:
    return [
        AuditEvent(
            actor_id=actor_id,
            actor_label="engine",
            verb="allocation.create",
            entity_type="allocation",
            entity_id=1,
            before=None,
            after={"gpu_id": 3, "lower": at.isoformat(), "upper": None, "is_preemptible": True},
            at=at,
        ),
        AuditEvent(
            actor_id=actor_id,
            actor_label="api",
            verb="job.start",
            entity_type="job",
            entity_id=2**40,
            before={"status": "pending", "note": 'a "quoted" \\ back\\slash, {braces}', "n": [1, None]},
            after={"status": "starting", "unicode": "ünï ✓", "empty": {}},
            at=at - timedelta(microseconds=1),
        ),
    ]


def _read(ids_after: int) -> list[dict]:
    return list(AuditEvent.objects.filter(id__gt=ids_after).order_by("id").values(*_FIELDS))


def test_audit_events_insert_leaves_the_rows_bulk_create_leaves() -> None:
    at = timezone.now()
    start = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    AuditEvent.objects.bulk_create(_events(at))
    middle = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    audit_events_insert(_events(at))
    by_orm, by_literals = _read(start)[:2], _read(middle)
    assert by_literals == by_orm
    assert by_literals[0]["before"] is None  # SQL NULL, not a JSON null
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM scheduling_auditevent WHERE id > %s AND before IS NULL", [middle]
        )
        assert cursor.fetchone()[0] == 1


def test_deferred_events_are_written_when_the_block_ends() -> None:
    at = timezone.now()
    start = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    with transaction.atomic(), audit_events_deferred():
        for event in _events(at):
            audit_event_record(
                actor=None,
                actor_label=event.actor_label,
                verb=event.verb,
                entity_type=event.entity_type,
                entity_id=event.entity_id,
                before=event.before,
                after=event.after,
                at=event.at,
            )
        assert _read(start) == []
    assert [(e["verb"], e["after"]) for e in _read(start)] == [(e.verb, e.after) for e in _events(at)]


def test_job_allocations_insert_returns_ids_in_row_order_and_refuses_an_overlap() -> None:
    node = NodeFactory(gpu_count=4)
    gpus = list(Gpu.objects.filter(node=node).order_by("-index").values_list("id", flat=True))
    job = JobFactory(cluster=node.cluster)
    now = timezone.now().replace(microsecond=0)
    rows = [
        (gpus[0], job.pk, now, now + timedelta(hours=1), True),
        (gpus[1], job.pk, now, None, False),  # unbounded: until the job ends
        (gpus[2], job.pk, now + timedelta(minutes=5), now + timedelta(hours=2), False),
    ]
    ids = job_allocations_insert(rows, state=Allocation.State.ACTIVE, at=now)
    got = {a.pk: a for a in Allocation.objects.filter(pk__in=ids)}
    assert [(got[i].gpu_id, got[i].job_id, got[i].period.lower, got[i].period.upper) for i in ids] == [
        (g, j, lower, upper) for g, j, lower, upper, _ in rows
    ]
    assert [got[i].is_preemptible for i in ids] == [True, False, False]
    assert {(a.state, a.created_at, a.booking_id, a.period.bounds) for a in got.values()} == {
        ("active", now, None, "[)")
    }
    other = JobFactory(cluster=node.cluster)
    with pytest.raises(IntegrityError), transaction.atomic():
        job_allocations_insert(
            [
                (gpus[3], other.pk, now, None, False),
                (gpus[0], other.pk, now, now + timedelta(minutes=1), False),  # taken above
            ],
            state=Allocation.State.ACTIVE,
            at=now,
        )
    assert not Allocation.objects.filter(job=other).exists()  # the whole statement failed


def test_first_explanations_stay_on_their_heap_page() -> None:
    """With the table's fillfactor (migration 0009) a pending job's first explanation, which
    grows the row by its sentence, fits on the row's own page: the update can be HOT (no index
    entry).  At fillfactor 70 three rows in four moved to another page."""
    node = NodeFactory(gpu_count=4)
    first = JobFactory(cluster=node.cluster, payload={"sim_runtime_s": 1234.5})
    rest = [
        Job(
            user=first.user,
            project=first.project,
            cluster=first.cluster,
            name=f"queued-{i % 40}",
            gpu_count=2,
            requested_s=3600,
            submitted_at=first.submitted_at,
            status=Job.Status.PENDING,
            payload={"sim_runtime_s": 1234.5 + i},
        )
        for i in range(199)
    ]
    jobs = [first, *Job.objects.bulk_create(rest)]

    def pages() -> dict[int, str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, (ctid::text::point)[0]::bigint FROM scheduling_job WHERE id = ANY(%s)",
                [[j.pk for j in jobs]],
            )
            return dict(cursor.fetchall())

    before = pages()
    now_s = timezone.now().timestamp()
    sentence = (
        "1000 other jobs are considered first; it is beyond this round's backfill window."
        " Expected start in 12.1 h (p90 15.0 h)."
    )
    pending_explanations_write([(j.pk, "resources", sentence, now_s + 3600.0, now_s + 7200.0) for j in jobs])
    after = pages()
    assert Job.objects.filter(pk__in=before, pending_sentence=sentence).count() == len(jobs)
    stayed = sum(1 for pk, page in before.items() if after[pk] == page)
    # 84 % here at fillfactor 40 (these rows are a little smaller than the bench's), 25 % at 70.
    assert stayed >= 0.75 * len(jobs), f"{stayed} of {len(jobs)} rows stayed on their page"


@pytest.mark.parametrize(
    "change",
    [
        "gpu_count = gpu_count + 1",
        "submitted_at = submitted_at + interval '1 microsecond'",
        "kind = 'interactive'",
        "gpu_type_id = (SELECT id FROM scheduling_gputype LIMIT 1)",  # NULL -> a type
        "min_memory_gib = min_memory_gib + 0.5",
        "precisions = ARRAY['fp16']",
        "requested_s = NULL",
        "predicted_p50_s = 12.5",  # NULL -> a value
        "predicted_p90_s = 0",  # NULL -> 0.0: with seed 0 both hash to 0
        "is_preemptible = NOT is_preemptible",
        "is_checkpointable = NOT is_checkpointable",
        "checkpoint_interval_s = 60",
        "checkpoint_interval_s = 0",  # NULL -> integer 0
        "priority = priority + 1",
        "name = name || 'x'",
        "attempt = attempt + 1",
        "first_submitted_at = submitted_at",  # NULL -> the same instant as another column
        "status = 'running'",
        "started_at = now()",
    ],
)
def test_a_change_to_any_source_column_changes_the_open_jobs_version(change: str) -> None:
    """The versions `_open_jobs` compares (``hash_record_extended`` of the 20 source columns):
    changing any one of them, to or from NULL too, gives the job another version."""
    from scheduling.queries import open_jobs_versions_read

    node = NodeFactory(gpu_count=4)
    job = JobFactory(cluster=node.cluster, gpu_type=None, first_submitted_at=None, predicted_p50_s=None)
    other = JobFactory(cluster=node.cluster)
    statuses = ["pending", "starting", "running"]

    def versions() -> dict[int, int]:
        return dict(open_jobs_versions_read(cluster_id=node.cluster.pk, statuses=statuses))

    before = versions()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE scheduling_job SET {change} WHERE id = %s", [job.pk])  # noqa: S608 (the cases above)
    after = versions()
    assert after[job.pk] != before[job.pk]
    assert after[other.pk] == before[other.pk]
    with connection.cursor() as cursor:  # a column the request is not built from
        cursor.execute(
            "UPDATE scheduling_job SET pending_sentence = 'Behind 3 jobs.' WHERE id = %s", [job.pk]
        )
    assert versions()[job.pk] == after[job.pk]


def test_the_set_wise_comparison_decides_as_the_row_by_row_one() -> None:
    """`_explanations_changed` (every pending job, every round) is `_explanation_changed`
    inlined: the same rows are written, on a grid of stored/new explanations that covers each
    way a row can differ (reason, an ETA in or out of its slack or to/from None, the
    sentence's stem, its ETA text now or at another instant, no ETA text), and the jobs that
    can never start are reported and written with their own reason."""
    import itertools

    from scheduling.engine.startability import Unstartable
    from scheduling.engine.types import PendingExplanation, PendingReason
    from scheduling.rounds.explanations import _eta_text, _explanation_changed, _explanations_changed

    now_s = 1_800_000_000.0
    stem = "Needs 4 GPUs of type A100; 0 are free."
    etas = [
        (None, None),
        (now_s + 3_600.0, now_s + 7_200.0),
        (now_s + 3_630.0, now_s + 7_150.0),  # within the 60 s slack of the one above
        (now_s + 5.4 * 86_400, now_s + 10.6 * 86_400),
        (now_s + 5.2 * 86_400, now_s + 10.4 * 86_400),  # within 10 % of the wait
        (now_s + 9.0 * 86_400, now_s + 10.6 * 86_400),  # p50 outside
        (now_s - 600.0, now_s - 300.0),  # overdue
    ]  # the engine's ETAs are finite: it formats them itself

    def sentences(p50, p90) -> list[str]:
        out = [stem, "Held."]
        if p50 is not None:
            out += [
                stem + _eta_text(p50, p90, now_s=now_s),
                stem + _eta_text(p50, p90, now_s=now_s - 86_400),  # told a day ago
                "Another stem." + _eta_text(p50, p90, now_s=now_s),
            ]
        return out

    explanations, current, expected = {}, [], []
    pk = 0
    for (old_p50, old_p90), (p50, p90) in itertools.product(etas, etas):
        for (old_reason, reason), old_sentence, sentence in itertools.product(
            [("priority", "priority"), ("priority", "resources"), ("quota", "bogus")],
            sentences(old_p50, old_p90),
            sentences(p50, p90),
        ):
            pk += 1
            job_reason = PendingReason(reason) if reason != "bogus" else PendingReason.PRIORITY
            explanations[pk] = PendingExplanation(str(pk), job_reason, sentence, p50, p90)
            current.append((pk, old_reason, old_sentence, old_p50, old_p90))
            row = (pk, job_reason.value, sentence, p50, p90)
            if _explanation_changed(row, (old_reason, old_sentence, old_p50, old_p90), now_s=now_s):
                expected.append(row)
    current.append((pk + 1, "priority", "Not in the plan.", None, None))  # submitted since
    never = Unstartable(PendingReason.QUOTA, "Cannot start: too big.", "Ask for less.")
    changed, cannot_start, seen = _explanations_changed(current, explanations, {}, now_s=now_s)
    assert (changed, cannot_start, seen) == (expected, [], pk)
    assert 0 < len(changed) < pk  # the grid has both kinds
    changed, cannot_start, _ = _explanations_changed(current, explanations, {"1": never}, now_s=now_s)
    assert cannot_start == [1]
    assert changed[0] == (1, "quota", never.message, None, None)  # its verdict, no ETA


def test_a_request_built_slot_by_slot_equals_the_constructed_one() -> None:
    """`_job_request_from_row` sets the frozen `JobRequest`'s slots one by one: every field is
    set, to what the constructor would store (a field added to `JobRequest` fails here)."""
    import dataclasses

    from scheduling.engine.types import JobKind, JobRequest
    from scheduling.snapshot.jobs import _job_request_from_row

    columns = (
        "ada", "vision", 4, 1_800_000_000.5, "interactive", "A100", 40.0, ["fp16", "bf16"],
        7_200, 1_800.0, 3_600.0, True, True, 300, 2, "sweep-7", 1, 1_799_990_000.25,
    )  # fmt: skip
    built = _job_request_from_row(42, columns)
    expected = JobRequest(
        id="42",
        user="ada",
        project="vision",
        gpu_count=4,
        submit_at=1_800_000_000.5,
        kind=JobKind.INTERACTIVE,
        gpu_type="A100",
        min_memory_gib=40.0,
        precisions=frozenset({"fp16", "bf16"}),
        requested_s=7_200.0,
        predicted_p50_s=1_800.0,
        predicted_p90_s=3_600.0,
        is_preemptible=True,
        is_checkpointable=True,
        checkpoint_interval_s=300.0,
        priority=2,
        name="sweep-7",
        attempt=1,
        first_submit_at=1_799_990_000.25,
    )
    assert built == expected
    assert hash(built) == hash(expected)
    assert dataclasses.asdict(built) == dataclasses.asdict(expected)  # every slot is set
    assert type(built.requested_s) is float
    assert type(built.checkpoint_interval_s) is float
    nulls = _job_request_from_row(
        43, (*columns[:5], None, 0.0, [], None, None, None, False, False, 0, 0, "", 0, None)
    )
    assert (nulls.gpu_type, nulls.requested_s, nulls.checkpoint_interval_s, nulls.precisions) == (
        None,
        None,
        None,
        frozenset(),
    )


def test_the_round_lock_is_released_before_the_collector_runs_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collection a round leaves must not run inside the round (nor while its lock is held):
    the unlock happens while the collector is still paused, and it is on again afterwards."""
    import gc

    from scheduling import queries as scheduling_queries
    from scheduling.rounds import engine_round_run
    from tests.factories import ClusterFactory

    cluster = ClusterFactory(is_active=False)  # the round takes the lock, finds it inactive, leaves
    seen: list[bool] = []
    real_unlock = scheduling_queries.advisory_unlock

    def unlock(namespace: int, key: int) -> None:
        seen.append(gc.isenabled())
        real_unlock(namespace, key)

    monkeypatch.setattr(scheduling_queries, "advisory_unlock", unlock)
    assert gc.isenabled()
    assert engine_round_run(cluster_id=cluster.pk).status == "inactive"
    assert seen == [False]  # unlocked with the collector paused
    assert gc.isenabled()


def test_a_prediction_is_added_slot_by_slot_as_replace_would() -> None:
    import dataclasses

    from scheduling.engine.types import JobKind, JobRequest
    from scheduling.snapshot.jobs import _with_runtime

    request = JobRequest(
        id="7", user="u", project="p", gpu_count=2, submit_at=5.0, kind=JobKind.INTERACTIVE,
        precisions=frozenset({"fp16"}), requested_s=3_600.0, name="x", attempt=1, first_submit_at=4.0,
    )  # fmt: skip
    answered = _with_runtime(request, p50=600.0, p90=1_200.0)
    expected = dataclasses.replace(request, predicted_p50_s=600.0, predicted_p90_s=1_200.0)
    assert dataclasses.asdict(answered) == dataclasses.asdict(expected)
    assert answered == expected
    assert request.predicted_p50_s is None  # the asked request is left as it was
