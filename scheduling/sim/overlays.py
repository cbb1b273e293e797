"""Seeded workload overlays on top of a batch trace (DESIGN §8).

* On-demand interactive sessions: 1-2 GPUs, 0.5-4 h, arrivals following a diurnal and weekly
  pattern, totalling ``interactive_share`` of the trace's GPU-hours.
* Advance bookings: booked 1-72 h ahead, 1-8 GPUs, 1-8 h, totalling ``booking_share`` of the
  trace's GPU-hours, with seeded owner behaviour (late start, early end, no-show) so that part
  of the reserved time is really unused.
* Batch flags: a seeded share of batch jobs is preemptible, and a share of those is
  checkpointable.

Everything is drawn from one ``random.Random(seed)`` in a fixed order, so every policy replays
exactly the same overlay.  The shares and owner-behaviour probabilities are the documented
defaults of `OverlayConfig`.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

from scheduling.sim.trace import Trace

WEEK_S = 7 * 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True, slots=True)
class OverlayConfig:
    """Overlay sizes and behaviour; defaults are the documented benchmark settings."""

    interactive_share: float = 0.0  # of the trace's GPU-hours
    booking_share: float = 0.0  # of the trace's GPU-hours (reserved windows, not used time)
    preemptible_share: float = 0.5  # of batch jobs: the user allows preemption
    checkpointable_share: float = 0.5  # of the preemptible ones: they also checkpoint
    checkpoint_interval_s: float = 1_800.0
    booking_no_show: float = 0.10  # owner never comes
    booking_late_share: float = 0.30  # owner starts late, by up to 25 % of the window
    booking_early_end_share: float = 0.40  # owner ends after 40-95 % of the rest of the window
    seed: int = 0


@dataclass(frozen=True, slots=True)
class InteractiveSession:
    id: str
    user: str
    project: str
    submit_at: float
    duration_s: float
    gpu_count: int
    requested_s: float  # what the user asks for: the duration rounded up to half hours


@dataclass(frozen=True, slots=True)
class BookingPlan:
    """An advance booking and what its owner really does with it."""

    id: str
    user: str
    project: str
    created_at: float  # when the booking is made (1-72 h before start)
    start_at: float
    end_at: float
    gpu_count: int
    use_start_at: float | None  # None: no-show
    use_end_at: float | None

    @property
    def reserved_gpu_s(self) -> float:
        return (self.end_at - self.start_at) * self.gpu_count

    @property
    def used_gpu_s(self) -> float:
        if self.use_start_at is None or self.use_end_at is None:
            return 0.0
        return (self.use_end_at - self.use_start_at) * self.gpu_count


@dataclass(frozen=True, slots=True)
class Overlay:
    sessions: tuple[InteractiveSession, ...]
    bookings: tuple[BookingPlan, ...]
    preemptible: frozenset[str]  # batch job ids
    checkpointable: frozenset[str]
    checkpoint_interval_s: float

    def stats(self) -> dict[str, float]:
        """Sizes of the overlay in GPU-hours, for the benchmark's JSON."""
        reserved = sum(b.reserved_gpu_s for b in self.bookings) / HOUR_S
        used = sum(b.used_gpu_s for b in self.bookings) / HOUR_S
        return {
            "interactive_sessions": len(self.sessions),
            "interactive_gpu_hours": sum(s.duration_s * s.gpu_count for s in self.sessions) / HOUR_S,
            "bookings": len(self.bookings),
            "booking_reserved_gpu_hours": reserved,
            "booking_used_gpu_hours": used,
            "booking_unused_share": 1 - used / reserved if reserved else 0.0,
            "preemptible_jobs": len(self.preemptible),
            "checkpointable_jobs": len(self.checkpointable),
        }


def activity_weight(t: float, *, week_phase_s: float = 0.0) -> float:
    """Relative interactive activity at trace time ``t``: office hours, quiet nights and weekends."""
    week_t = (t + week_phase_s) % WEEK_S
    day, hour = int(week_t // 86_400), (week_t % 86_400) / HOUR_S
    if 9 <= hour < 18:
        weight = 1.0
    elif 8 <= hour < 9 or 18 <= hour < 22:
        weight = 0.45
    else:
        weight = 0.08
    return weight * (0.3 if day >= 5 else 1.0)


def _sample_times(
    rng: random.Random, count: int, *, anchors: list[float], end: float, week_phase_s: float
) -> list[float]:
    """``count`` times in [0, end] that follow the trace's own activity and `activity_weight`.

    A candidate is a random batch submission (``anchors``) moved by up to 12 h either way, kept
    with probability `activity_weight`: overlay demand comes when the lab is active (traces
    such as Alibaba's have long quiet stretches) and in office hours.
    """
    times: list[float] = []
    if not anchors or end <= 0:
        return [0.0] * count
    while len(times) < count:
        t = rng.choice(anchors) + rng.uniform(-12 * HOUR_S, 12 * HOUR_S)
        if 0.0 <= t <= end and rng.random() < activity_weight(t, week_phase_s=week_phase_s):
            times.append(t)
    times.sort()
    return times


def _users(trace: Trace) -> list[tuple[str, str]]:
    """(user, project) pairs of the trace, weighted by job count, in a fixed order."""
    return [(job.user, job.project) for job in trace.jobs] or [("user", "default")]


def build_overlay(trace: Trace, config: OverlayConfig) -> Overlay:
    """Draw the overlay for ``trace`` (deterministic for ``config.seed``)."""
    rng = random.Random(config.seed)
    jobs = trace.jobs
    span_end = max((job.submit_at for job in jobs), default=0.0)
    anchors = [job.submit_at for job in jobs]
    target_s = trace.gpu_hours * HOUR_S
    users = _users(trace)
    phase = trace.week_phase_s

    # Batch flags first, one draw per job in submit order, so the flags do not depend on the
    # overlay shares.
    preemptible: set[str] = set()
    checkpointable: set[str] = set()
    for job in jobs:
        if rng.random() < config.preemptible_share:
            preemptible.add(job.id)
            if rng.random() < config.checkpointable_share:
                checkpointable.add(job.id)

    session_rng = random.Random(rng.getrandbits(64))
    sessions: list[InteractiveSession] = []
    want_s = config.interactive_share * target_s
    drawn: list[tuple[float, int]] = []
    total = 0.0
    while total < want_s:
        duration = session_rng.uniform(0.5, 4.0) * HOUR_S
        gpus = 1 if session_rng.random() < 0.7 else 2
        drawn.append((duration, gpus))
        total += duration * gpus
    times = _sample_times(session_rng, len(drawn), anchors=anchors, end=span_end, week_phase_s=phase)
    for index, (submit_at, (duration, gpus)) in enumerate(zip(times, drawn, strict=True)):
        user, project = users[session_rng.randrange(len(users))]
        sessions.append(
            InteractiveSession(
                id=f"int-{index:06d}",
                user=user,
                project=project,
                submit_at=submit_at,
                duration_s=duration,
                gpu_count=gpus,
                requested_s=math.ceil(duration / 1_800.0) * 1_800.0,
            )
        )

    booking_rng = random.Random(rng.getrandbits(64))
    bookings: list[BookingPlan] = []
    want_s = config.booking_share * target_s
    total = 0.0
    shapes: list[tuple[float, int]] = []
    while total < want_s:
        hours = booking_rng.randint(1, 8)
        gpus = booking_rng.choice((1, 1, 2, 2, 4, 8))
        shapes.append((hours * HOUR_S, gpus))
        total += hours * HOUR_S * gpus
    # Bookings start on the hour, more often in office hours.
    starts = [
        math.floor(t / HOUR_S) * HOUR_S + HOUR_S
        for t in _sample_times(booking_rng, len(shapes), anchors=anchors, end=span_end, week_phase_s=phase)
    ]
    for index, (start_at, (duration, gpus)) in enumerate(zip(starts, shapes, strict=True)):
        lead = booking_rng.uniform(1.0, 72.0) * HOUR_S
        end_at = start_at + duration
        use_start: float | None = start_at
        use_end: float | None = end_at
        draw = booking_rng.random()
        if draw < config.booking_no_show:
            use_start = use_end = None
        else:
            if booking_rng.random() < config.booking_late_share:
                use_start = start_at + booking_rng.uniform(0.0, 0.25) * duration
            else:
                use_start = start_at + booking_rng.uniform(0.0, 120.0)  # a minute or two late
            if booking_rng.random() < config.booking_early_end_share:
                use_end = use_start + booking_rng.uniform(0.4, 0.95) * (end_at - use_start)
        user, project = users[booking_rng.randrange(len(users))]
        bookings.append(
            BookingPlan(
                id=f"bk-{index:06d}",
                user=user,
                project=project,
                created_at=max(0.0, start_at - lead),
                start_at=start_at,
                end_at=end_at,
                gpu_count=gpus,
                use_start_at=use_start,
                use_end_at=use_end,
            )
        )
    return Overlay(
        sessions=tuple(sessions),
        bookings=tuple(bookings),
        preemptible=frozenset(preemptible),
        checkpointable=frozenset(checkpointable),
        checkpoint_interval_s=config.checkpoint_interval_s,
    )


def demand_series(
    overlay: Overlay, *, step_s: float = 300.0, end_at: float | None = None
) -> list[tuple[float, int]]:
    """Interactive + booked GPUs in demand at each ``step_s`` sample (sessions at their ideal start).

    Used to size the static partition: sessions count from submit for their duration,
    bookings for their whole reserved window.
    """
    intervals = [(s.submit_at, s.submit_at + s.duration_s, s.gpu_count) for s in overlay.sessions]
    intervals += [(b.start_at, b.end_at, b.gpu_count) for b in overlay.bookings]
    if not intervals:
        return []
    last = end_at if end_at is not None else max(end for _, end, _ in intervals)
    changes: dict[float, int] = {}
    for start, end, gpus in intervals:
        changes[start] = changes.get(start, 0) + gpus
        changes[end] = changes.get(end, 0) - gpus
    points = sorted(changes)
    level: list[int] = []
    running = 0
    for point in points:
        running += changes[point]
        level.append(running)
    samples: list[tuple[float, int]] = []
    t = 0.0
    while t <= last:
        index = bisect.bisect_right(points, t) - 1
        samples.append((t, level[index] if index >= 0 else 0))
        t += step_s
    return samples
