"""Reserve: GPUs held for later, so that what starts now does not delay them.

* bookings (`place_bookings`, `hold_bookings`): each booking gets GPUs (those the portal
  assigned, else the engine chooses: earliest free, or with a reclaim stage the ones that
  waste least until the booking, `booking_fit`); an active booking's GPUs are taken, a future
  one's are held until its lead time, lendable only to checkpointing work;
* the interactive pool (`InteractivePool`): the forecast level of this hour (or
  ``interactive_headroom``), minus what sessions use or can reclaim within a grace, held idle
  but lendable;
* the top job (`Reserve.top`): the blocked head of the queue gets an EASY shadow reservation
  at the earliest time enough GPUs come free; its drain is lent to checkpointing work.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine.backfill import Shadow, Window, earliest_start
from scheduling.engine.booking_fit import cheapest_booking_gpus
from scheduling.engine.fragmentation import reclaim_for_wide
from scheduling.engine.headroom import headroom_need
from scheduling.engine.outcome import fmt_gpus, fmt_s
from scheduling.engine.placement import INF, Hold
from scheduling.engine.preemption import is_cheap_to_reclaim, is_reclaimable, kill_time
from scheduling.engine.types import Booking, JobRequest, PendingReason, ReserveAction

if TYPE_CHECKING:
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.round import Round

HEADROOM = "interactive-headroom"


# ---- bookings ----


def _booking_availability(rnd: Round, gpu: int, free: set[int]) -> float:
    if gpu in free:
        return rnd.now
    running = rnd.state.running_by_gpu.get(gpu)
    if running is None:
        return INF
    end = rnd.state.end_hold[running.job.id]
    if rnd.is_reclaiming and is_reclaimable(running, excluded=set()) and is_cheap_to_reclaim(running):
        end = min(end, kill_time(rnd.state, running, is_high_class=True))
    return end


def _booking_available(
    rnd: Round, types: Sequence[str], blocked: set[int], free: set[int], ends: dict[int, float]
) -> dict[int, float]:
    """When each GPU of ``types`` not ``blocked`` is free for a booking.  ``ends``: this round's
    `_booking_availability` of GPUs not free (it depends only on what runs there), filled as
    asked, shared by the bookings placed in one round."""
    available: dict[int, float] = {}
    now = rnd.now
    for _i, gpu_ids in rnd.node_gpus_for(None, types):
        for gpu in gpu_ids:
            if gpu in blocked:
                continue
            if gpu in free:
                available[gpu] = now
                continue
            at = ends.get(gpu)
            if at is None:
                at = ends[gpu] = _booking_availability(rnd, gpu, free)
            if at < INF:
                available[gpu] = at
    return available


BookingHolds = tuple[tuple[int, Hold], ...]


@dataclass(frozen=True, slots=True)
class _Placed:
    """What `place_bookings` records for bookings that all brought their GPUs (the portal
    assigned them): then it depends on the bookings, the policy and which of them are active
    or over only, not on what runs or is free, so rounds with the same bookings reuse it."""

    bookings: tuple[Booking, ...]  # the snapshot's (kept: the cache key holds their ids)
    booking_gpus: dict[str, tuple[int, ...]]
    reservations: tuple[ReserveAction, ...]
    active: dict[int, Booking]  # GPU -> its active booking, in the order `free` loses them
    windows: dict[int, tuple[Window, ...]]
    wakes: tuple[float, ...]  # the instants asked for (`Outcome.wake_at`), sorted
    holds: BookingHolds  # `booking_holds`


# (lead, grace or None, ids of the snapshot's bookings, how many started, how many not over)
_PlacedKey = tuple[float, float | None, tuple[int, ...], int, int]
_PLACED: dict[_PlacedKey, _Placed] = {}
_PLACED_MAX = 64


def place_bookings(rnd: Round, free: set[int]) -> BookingHolds:
    """Give every current or future booking its GPUs and record them (reservations, windows
    that later starts must leave free, wake-ups); an active booking's GPUs leave ``free``.
    Returns what `hold_bookings` holds (`booking_holds`)."""
    now = rnd.now
    policy = rnd.policy
    bookings = rnd.state.snapshot.bookings
    if not bookings:
        return ()
    # Every input of `_Placed` is in the key: the booking objects (immutable; their ids stay
    # valid while the entry keeps them), the policy's lead and grace, and `now` through which
    # bookings have started and which are over (each a prefix of the bookings by start, end).
    key = (
        policy.booking_lead_s,
        policy.grace_s if rnd.is_reclaiming else None,
        tuple(map(id, bookings)),
        sum(1 for b in bookings if b.start_at <= now),
        sum(1 for b in bookings if b.end_at > now),
    )
    placed = _PLACED.get(key)
    if placed is not None:
        _record(rnd, free, placed)
        return placed.holds
    placed = _place(rnd, free)
    if placed is None:
        return booking_holds(rnd)  # the engine chose GPUs: this round's answer only
    if len(_PLACED) >= _PLACED_MAX:
        _PLACED.clear()
    _PLACED[key] = placed
    return placed.holds


def _record(rnd: Round, free: set[int], placed: _Placed) -> None:
    """Put a `_Placed` into the round, exactly as `_place` built it."""
    rnd.booking_gpus = dict(placed.booking_gpus)
    rnd.out.reservations.extend(placed.reservations)
    rnd.active_booking_gpu = dict(placed.active)
    for gpu in placed.active:
        free.discard(gpu)
    rnd.windows = dict(placed.windows)
    wakes = placed.wakes
    # `wake_at` keeps the earliest future instant: the first of the sorted ones after now
    at = bisect_right(wakes, rnd.now)
    if at < len(wakes):
        rnd.out.wake_at(wakes[at], rnd.now)


def _place(rnd: Round, free: set[int]) -> _Placed | None:
    """Place the bookings into the round; their `_Placed` when every one brought its GPUs."""
    state = rnd.state
    now = rnd.now
    policy = rnd.policy
    bookings = sorted(
        (b for b in state.snapshot.bookings if b.end_at > now),
        key=lambda b: (b.start_at, b.id),
    )
    taken: list[tuple[Booking, tuple[int, ...]]] = [(b, b.gpu_ids) for b in bookings if b.gpu_ids]
    is_given = len(taken) == len(bookings)
    ends: dict[int, float] = {}
    windows: dict[int, list[Window]] = {}
    reservations: list[ReserveAction] = []
    wakes: list[float] = []
    for booking in bookings:
        gpus = booking.gpu_ids or _choose(rnd, booking, taken, free, ends)
        if gpus is None:
            continue
        rnd.booking_gpus[booking.id] = gpus
        reservations.append(
            ReserveAction(
                holder_id=booking.id, gpu_ids=gpus, start_at=booking.start_at, end_at=booking.end_at
            )
        )
        if booking.start_at <= now:
            for gpu in gpus:
                rnd.active_booking_gpu[gpu] = booking
                free.discard(gpu)
        else:
            lead_at = booking.start_at - policy.booking_lead_s
            for gpu in gpus:
                windows.setdefault(gpu, []).append((lead_at, booking.end_at))
            wakes.append(booking.start_at)
            if rnd.is_reclaiming:
                wakes.append(lead_at - policy.grace_s)
    rnd.windows = {gpu: tuple(sorted(gpu_windows)) for gpu, gpu_windows in windows.items()}
    rnd.out.reservations.extend(reservations)
    for at in wakes:
        rnd.out.wake_at(at, now)
    if not is_given:
        return None
    return _Placed(
        bookings=state.snapshot.bookings,
        booking_gpus=dict(rnd.booking_gpus),
        reservations=tuple(reservations),
        active=dict(rnd.active_booking_gpu),
        windows=dict(rnd.windows),
        wakes=tuple(sorted(wakes)),
        holds=booking_holds(rnd),
    )


def _choose(
    rnd: Round,
    booking: Booking,
    taken: list[tuple[Booking, tuple[int, ...]]],
    free: set[int],
    ends: dict[int, float],
) -> tuple[int, ...] | None:
    """GPUs for a booking the portal gave none (appended to ``taken``), or None with a note."""
    state = rnd.state
    blocked = {
        g
        for other, other_gpus in taken
        if other.start_at < booking.end_at and booking.start_at < other.end_at
        for g in other_gpus
    }
    types = state.booking_types(booking)
    single = rnd.is_single_node(types, booking.gpu_count)
    # with reclaim: GPUs that waste least until the booking (see booking_fit)
    cheapest = cheapest_booking_gpus(rnd, booking, types, blocked, free) if rnd.is_reclaiming else None
    shadow = (
        Shadow(booking.start_at, cheapest)
        if cheapest is not None
        else earliest_start(
            node_gpus=rnd.node_gpus_for(None, types),
            available=_booking_available(rnd, types, blocked, free, ends),
            gpu_count=booking.gpu_count,
            is_single_node=single,
            duration_s=0.0,
            windows={},
        )
    )
    if shadow is None:
        rnd.out.notes.append(f"Booking {booking.id}: no {booking.gpu_count} GPUs of a fitting type exist.")
        return None
    taken.append((booking, shadow.gpu_ids))
    return shadow.gpu_ids


def booking_holds(rnd: Round) -> BookingHolds:
    """Each GPU of a future booking with its hold until the booking's lead time, in the order
    the bookings and their GPUs first name it; a GPU of several bookings gets their holds
    merged in that order (`Hold.merge`), as holding them one booking at a time would."""
    merged: dict[int, Hold] = {}
    lead_s = rnd.policy.booking_lead_s
    for booking in rnd.state.snapshot.bookings:
        if booking.start_at <= rnd.now or booking.id not in rnd.booking_gpus:
            continue
        lead_at = booking.start_at - lead_s
        # lent work is evicted when the booking starts: only checkpointing work may borrow
        hold = Hold(
            holder=booking.id,
            normal_until=lead_at,
            lent_until=lead_at,
            is_strict=True,
            is_checkpoint_only=True,
        )
        for gpu in rnd.booking_gpus[booking.id]:
            previous = merged.get(gpu)
            merged[gpu] = hold if previous is None else previous.merge(hold)
    return tuple(merged.items())


def hold_bookings(rnd: Round, holds: BookingHolds, free: set[int]) -> None:
    """Hold future bookings' free GPUs until their lead time in the pools (``holds``: from
    `place_bookings`).  A pool ignores the GPUs that are not free in it; every GPU is held
    once with its bookings' merged hold, which leaves the pool as holding the bookings one
    by one would (`FreePool.hold_each`)."""
    # most booked GPUs are busy: only the free ones (``free``: both pools') are offered
    held = [pair for pair in holds if pair[0] in free]
    if not held:
        return
    pools = [rnd.inter_pool] if rnd.batch_pool is rnd.inter_pool else [rnd.inter_pool, rnd.batch_pool]
    for pool in pools:
        pool.hold_each(held)


# ---- the interactive pool ----


@dataclass(frozen=True, slots=True)
class InteractivePool:
    """Keep the interactive level idle or running only reclaimable work (minus what sessions
    already use or can reclaim within a grace: `headroom.headroom_need`)."""

    def hold(self, rnd: Round) -> None:
        """Hold the pool's GPUs for this round (see the class docstring)."""
        levels = rnd.headroom_levels()
        if not levels:
            return
        pool = rnd.inter_pool
        forecast = rnd.pool_forecast
        for type_name, count in levels:
            types = list(rnd.type_rank) if type_name == "*" else [type_name]
            need = headroom_need(rnd, types, count)
            if need <= 0:
                continue
            chosen = pool.pick_fragments(types, need)
            # lendable to checkpointing work (a session takes it back within a grace, losing
            # at most a checkpoint interval); with a forecast over time also to restartable
            # work predicted to be gone before the pool's next demand rise
            pool.hold(
                chosen,
                Hold(
                    holder=HEADROOM,
                    normal_until=-INF,
                    lent_until=INF,
                    is_checkpoint_only=True,
                    is_for_interactive=True,
                    restart_until=-INF if forecast is None else forecast.next_rise(types, rnd.now),
                ),
            )


# ---- the top job ----


@dataclass(frozen=True, slots=True)
class Reserve:
    """The EASY top-job reservation (see the module docstring)."""

    def top(
        self,
        rnd: Round,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        *,
        not_before: float | None = None,
    ) -> None:
        """Make the blocked head job the top job: reclaim consenting work for it (with a
        reclaim stage), or reserve its shadow (from ``not_before`` on when given: a
        non-preemptible job's low-demand window, `admit.pool_admits`; nothing is reclaimed
        to start it sooner)."""
        pool = rnd.pool_for(job)
        single = rnd.is_single_node(types, job.gpu_count)
        reclaim = rnd.composition.reclaim
        if not_before is None and reclaim is not None:
            if reclaim.for_demand(rnd, job, types, estimate, single=single):
                return
            if reclaim_for_wide(rnd, job, types, estimate):
                return
        available = rnd.availability(for_job=job.id)
        if not_before is not None:
            available = {gpu: max(at, not_before) for gpu, at in available.items()}
        shadow = earliest_start(
            node_gpus=rnd.node_gpus_for(job, types),
            available=available,
            gpu_count=job.gpu_count,
            is_single_node=single,
            duration_s=estimate.hold_s,
            windows=rnd.windows,
        )
        if shadow is None:
            where = "in the batch partition" if rnd.partition_nodes else "up"
            rnd.out.wait(
                job.id,
                PendingReason.CONSTRAINT,
                f"Needs {fmt_gpus(job.gpu_count)} of type {'/'.join(types)}; not that many are {where} "
                f"(nodes down or draining, or the cluster is too small for it).",
            )
            rnd.out.verdicts[job.id].has_eta = False
            return
        rnd.top = job
        rnd.top_shadow = shadow
        free_total = pool.free_in(types)
        # fragmentation only if the free GPUs could not host it even ignoring holds (bookings)
        rnd.top_fragmented = (
            free_total >= job.gpu_count
            and pool.find(types, job.gpu_count, until=-INF, strict_until=-INF) is None
        )
        # The top job's drain is lent to checkpointing work for as long as it lasts: that work
        # is suspended for the top job once its other GPUs are ready (`reclaim.suspendable_for`:
        # it was lent while the top job waited), losing at most a checkpoint interval plus the
        # restore; other work backfills only where it ends in time.
        hold = Hold(holder=job.id, normal_until=shadow.start_at, lent_until=INF, is_checkpoint_only=True)
        pool.hold(shadow.gpu_ids, hold)
        rnd.out.reservations.append(
            ReserveAction(
                holder_id=job.id,
                gpu_ids=shadow.gpu_ids,
                start_at=shadow.start_at,
                end_at=shadow.start_at + estimate.hold_s,
            )
        )
        _explain_top(rnd, job, free_total, shadow.start_at)


def _explain_top(rnd: Round, job: JobRequest, free_total: int, start_at: float) -> None:
    """The top job's sentence: fragments, or too few free GPUs; reserved from ``start_at``."""
    reserved = f"GPUs are reserved for it from +{fmt_s(start_at - rnd.now)}."
    if rnd.top_fragmented:
        rnd.out.wait(
            job.id,
            PendingReason.FRAGMENTATION,
            f"Top of the queue; {free_total} fitting GPUs are free but no node has {job.gpu_count} "
            f"of them together. {reserved}",
            start_at,
        )
        return
    rnd.out.wait(
        job.id,
        PendingReason.RESOURCES,
        f"Top of the queue; needs {job.gpu_count} GPUs, {free_total} fitting ones are free now. {reserved}",
        start_at,
    )
