"""Seeded workload overlays on top of a batch trace (DESIGN §8).

* **On-demand interactive sessions**: 1-2 GPUs, 0.5-4 h, totalling ``interactive_share`` of the
  trace's GPU-hours.  Arrivals are a non-homogeneous Poisson process on the trace's calendar:
  the intensity is `activity_weight` (office hours, evenings, quiet nights and weekends) times a
  per-day level drawn once per calendar day (gamma, mean 1, coefficient of variation
  ``session_day_cv``), so some days are busier than others, and nothing depends on when batch
  jobs were submitted.  A session whose user waits longer than ``session_patience_s`` for GPUs
  gives up (the replay counts it in ``sessions_abandoned``: not served).
* **Advance bookings**: booked 1-72 h ahead, 1-8 GPUs, 1-8 h, starting on the hour (office hours
  more often), totalling ``booking_share`` of the trace's GPU-hours as *requested*; each
  request then goes through the portal's own admission rules (`scheduling.admission`: the
  project's booking cap, and GPUs of the type free of overlapping bookings), in the order the
  requests are made, so refused ones never reach the cluster (``bookings_refused``).  Owner
  behaviour is seeded: no-shows, late starts (an owner later than the no-show grace finds the
  booking released), early ends.
* **Projects and quotas**: one project per trace group (the trace's ``group`` column; the user
  when it is empty).  A project's guaranteed GPUs are ``guaranteed_share`` of the cluster's
  capacity split in proportion to the project's share of the trace's GPU-hours (rounded down,
  so small projects get none), per GPU type in proportion to the type's capacity; its booking
  cap is ``max(8, booking_cap_share x capacity)`` GPUs of a type.  The default
  ``guaranteed_share`` 0.5 guarantees half the capacity (a Kueue cohort whose nominal quotas
  cover half the cluster, the other half shared borrowing room; projects with little history
  get none) and sets no borrowing limit; 0 sets no quotas at all.  As on Kueue or Run:ai, work
  above a project's guarantee runs preemptible (berth: it borrows, whether or not its owner
  marked it preemptible, and the owning project reclaims it): the engine marks such starts, and
  the simulator lets them be preempted.  ``easy`` has no borrowing (Slurm has none): a
  guarantee + borrowing limit acts as a QOS ``GrpTRES`` cap per GPU type, and without a
  borrowing limit (as here) quotas change nothing for it but its fair share.
* **Batch flags**: a seeded ``preemptible_share`` of batch jobs consents to preemption (restartable
  work), and ``checkpointable_share`` of those checkpoint every ``checkpoint_interval_s``, at a
  cost of ``checkpoint_overhead_s`` of extra run time per checkpoint; a resume from a checkpoint
  costs ``restore_s`` of lost GPU-time per GPU (the replay charges it and passes it to the
  engine as ``PolicyConfig.restore_s``).

Everything is drawn from one ``random.Random(seed)`` in a fixed order, so every policy replays
exactly the same overlay.  The defaults of `OverlayConfig` are the documented benchmark set-up;
`Overlay.parameters` goes into the benchmark's JSON.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections import Counter
from dataclasses import dataclass

from scheduling import admission
from scheduling.sim.inventory import Inventory
from scheduling.sim.trace import Trace

WEEK_S = 7 * 86_400.0
DAY_S = 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True, slots=True)
class OverlayConfig:
    """Overlay sizes and behaviour; defaults are the documented benchmark settings."""

    interactive_share: float = 0.0  # of the trace's GPU-hours
    booking_share: float = 0.0  # of the trace's GPU-hours (requested windows, before admission)
    preemptible_share: float = 0.5  # of batch jobs: the user consents to preemption
    checkpointable_share: float = 0.5  # of the consenting ones: they also checkpoint
    checkpoint_interval_s: float = 1_800.0
    checkpoint_overhead_s: float = 0.0  # extra run time per checkpoint written (counted as work)
    restore_s: float = 120.0  # GPU-time lost per GPU on each resume from a checkpoint
    session_patience_s: float = 1_800.0  # a session user gives up after waiting this long
    session_day_cv: float = 0.35  # day-to-day variation of the session arrival level
    booking_no_show: float = 0.10  # owner never comes
    booking_late_share: float = 0.30  # owner comes 2-20 min late
    booking_early_end_share: float = 0.40  # owner ends after 40-95 % of the rest of the window
    booking_grace_s: float = 600.0  # a booking whose owner has not come by start + this is released
    # Of capacity, split over projects as guaranteed GPUs (0: no quotas); work above a guarantee
    # borrows as preemptible work (Kueue), see the module docstring.
    guaranteed_share: float = 0.5
    booking_cap_share: float = 0.10  # per-project booking cap: this share of a type's capacity (>= 8)
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
    """An admitted advance booking and what its owner really does with it."""

    id: str
    user: str
    project: str
    created_at: float  # when the booking is made (1-72 h before start)
    start_at: float
    end_at: float
    gpu_count: int
    use_start_at: float | None  # None: no-show
    use_end_at: float | None
    gpu_type: str | None = None
    gpu_ids: tuple[int, ...] = ()  # the GPUs admission assigned (empty: no inventory given)

    @property
    def reserved_gpu_s(self) -> float:
        return (self.end_at - self.start_at) * self.gpu_count

    @property
    def used_gpu_s(self) -> float:
        if self.use_start_at is None or self.use_end_at is None:
            return 0.0
        return (self.use_end_at - self.use_start_at) * self.gpu_count


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """A project of the overlay: guaranteed GPUs per type and the booking cap per type."""

    name: str
    weight: float = 1.0
    guaranteed: tuple[tuple[str, int], ...] = ()
    booking_cap: int | None = None


@dataclass(frozen=True, slots=True)
class Overlay:
    sessions: tuple[InteractiveSession, ...]
    bookings: tuple[BookingPlan, ...]
    preemptible: frozenset[str]  # batch job ids whose users consent
    checkpointable: frozenset[str]
    checkpoint_interval_s: float
    projects: tuple[ProjectQuota, ...] = ()
    bookings_refused: int = 0
    config: OverlayConfig = dataclasses.field(default_factory=OverlayConfig)

    def stats(self) -> dict[str, float]:
        """Sizes of the overlay in GPU-hours, for the benchmark's JSON."""
        reserved = sum(b.reserved_gpu_s for b in self.bookings) / HOUR_S
        used = sum(b.used_gpu_s for b in self.bookings) / HOUR_S
        return {
            "interactive_sessions": len(self.sessions),
            "interactive_gpu_hours": sum(s.duration_s * s.gpu_count for s in self.sessions) / HOUR_S,
            "bookings": len(self.bookings),
            "bookings_refused": self.bookings_refused,
            "booking_reserved_gpu_hours": reserved,
            "booking_used_gpu_hours": used,
            "booking_unused_share": 1 - used / reserved if reserved else 0.0,
            "preemptible_jobs": len(self.preemptible),
            "checkpointable_jobs": len(self.checkpointable),
            "projects": len(self.projects),
            "projects_with_guarantee": sum(1 for p in self.projects if any(n for _, n in p.guaranteed)),
            "guaranteed_gpus": sum(n for p in self.projects for _, n in p.guaranteed),
        }

    def parameters(self) -> dict[str, float]:
        """The overlay's configuration, for the benchmark's JSON."""
        return {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}


def activity_weight(t: float, *, week_phase_s: float = 0.0) -> float:
    """Relative interactive activity at trace time ``t``: office hours, quiet nights and weekends."""
    week_t = (t + week_phase_s) % WEEK_S
    day, hour = int(week_t // DAY_S), (week_t % DAY_S) / HOUR_S
    if 9 <= hour < 18:
        weight = 1.0
    elif 8 <= hour < 9 or 18 <= hour < 22:
        weight = 0.45
    else:
        weight = 0.08
    return weight * (0.3 if day >= 5 else 1.0)


def _sample_times(
    rng: random.Random, count: int, *, end: float, week_phase_s: float, day_cv: float
) -> list[float]:
    """``count`` sorted times in [0, end] from the calendar intensity (see the module docstring).

    Thinning: a uniform candidate is kept with probability ``activity_weight x day level / max``.
    Only the calendar and the seed decide the times, never the batch trace's submissions.
    """
    if count == 0:
        return []
    if end <= 0:
        return [0.0] * count
    days = int(end // DAY_S) + 1
    if day_cv > 0:
        shape = 1.0 / (day_cv * day_cv)
        levels = [rng.gammavariate(shape, 1.0 / shape) for _ in range(days)]
    else:
        levels = [1.0] * days
    top = max(levels)
    times: list[float] = []
    while len(times) < count:
        t = rng.uniform(0.0, end)
        level = levels[min(days - 1, int((t + week_phase_s) // DAY_S) - int(week_phase_s // DAY_S))]
        if rng.random() * top < activity_weight(t, week_phase_s=week_phase_s) * level:
            times.append(t)
    times.sort()
    return times


def _projects(trace: Trace, config: OverlayConfig, inventory: Inventory | None) -> tuple[ProjectQuota, ...]:
    """One project per trace group, guarantees by GPU-hour share (module docstring)."""
    gpu_s: dict[str, float] = {}
    for job in trace.jobs:
        gpu_s[job.project] = gpu_s.get(job.project, 0.0) + job.runtime_s * job.gpu_count
    total = sum(gpu_s.values())
    capacity_by_type: Counter[str] = Counter()
    if inventory is not None:
        for node in inventory.nodes:
            capacity_by_type[node.gpu_type] += len(node.gpu_ids)
    capacity = sum(capacity_by_type.values())
    cap = max(8, math.floor(config.booking_cap_share * capacity)) if capacity else None
    out: list[ProjectQuota] = []
    for name in sorted(gpu_s):
        share = gpu_s[name] / total if total else 0.0
        guaranteed = (
            tuple(
                (gpu_type, math.floor(config.guaranteed_share * share * count))
                for gpu_type, count in sorted(capacity_by_type.items())
            )
            if config.guaranteed_share > 0
            else ()  # no quotas at all: nothing is preemptible for being above a guarantee
        )
        out.append(ProjectQuota(name=name, guaranteed=guaranteed, booking_cap=cap))
    return tuple(out)


class _Admission:
    """The portal's booking admission (`scheduling.admission`) over the bookings admitted so far."""

    def __init__(self, inventory: Inventory | None, projects: tuple[ProjectQuota, ...]) -> None:
        self._inventory = inventory
        self._caps = {p.name: p.booking_cap for p in projects}
        self._gpu_windows: dict[int, list[tuple[float, float]]] = {}
        self._project_windows: dict[tuple[str, str], list[tuple[float, float, int]]] = {}

    def admit(
        self, *, project: str, gpu_type: str, gpu_count: int, start_at: float, end_at: float, now: float
    ) -> tuple[int, ...] | None:
        """The GPUs the portal would assign, or None when it would refuse the booking."""
        key = (project, gpu_type)
        windows = self._project_windows.setdefault(key, [])
        windows[:] = [w for w in windows if w[1] > now]
        peak = admission.peak_concurrent(windows, start_at=start_at, end_at=end_at)
        cap_error = admission.booking_cap_error(
            project=project,
            gpu_type=gpu_type,
            max_gpus=self._caps.get(project),
            peak=peak,
            gpu_count=gpu_count,
        )
        if cap_error is not None:
            return None
        gpu_ids: tuple[int, ...] = ()
        if self._inventory is not None:
            free: list[admission.FreeNode] = []
            for index, node in enumerate(self._inventory.nodes):
                if node.gpu_type != gpu_type:
                    continue
                ids = tuple(g for g in node.gpu_ids if self._is_free(g, start_at, end_at, now))
                if ids:
                    free.append(admission.FreeNode(index, node.id, 0, ids))
            pick = admission.pick_gpus(free, gpu_count=gpu_count)
            if pick is None:
                return None
            gpu_ids = tuple(sorted(pick[0]))
            for g in gpu_ids:
                self._gpu_windows.setdefault(g, []).append((start_at, end_at))
        windows.append((start_at, end_at, gpu_count))
        return gpu_ids

    def _is_free(self, gpu: int, start: float, end: float, now: float) -> bool:
        windows = self._gpu_windows.get(gpu)
        if not windows:
            return True
        windows[:] = [w for w in windows if w[1] > now]
        return all(w_end <= start or w_start >= end for w_start, w_end in windows)


def build_overlay(trace: Trace, config: OverlayConfig, *, inventory: Inventory | None = None) -> Overlay:
    """Draw the overlay for ``trace`` on ``inventory`` (deterministic for ``config.seed``).

    Without an inventory, projects get no guarantees and bookings are admitted on the
    per-project cap alone (no GPUs assigned); replays always pass one.
    """
    rng = random.Random(config.seed)
    jobs = trace.jobs
    span_end = max((job.submit_at for job in jobs), default=0.0)
    target_s = trace.gpu_hours * HOUR_S
    users = [(job.user, job.project) for job in jobs] or [("user", "default")]
    projects = _projects(trace, config, inventory)
    # Batch flags first, one draw per job in submit order, so the flags do not depend on the
    # overlay shares.
    preemptible, checkpointable = _batch_flags(rng, trace, config)
    sessions = _draw_sessions(
        random.Random(rng.getrandbits(64)),
        config,
        want_s=config.interactive_share * target_s,
        span_end=span_end,
        week_phase_s=trace.week_phase_s,
        users=users,
    )
    requests = _draw_booking_requests(
        random.Random(rng.getrandbits(64)),
        config,
        want_s=config.booking_share * target_s,
        span_end=span_end,
        week_phase_s=trace.week_phase_s,
        users=users,
        inventory=inventory,
    )
    bookings, refused = _admit_bookings(requests, _Admission(inventory, projects))
    return Overlay(
        sessions=tuple(sessions),
        bookings=tuple(bookings),
        preemptible=frozenset(preemptible),
        checkpointable=frozenset(checkpointable),
        checkpoint_interval_s=config.checkpoint_interval_s,
        projects=projects,
        bookings_refused=refused,
        config=config,
    )


def _batch_flags(rng: random.Random, trace: Trace, config: OverlayConfig) -> tuple[set[str], set[str]]:
    """(preemptible, checkpointable) batch job ids: one draw per job in submit order."""
    preemptible: set[str] = set()
    checkpointable: set[str] = set()
    for job in trace.jobs:
        if rng.random() < config.preemptible_share:
            preemptible.add(job.id)
            if rng.random() < config.checkpointable_share:
                checkpointable.add(job.id)
    return preemptible, checkpointable


def _draw_sessions(
    session_rng: random.Random,
    config: OverlayConfig,
    *,
    want_s: float,
    span_end: float,
    week_phase_s: float,
    users: list[tuple[str, str]],
) -> list[InteractiveSession]:
    """On-demand sessions totalling ``want_s`` GPU-seconds on the diurnal and weekly process."""
    sessions: list[InteractiveSession] = []
    drawn: list[tuple[float, int]] = []
    total = 0.0
    while total < want_s:
        duration = session_rng.uniform(0.5, 4.0) * HOUR_S
        gpus = 1 if session_rng.random() < 0.7 else 2
        drawn.append((duration, gpus))
        total += duration * gpus
    times = _sample_times(
        session_rng, len(drawn), end=span_end, week_phase_s=week_phase_s, day_cv=config.session_day_cv
    )
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
    return sessions


def _draw_booking_requests(
    booking_rng: random.Random,
    config: OverlayConfig,
    *,
    want_s: float,
    span_end: float,
    week_phase_s: float,
    users: list[tuple[str, str]],
    inventory: Inventory | None,
) -> list[tuple[float, BookingPlan]]:
    """Advance booking requests totalling ``want_s`` booked GPU-seconds, as (created_at, plan)
    in the order they are made (not yet admitted: no id, no GPUs)."""
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
        for t in _sample_times(booking_rng, len(shapes), end=span_end, week_phase_s=week_phase_s, day_cv=0.0)
    ]
    type_weights: list[tuple[str, int]] = []
    if inventory is not None:
        by_type: Counter[str] = Counter()
        for node in inventory.nodes:
            by_type[node.gpu_type] += len(node.gpu_ids)
        type_weights = sorted(by_type.items())
    requests: list[tuple[float, BookingPlan]] = []
    for start_at, (duration, gpus) in zip(starts, shapes, strict=True):
        plan = _booking_request(booking_rng, config, start_at, duration, gpus, users, type_weights)
        requests.append((plan.created_at, plan))
    requests.sort(key=lambda item: item[0])
    return requests


def _booking_request(
    booking_rng: random.Random,
    config: OverlayConfig,
    start_at: float,
    duration: float,
    gpus: int,
    users: list[tuple[str, str]],
    type_weights: list[tuple[str, int]],
) -> BookingPlan:
    """One booking request: its lead time, how its owner uses it, its user and GPU type."""
    lead = booking_rng.uniform(1.0, 72.0) * HOUR_S
    end_at = start_at + duration
    use_start: float | None = start_at
    use_end: float | None = end_at
    if booking_rng.random() < config.booking_no_show:
        use_start = use_end = None
    else:
        if booking_rng.random() < config.booking_late_share:
            use_start = start_at + booking_rng.uniform(120.0, 1_200.0)
        else:
            use_start = start_at + booking_rng.uniform(0.0, 120.0)  # a minute or two late
        if booking_rng.random() < config.booking_early_end_share:
            use_end = use_start + booking_rng.uniform(0.4, 0.95) * (end_at - use_start)
    user, project = users[booking_rng.randrange(len(users))]
    gpu_type = None
    if type_weights:
        names, weights = zip(*type_weights, strict=True)
        gpu_type = booking_rng.choices(names, weights=weights)[0]
    return BookingPlan(
        id="",
        user=user,
        project=project,
        created_at=max(0.0, start_at - lead),
        start_at=start_at,
        end_at=end_at,
        gpu_count=gpus,
        use_start_at=use_start,
        use_end_at=use_end,
        gpu_type=gpu_type,
    )


def _admit_bookings(
    requests: list[tuple[float, BookingPlan]], gate: _Admission
) -> tuple[list[BookingPlan], int]:
    """Admission in the order the requests are made, as the portal sees them: (admitted
    bookings with ids and GPUs, refused count)."""
    bookings: list[BookingPlan] = []
    refused = 0
    for created_at, plan in requests:
        gpu_ids = gate.admit(
            project=plan.project,
            gpu_type=plan.gpu_type or "*",
            gpu_count=plan.gpu_count,
            start_at=plan.start_at,
            end_at=plan.end_at,
            now=created_at,
        )
        if gpu_ids is None:
            refused += 1
            continue
        bookings.append(dataclasses.replace(plan, id=f"bk-{len(bookings):06d}", gpu_ids=gpu_ids))
    return bookings, refused


def session_demand_intervals(overlay: Overlay) -> list[tuple[float, float, int]]:
    """(start, end, GPUs) of every session's demand: asked from submit for its duration.

    The demand a forecaster sees (waiting or running) is the same for every policy only if a
    session counts from its submission for its own duration; that is the series the replay's
    forecaster learns from (the portal counts pending and running session GPUs alike).
    """
    return [(s.submit_at, s.submit_at + s.duration_s, s.gpu_count) for s in overlay.sessions]


def demand_series(
    overlay: Overlay, *, step_s: float = 300.0, end_at: float | None = None
) -> list[tuple[float, int]]:
    """Interactive + booked GPUs in demand at each ``step_s`` sample (sessions at their ideal start).

    Used to size the static partition: sessions count from submit for their duration,
    bookings for their whole reserved window.
    """
    intervals = session_demand_intervals(overlay)
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
