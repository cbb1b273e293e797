"""Raw SQL of the scheduling app where it earns its place: typed rows, tested against the ORM.

Each function runs one statement and returns frozen dataclasses or typed tuples of plain values
(never model instances).  ``tests/scheduling/test_queries.py`` compares the booking path's rows
with what the ORM reads from the same data, field for field, so a column added to a model and
not here fails a test; the availability and alternatives statements are compared with brute
force in their own tests (``tests/scheduling/test_selectors.py``, ``tests/hardening``).

- `bookings`: a booking request's names, membership and quota, the node lock, free GPUs,
  capacity, a new booking's allocations with their audit events;
- `availability`: the availability timeline and the database clock;
- `alternatives`: a refused booking's alternatives search;
- `rounds`: the engine round's set-wise writes, explanations and advisory lock;
- `snapshot`: the round's snapshot reads (open jobs, allocations, usage history).

The services take a project, GPU type or cluster as a *reference* (``ProjectRef``,
``GpuTypeRef``, ``ClusterRef``): what they read of it, which both these rows and the models'
instances provide.  So the booking API passes the rows it read here, the pages and the tests pass
instances, and nobody builds a model instance from a row.
"""

from scheduling.queries.alternatives import alternatives_later_rows, alternatives_search_rows
from scheduling.queries.availability import availability_rows, clock_epoch_s
from scheduling.queries.bookings import (
    BookingRefs,
    ClusterRef,
    ClusterRow,
    GpuTypeRef,
    GpuTypeRow,
    MemberQuota,
    ProjectRef,
    ProjectRow,
    QuotaRow,
    booking_allocations_insert_audited,
    booking_refs_get,
    capacity_by_cluster,
    free_nodes_get,
    member_quota_get,
    nodes_lock,
)
from scheduling.queries.rounds import (
    advisory_lock_try,
    advisory_unlock,
    array_literal,
    audit_events_insert,
    job_allocations_insert,
    jobs_requeue_write,
    nested_loops_off,
    pending_explanations_read,
    pending_explanations_write,
    unnest_update,
)
from scheduling.queries.snapshot import (
    cluster_nodes_read,
    open_jobs_by_id_read,
    open_jobs_versions_read,
    open_jobs_whole_read,
    running_allocations_read,
    usage_runs_rows,
)

__all__ = [
    "BookingRefs",
    "ClusterRef",
    "ClusterRow",
    "GpuTypeRef",
    "GpuTypeRow",
    "MemberQuota",
    "ProjectRef",
    "ProjectRow",
    "QuotaRow",
    "advisory_lock_try",
    "advisory_unlock",
    "alternatives_later_rows",
    "alternatives_search_rows",
    "array_literal",
    "audit_events_insert",
    "availability_rows",
    "booking_allocations_insert_audited",
    "booking_refs_get",
    "capacity_by_cluster",
    "clock_epoch_s",
    "cluster_nodes_read",
    "free_nodes_get",
    "job_allocations_insert",
    "jobs_requeue_write",
    "member_quota_get",
    "nested_loops_off",
    "nodes_lock",
    "open_jobs_by_id_read",
    "open_jobs_versions_read",
    "open_jobs_whole_read",
    "pending_explanations_read",
    "pending_explanations_write",
    "running_allocations_read",
    "unnest_update",
    "usage_runs_rows",
]
