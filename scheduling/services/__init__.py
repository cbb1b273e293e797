"""Every write to bookings, jobs and allocations, with an audit event for each state change.

The package is split by responsibility: ``audit`` (state snapshots, audit events, closing
allocations), ``common`` (permission checks, the node lock, after-commit triggers, the conflict
error), ``placement`` (window rules, free GPUs, the quota check, the one-statement insert),
``bookings``, ``extension``, ``jobs`` and ``inventory``.  Callers import the names below from
``scheduling.services``; the modules are its implementation.

Locking protocol (keep it when adding writers, e.g. the engine's plan persistence):

* a writer that places allocations locks the ``Node`` rows of the GPU type it places on,
  in id order, with ``select_for_update`` before reading what is free; concurrent bookings
  of the same type are then serialized instead of racing;
* a booking writer that needs both takes the nodes first, then the booking row: the
  engine's reconcile updates nodes and then locks bookings, so the reverse order could
  deadlock with it;
* the btree_gist exclusion constraint on ``Allocation`` stays the last line of defence for
  any writer that skipped the lock: an exclusion violation makes ``booking_create`` pick
  again (twice), then refuse with the nearest alternatives.

Services raise ``django.core.exceptions.ValidationError`` with field keys (400),
``PermissionDenied`` (403) when the user may not act on the project or object, and
``BookingConflictError`` (409) when the GPUs are taken.
"""

from scheduling.services.audit import (
    allocation_events_record,
    allocation_state,
    allocations_close,
    audit_event_record,
    audit_events_deferred,
    iso_or_none,
    job_state,
)
from scheduling.services.bookings import booking_cancel, booking_create, booking_end_early
from scheduling.services.common import BookingConflictError, is_exclusion_violation
from scheduling.services.extension import booking_extend, booking_require_extendable
from scheduling.services.inventory import node_create, node_gpus_sync
from scheduling.services.jobs import job_cancel, job_submit

__all__ = [
    "BookingConflictError",
    "allocation_events_record",
    "allocation_state",
    "allocations_close",
    "audit_event_record",
    "audit_events_deferred",
    "booking_cancel",
    "booking_create",
    "booking_end_early",
    "booking_extend",
    "booking_require_extendable",
    "is_exclusion_violation",
    "iso_or_none",
    "job_cancel",
    "job_state",
    "job_submit",
    "node_create",
    "node_gpus_sync",
]
