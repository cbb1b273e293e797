"""`usage_queries.decayed_project_usage` (one aggregate query) against the round's current
fair-share read: the rows of `snapshots._USAGE_SQL` folded by `inputs.project_usage`."""

from __future__ import annotations

import math
import random
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduling import inputs
from scheduling.models import Job
from scheduling.usage_queries import decayed_project_usage
from tests.factories import ClusterFactory, GpuTypeFactory, JobFactory, ProjectFactory

pytestmark = pytest.mark.django_db


# The round's read as of this commit (`snapshots.project_shares`): every run of the window as a
# row, folded in Python.  Kept here so the reference stays when the round calls the new query.
_USAGE_SQL = """
    SELECT p.slug, j.gpu_count, t.value,
           date_part('epoch', j.started_at), date_part('epoch', j.ended_at)
      FROM scheduling_job j
      JOIN accounts_project p ON p.id = j.project_id
      LEFT JOIN scheduling_gputype t ON t.id = j.gpu_type_id
     WHERE j.cluster_id = %s AND j.started_at IS NOT NULL AND j.started_at < %s
       AND (j.ended_at IS NULL OR j.ended_at > %s)
"""


def _usage_as_the_round_reads_it(*, cluster, now, half_life_s):
    with connection.cursor() as cursor:
        cursor.execute(_USAGE_SQL, [cluster.pk, now, now - timedelta(seconds=half_life_s * 5)])
        runs = cursor.fetchall()
    return inputs.project_usage(
        ((slug, n * (value or 1.0), started, ended) for slug, n, value, started, ended in runs),
        now=now.timestamp(),
        half_life_s=half_life_s,
    )


def _lab(*, now, seed=1):
    """Runs of every kind the filter and the formula tell apart, on two clusters."""
    rng = random.Random(seed)
    cluster, elsewhere = ClusterFactory(name="usage"), ClusterFactory(name="elsewhere")
    types = [
        GpuTypeFactory(name="A100", value=1.0),
        GpuTypeFactory(name="H100", value=2.5),
        None,  # no type: counts as 1
    ]
    projects = [ProjectFactory(slug=f"p{i}") for i in range(4)]
    day = 86_400
    for i in range(120):
        started = now - timedelta(seconds=rng.uniform(-day, 12 * day))  # some start after now
        kind = rng.random()
        if kind < 0.2:
            status, ended = Job.Status.RUNNING, None
        elif kind < 0.3:  # recorded as ending later than now: still running at now
            status, ended = Job.Status.COMPLETED, now + timedelta(seconds=rng.uniform(1, day))
        elif kind < 0.35:  # an end at or before its start: no work
            status, ended = Job.Status.FAILED, started - timedelta(seconds=rng.choice((0, 60)))
        else:
            status, ended = Job.Status.COMPLETED, started + timedelta(seconds=rng.uniform(1, 3 * day))
        if ended is not None and ended > now and status != Job.Status.COMPLETED:
            ended = None
        JobFactory(
            cluster=elsewhere if i % 10 == 0 else cluster,
            project=rng.choice(projects),
            gpu_type=rng.choice(types),
            gpu_count=rng.choice((1, 2, 4, 8)),
            status=status,
            submitted_at=started - timedelta(seconds=60),
            started_at=started,
            ended_at=ended,
        )
    JobFactory(cluster=cluster, project=projects[0], status=Job.Status.PENDING)  # never started
    return cluster


@pytest.mark.parametrize("half_life_s", [3_600.0, 86_400.0, 7 * 86_400.0])
def test_the_aggregate_query_gives_the_usage_the_round_computes(half_life_s):
    now = timezone.now()
    cluster = _lab(now=now)
    expected = _usage_as_the_round_reads_it(cluster=cluster, now=now, half_life_s=half_life_s)
    got = decayed_project_usage(cluster_id=cluster.pk, now=now, half_life_s=half_life_s)
    assert {k for k, v in expected.items() if v > 0} == set(got)
    for slug, value in expected.items():
        assert math.isclose(got.get(slug, 0.0), value, rel_tol=1e-12, abs_tol=1e-300), slug
    assert sum(got.values()) > 0


def test_no_memory_and_no_history():
    now = timezone.now()
    cluster = _lab(now=now)
    assert decayed_project_usage(cluster_id=cluster.pk, now=now, half_life_s=0.0) == {}
    assert all(
        v == 0.0 for v in _usage_as_the_round_reads_it(cluster=cluster, now=now, half_life_s=0.0).values()
    )
    assert (
        decayed_project_usage(cluster_id=ClusterFactory(name="empty").pk, now=now, half_life_s=3_600.0) == {}
    )


def test_a_very_short_half_life_does_not_underflow_in_postgresql():
    now = timezone.now()
    cluster = _lab(now=now)
    # Runs started days ago are thousands of half-lives back: PostgreSQL's power() would raise.
    expected = _usage_as_the_round_reads_it(cluster=cluster, now=now, half_life_s=60.0)
    got = decayed_project_usage(cluster_id=cluster.pk, now=now, half_life_s=60.0)
    for slug, value in expected.items():
        assert math.isclose(got.get(slug, 0.0), value, rel_tol=1e-12, abs_tol=1e-300), slug
