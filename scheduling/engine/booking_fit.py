"""Berth: which GPUs a future booking should take, wasting the least GPU-time.

The baselines give a booking the GPUs that are free earliest, which on a busy cluster means
GPUs free *now*: they are then held (idle, or lent only to work that leaves in time) from now
until the booking starts, possibly for days.  With reclaimable (lent) work, berth can instead
put a booking on GPUs whose lent work is expected to end before the booking, or that it can
take back at the booking's start with a grace signal.  Every GPU that is free now or runs lent
work that can be reclaimed in time is a candidate, with a cost in GPU-seconds:

* free now: held until the booking starts (``need_at - now``);
* lent work expected (p50) to end before the booking: the GPU then idles until it starts
  (``need_at - p50 end``);
* other lent work: the work it loses when reclaimed at the booking's start (all of it if it
  does not checkpoint), for all of its GPUs.

The booking takes the cheapest (one node for a single-node booking).  Only free GPUs and lent
work past its minimum runtime by then qualify, so the booking is honoured exactly as before:
`reclaim_for_bookings` signals what still runs one grace before it.  The choice is remade every
round (a GPU that frees up becomes a candidate).  As a safety margin against candidates
disappearing before the start (lent work finishing and its GPU going to work that cannot be
reclaimed, sessions reclaiming lent work), it is used only while there are at least twice as
many candidates as the booking needs; otherwise the baselines' earliest-free rule applies.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from scheduling.engine.preemption import is_reclaimable, min_runtime_s
from scheduling.engine.types import Booking

if TYPE_CHECKING:  # round.py and the stages import this module
    from scheduling.engine.round import Round

_MARGIN = 2  # candidates per GPU the booking needs (see the module docstring)


def cheapest_booking_gpus(
    sched: Round, booking: Booking, types: Sequence[str], blocked: Collection[int], free: Collection[int]
) -> tuple[int, ...] | None:
    """The cheapest GPUs for a future booking, or None to use the earliest-free rule."""
    state = sched.state
    policy = state.policy
    now = sched.now
    if booking.start_at <= now:
        return None
    need_at = booking.start_at - policy.booking_lead_s
    no_one: set[str] = set()
    cost: dict[int, float] = {}
    nodes: list[list[int]] = []
    for i in sched.nodes_for(None, types):
        candidates: list[int] = []
        for gpu in state.nodes[i].gpu_ids:
            if gpu in blocked:
                continue
            if gpu in free:
                cost[gpu] = max(need_at - now, 0.0)
            else:
                running = state.running_by_gpu.get(gpu)
                if (
                    running is None
                    or not is_reclaimable(running, excluded=no_one)
                    or running.started_at + min_runtime_s(policy, is_high_class=True)
                    > need_at - policy.grace_s
                ):
                    continue
                end = state.end_p50[running.job.id]
                if end <= need_at:
                    cost[gpu] = need_at - end
                else:
                    elapsed = need_at - running.started_at
                    interval = running.job.checkpoint_interval_s
                    if running.job.is_checkpointable:
                        if interval and interval > 0:
                            elapsed %= interval
                        elapsed += policy.restore_s
                    cost[gpu] = elapsed * len(running.gpu_ids)
            candidates.append(gpu)
        nodes.append(candidates)
    count = booking.gpu_count
    if len(cost) < _MARGIN * count:
        return None
    if not sched.is_single_node(types, count):
        return tuple(sorted(sorted(cost, key=lambda g: (cost[g], g))[:count]))
    best: tuple[float, tuple[int, ...]] | None = None
    for candidates in nodes:
        if len(candidates) < count:
            continue
        chosen = sorted(candidates, key=lambda g: (cost[g], g))[:count]
        total = sum(cost[g] for g in chosen)
        if best is None or total < best[0]:
            best = (total, tuple(sorted(chosen)))
    return None if best is None else best[1]
