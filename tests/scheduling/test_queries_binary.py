"""The round's binary reads (`scheduling.queries.binary.binary_rows`) give what Django's text
cursor gives for the same statements: the same values of the same Python types, NULLs, arrays
of strings, a quote and a backslash in a name, booleans, floats to the last bit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg.types.range import Range

from scheduling import queries
from scheduling.models import Allocation, Gpu, Job
from scheduling.queries import snapshot as snapshot_sql
from scheduling.queries.binary import binary_rows
from tests.factories import ClusterFactory, GpuTypeFactory, JobFactory, NodeFactory

pytestmark = [pytest.mark.django_db]

OPEN = [Job.Status.PENDING, Job.Status.STARTING, Job.Status.RUNNING]


def _text_rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _typed(rows: list[tuple[Any, ...]]) -> list[list[tuple[type, Any]]]:
    # floats by their exact bits: 0.1 + 0.2 read back as text and as binary must agree exactly
    return [[(type(v), v.hex() if isinstance(v, float) else v) for v in row] for row in rows]


def test_binary_reads_equal_the_text_reads() -> None:
    now = timezone.now().replace(microsecond=123457)
    cluster = ClusterFactory()
    gpu_type = GpuTypeFactory(value=0.1 + 0.2)
    node = NodeFactory(cluster=cluster, gpu_type=gpu_type)
    gpu = Gpu.objects.filter(node=node).order_by("id")[0]
    odd = JobFactory(
        cluster=cluster,
        name='it\'s "odd" \\ név',
        gpu_type=gpu_type,
        precisions=["fp16", "bf16"],
        min_memory_gib=40.5,
        requested_s=None,
        predicted_p50_s=0.1 + 0.2,
        predicted_p90_s=1e-300,
        checkpoint_interval_s=600,
        is_checkpointable=True,
        priority=3,
        submitted_at=now - timedelta(seconds=1.5),
        eta_p50_at=now + timedelta(hours=1),
    )
    running = JobFactory(
        cluster=cluster,
        status=Job.Status.RUNNING,
        started_at=now - timedelta(minutes=5),
        first_submitted_at=now - timedelta(days=1),
        attempt=2,
        is_preemptible=True,
    )
    Allocation.objects.create(
        job=running,
        gpu=gpu,
        period=Range(now - timedelta(minutes=5), now + timedelta(hours=1), "[)"),
        state=Allocation.State.ACTIVE,
        is_preemptible=True,
    )
    JobFactory(
        cluster=cluster, status=Job.Status.COMPLETED, started_at=now - timedelta(hours=2), ended_at=now
    )
    statuses = [str(s) for s in OPEN]
    ids = "{" + f"{odd.pk},{running.pk}" + "}"
    pairs = [
        (
            queries.open_jobs_whole_read(cluster_id=cluster.pk, statuses=OPEN),
            _text_rows(snapshot_sql._OPEN_JOBS_WHOLE_SQL, [cluster.pk, statuses]),
        ),
        (
            queries.open_jobs_versions_read(cluster_id=cluster.pk, statuses=OPEN),
            _text_rows(snapshot_sql._OPEN_JOBS_VERSIONS_SQL, [cluster.pk, statuses]),
        ),
        (
            queries.open_jobs_by_id_read(job_ids=[odd.pk, running.pk], statuses=OPEN),
            _text_rows(snapshot_sql._OPEN_JOBS_BY_ID_SQL, [ids, statuses]),
        ),
        (
            queries.running_allocations_read(cluster_id=cluster.pk, statuses=OPEN[1:]),
            _text_rows(snapshot_sql._RUNNING_ALLOCATIONS_SQL, [cluster.pk, statuses[1:], "active"]),
        ),
        (
            queries.usage_runs_rows(cluster_id=cluster.pk, now=now, since=now - timedelta(days=1)),
            _text_rows(snapshot_sql._USAGE_SQL, [cluster.pk, now, now - timedelta(days=1)]),
        ),
    ]
    for binary, text in pairs:
        assert text  # every read found rows: the comparison is not of two empty lists
        assert _typed(binary) == _typed(text)
    whole = queries.open_jobs_whole_read(cluster_id=cluster.pk, statuses=OPEN)
    assert [row[9] for row in whole if row[0] == odd.pk] == [["fp16", "bf16"]]
    explained = queries.pending_explanations_read(cluster_id=cluster.pk)
    assert [(pk, eta) for pk, _r, _s, eta, _p90 in explained] == [
        (odd.pk, (now + timedelta(hours=1)).timestamp())
    ]


def test_binary_reads_are_logged_and_raise_django_errors() -> None:
    with CaptureQueriesContext(connection) as captured:
        assert binary_rows("SELECT %s::int + 1, %s::text", [41, "x"]) == [(42, "x")]
    assert len(captured.captured_queries) == 1  # the test suites' query counts still see it
    from django.db import ProgrammingError

    with pytest.raises(ProgrammingError):
        binary_rows("SELECT no_such_column FROM scheduling_job", [])


def test_engine_nodes_read_in_one_statement_equal_the_models() -> None:
    from scheduling.models import Node
    from scheduling.snapshot.inventory import engine_nodes_for_cluster

    cluster = ClusterFactory()
    b = NodeFactory(cluster=cluster, name="b", gpu_count=3, status=Node.Status.DRAINING, domain="rack-2")
    Gpu.objects.filter(node=b).delete()
    Gpu.objects.bulk_create(Gpu(node=b, index=i) for i in (2, 0, 1))  # ids out of index order
    NodeFactory(cluster=cluster, name="a", gpu_count=3)
    c = NodeFactory(cluster=cluster, name="c", gpu_count=1, status=Node.Status.DOWN)
    Gpu.objects.filter(node=c).delete()  # a node whose GPU rows are gone
    NodeFactory(name="elsewhere")
    got = engine_nodes_for_cluster(cluster=cluster)
    assert [(n.id, n.gpu_type, n.status.value, n.domain) for n in got] == [
        (node.name, node.gpu_type.name, node.status, node.domain)
        for node in Node.objects.filter(cluster=cluster).order_by("name")
    ]
    assert [n.gpu_ids for n in got] == [
        tuple(
            Gpu.objects.filter(node__cluster=cluster, node__name=name)
            .order_by("index")
            .values_list("id", flat=True)
        )
        for name in ("a", "b", "c")
    ]
    assert got[1].gpu_ids != tuple(sorted(got[1].gpu_ids))  # index order, not id order
    assert got[2].gpu_ids == ()
