"""The engine round's snapshot reads (`scheduling.snapshot`): the open jobs (versions, whole rows,
rows by id), their active allocations, the usage history fair share decays.

Tested by ``tests/scheduling/test_rounds_snapshot.py`` and ``test_inputs_parity.py`` (the snapshot
built from these rows against the ORM's jobs) and the round tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User

from portal.accounts.models import Project
from scheduling.models import Allocation, Gpu, GpuType, Job, Node
from scheduling.queries.binary import binary_rows

_RUNNING_ALLOCATIONS_SQL = f"""
    SELECT a.job_id, a.gpu_id, a.is_preemptible
      FROM {Allocation._meta.db_table} a
      JOIN {Job._meta.db_table} j ON j.id = a.job_id
     WHERE j.cluster_id = %s AND j.status = ANY(%s) AND a.state = %s
"""  # noqa: S608 (table names from the models; values are parameters)


def running_allocations_read(*, cluster_id: int, statuses: Sequence[str]) -> list[tuple[int, int, bool]]:
    """(job id, GPU id, is_preemptible) of the active allocations of the cluster's jobs in
    ``statuses``: one join, no id list (2,048 running job ids in two ``IN (...)`` lists cost
    ~200 ms of Django parameter handling per round at 1,000 nodes)."""
    return binary_rows(
        _RUNNING_ALLOCATIONS_SQL, [cluster_id, list(map(str, statuses)), str(Allocation.State.ACTIVE)]
    )


_OPEN_JOBS_COLUMNS = """
    u.username, p.slug, j.gpu_count, date_part('epoch', j.submitted_at), j.kind,
    t.name, j.min_memory_gib, j.precisions, j.requested_s, j.predicted_p50_s, j.predicted_p90_s,
    j.is_preemptible, j.is_checkpointable, j.checkpoint_interval_s, j.priority, j.name, j.attempt,
    date_part('epoch', COALESCE(j.first_submitted_at, j.submitted_at)),
    j.status, date_part('epoch', j.started_at)
"""
_OPEN_JOBS_FROM = f"""
      FROM {Job._meta.db_table} j
      JOIN {User._meta.db_table} u ON u.id = j.user_id
      JOIN {Project._meta.db_table} p ON p.id = j.project_id
      LEFT JOIN {GpuType._meta.db_table} t ON t.id = j.gpu_type_id
"""
# What the 20 columns are computed from, as stored (hashing the computed epochs costs more).
_OPEN_JOBS_SOURCES = """
    u.username, p.slug, j.gpu_count, j.submitted_at, j.kind, t.name, j.min_memory_gib,
    j.precisions, j.requested_s, j.predicted_p50_s, j.predicted_p90_s, j.is_preemptible,
    j.is_checkpointable, j.checkpoint_interval_s, j.priority, j.name, j.attempt,
    j.first_submitted_at, j.status, j.started_at
"""
# The versions only: a 64-bit hash of those values (``hash_record_extended``, PostgreSQL 14+):
# each value hashed by its type's own extended hash, as hash partitioning does, with no text
# formatting of timestamps and floats: about half the PostgreSQL time of the row's text hashed,
# ``hashtextextended(ROW(...)::text)`` (12,048 open jobs with the join: 50-72 -> 33-48 ms, read
# every round).  A NULL counts as a hash of 0, and so does a float 0 with seed 0
# (``hashfloat8extended`` returns the seed for zero): the seed is 1, so NULL -> 0.0 is a change.
# A request is read again exactly when something
# it is built from changed, its user's name, project's slug or GPU type's name included, and
# not when the job row changed elsewhere: a round's own explanation writes rewrite ~10,000
# pending rows, and with the rows' ``xmin`` as the version (as before) the next round re-read
# every one of them.  Two different values with one hash (a chance of 2^-64 per change) would
# keep the old request until the job changes again.
_OPEN_JOBS_VERSIONS_SQL = f"""
    SELECT j.id, hash_record_extended(ROW({_OPEN_JOBS_SOURCES}), 1) {_OPEN_JOBS_FROM}
     WHERE j.cluster_id = %s AND j.status = ANY(%s)
     ORDER BY j.submitted_at, j.id
"""
# The whole rows (id, then the request's 18 columns, then status and start) of some jobs.
_OPEN_JOBS_BY_ID_SQL = f"""
    SELECT j.id, {_OPEN_JOBS_COLUMNS} {_OPEN_JOBS_FROM}
     WHERE j.id = ANY(%s::bigint[]) AND j.status = ANY(%s)
"""
# Both at once (id, the version, then the 20 columns), for a cluster this process has not
# read yet: every row is stale then, and a second statement naming 12,000 ids costs more.
_OPEN_JOBS_WHOLE_SQL = f"""
    SELECT j.id, hash_record_extended(ROW({_OPEN_JOBS_SOURCES}), 1), {_OPEN_JOBS_COLUMNS}
           {_OPEN_JOBS_FROM}
     WHERE j.cluster_id = %s AND j.status = ANY(%s)
     ORDER BY j.submitted_at, j.id
"""


def open_jobs_whole_read(*, cluster_id: int, statuses: Sequence[str]) -> list[tuple[Any, ...]]:
    """(id, version, the 20 columns) of every open job of the cluster, in submission order."""
    return binary_rows(_OPEN_JOBS_WHOLE_SQL, [cluster_id, list(map(str, statuses))])


def open_jobs_versions_read(*, cluster_id: int, statuses: Sequence[str]) -> list[tuple[int, int]]:
    """(id, version) of every open job of the cluster, in submission order."""
    return binary_rows(_OPEN_JOBS_VERSIONS_SQL, [cluster_id, list(map(str, statuses))])


def open_jobs_by_id_read(*, job_ids: Sequence[int], statuses: Sequence[str]) -> list[tuple[Any, ...]]:
    """(id, the 20 columns) of the given jobs still open.  One text parameter for the ids: a list
    is quoted element by element in Python."""
    return binary_rows(
        _OPEN_JOBS_BY_ID_SQL, ["{" + ",".join(map(str, job_ids)) + "}", list(map(str, statuses))]
    )


_USAGE_SQL = f"""
    SELECT p.slug, j.gpu_count, t.value,
           date_part('epoch', j.started_at), date_part('epoch', j.ended_at)
      FROM {Job._meta.db_table} j
      JOIN {Project._meta.db_table} p ON p.id = j.project_id
      LEFT JOIN {GpuType._meta.db_table} t ON t.id = j.gpu_type_id
     WHERE j.cluster_id = %s AND j.started_at IS NOT NULL AND j.started_at < %s
       AND (j.ended_at IS NULL OR j.ended_at > %s)
"""  # noqa: S608 (table names from the models; values are parameters)


def usage_runs_rows(*, cluster_id: int, now: datetime, since: datetime) -> list[tuple[Any, ...]]:
    """(project slug, GPU count, type value, started, ended in epoch s) of the cluster's runs
    that overlap ``[since, now)``."""
    return binary_rows(_USAGE_SQL, [cluster_id, now, since])


_CLUSTER_NODES_SQL = f"""
    SELECT n.name, t.name, n.status, n.domain,
           ARRAY(SELECT g.id FROM {Gpu._meta.db_table} g WHERE g.node_id = n.id ORDER BY g.index)
      FROM {Node._meta.db_table} n
      JOIN {GpuType._meta.db_table} t ON t.id = n.gpu_type_id
     WHERE n.cluster_id = %s
     ORDER BY n.name
"""  # noqa: S608 (table names from the models; values are parameters)


def cluster_nodes_read(*, cluster_id: int) -> list[tuple[str, str, str, str, list[int]]]:
    """(name, GPU type name, status, domain, GPU ids by index) of the cluster's nodes, by name:
    one statement (a round reads the inventory twice: the backend's and the snapshot's; 1,000
    nodes and their 8,000 GPUs through two ORM value queries cost ~9 ms of CPU each time)."""
    return binary_rows(_CLUSTER_NODES_SQL, [cluster_id])
