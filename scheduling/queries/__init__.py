"""Raw SQL of the scheduling app where it earns its place: typed rows, tested against the ORM.

Each function runs one statement and returns frozen dataclasses or typed tuples of plain values
(never model instances).  ``tests/scheduling/test_queries.py`` compares the booking path's rows
with what the ORM reads from the same data, field for field, so a column added to a model and
not here fails a test; the availability and alternatives statements are compared with brute
force in their own tests (``tests/scheduling/test_selectors.py``, ``tests/hardening``).

- `bookings`: a booking request's names, membership and quota, the node lock, free GPUs,
  capacity, a new booking's allocations with their audit events;
- `availability`: the availability timeline and the database clock;
- `alternatives`: a refused booking's alternatives search.

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
    "alternatives_later_rows",
    "alternatives_search_rows",
    "availability_rows",
    "booking_allocations_insert_audited",
    "booking_refs_get",
    "capacity_by_cluster",
    "clock_epoch_s",
    "free_nodes_get",
    "member_quota_get",
    "nodes_lock",
]
