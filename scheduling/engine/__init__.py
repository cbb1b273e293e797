"""The pure scheduling core: `plan_round(snapshot, policy, now) -> Plan`.

No Django, no I/O, no clock: the same snapshot, policy and ``now`` always give the same plan.

Conventions for callers (the simulator, the Celery round):

* Bookings: when a `Booking` has no ``gpu_ids``, the plan carries a `ReserveAction` with
  ``holder_id == booking.id`` naming the GPUs the engine chose; the choice may move between
  rounds until the booking starts, so fix the booking's GPUs from the plan of the round at its
  start (or earlier).  While a booking is active its GPUs are never given to anyone else.
* `Plan.next_round_at`: the engine wants a round by then even if no other event happens (a
  booking's reclaim signal, a booking start, the end of a reclaim grace).
* `PreemptAction`: signal at ``signal_at`` (now), kill and requeue at ``kill_at``; the victim's
  `RunningJob.grace_until` should be set in later snapshots so it is not signalled twice.
"""

from __future__ import annotations

from scheduling.engine.policies.berth import plan_berth
from scheduling.engine.policies.easy import plan_easy
from scheduling.engine.policies.fifo import plan_fifo
from scheduling.engine.policies.static import plan_static
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

POLICIES = ("fifo", "easy", "static", "berth")


def plan_round(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """Decide one scheduling round for ``snapshot`` at time ``now`` under ``policy.name``.

    Raises ValueError for an unknown policy name.
    """
    if policy.name == "fifo":
        return plan_fifo(snapshot, policy, now)
    if policy.name == "easy":
        return plan_easy(snapshot, policy, now)
    if policy.name == "static":
        return plan_static(snapshot, policy, now)
    if policy.name == "berth":
        return plan_berth(snapshot, policy, now)
    raise ValueError(f"unknown policy {policy.name!r}; expected one of {', '.join(POLICIES)}")


__all__ = ["POLICIES", "plan_round"]
