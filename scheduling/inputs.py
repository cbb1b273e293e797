"""Policy inputs of an engine round, built by the same code in the portal and in the replay.

`scheduling.snapshots` (the portal's round, rows from PostgreSQL) and `scheduling.sim.replay`
(the benchmark, its own history) both call these functions, so a replay runs the inputs the
portal ships rather than a replay-only approximation:

* `UsageLedger` / `project_usage`: decayed, GPU-value-weighted GPU-hours per project, with the
  engine's one decay formula (`scheduling.engine.fairshare.decay_usage`) integrated over every
  run; `project_shares` turns them and the quotas into the snapshot's ``ProjectShare`` tuple.
* `headroom_gpus` and `interactive_pool`: the interactive headroom for now and the pool per
  coming hour from a demand forecast's upper band (the shipped forecaster's 80 % interval, as
  stored by the portal's hourly refresh), booked GPUs and capacity.
* `resumed_prediction`: a requeued job's runtime prediction, its stored one less the progress
  its checkpoint saved.

Pure: no Django, no I/O.  Times are float seconds on the caller's clock; usage is in GPU-hours.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduling.engine.fairshare import decay_usage
from scheduling.engine.types import ProjectShare

HOUR_S = 3_600.0


def decayed_gpu_hours(*, start_at: float, end_at: float, now: float, half_life_s: float) -> float:
    """Hours of ``[start_at, end_at)`` weighted by ``decay_usage`` to ``now``: the integral of
    ``2 ** (-(now - t) / half_life_s)`` over the interval, in hours (0 for an empty interval)."""
    if end_at <= start_at or half_life_s <= 0:
        return 0.0
    scale_s = half_life_s / math.log(2.0)
    late = decay_usage(1.0, elapsed_s=now - end_at, half_life_s=half_life_s)
    early = decay_usage(1.0, elapsed_s=now - start_at, half_life_s=half_life_s)
    return scale_s * (late - early) / HOUR_S


class UsageLedger:
    """Decayed usage per project, fed with finished runs as they end (in any order).

    Finished runs are folded into one value per project as of the latest end seen, so a query
    costs one decay per project plus the running work: a replay can keep one ledger for its
    whole run instead of re-reading history every round.  A project's value is brought forward
    to the latest end only when that project gets a run (or is read), so adding a run costs a
    constant, not one decay per project (5,000 runs of 25 projects were 125,000 decays a round).
    """

    __slots__ = ("_as_of", "_half_life_s", "_value", "_value_at")

    def __init__(self, *, half_life_s: float) -> None:
        self._half_life_s = half_life_s
        self._value: dict[str, float] = {}
        self._value_at: dict[str, float] = {}  # when each project's value was last brought forward
        self._as_of = -math.inf

    def add(self, project: str, *, gpu_value: float, start_at: float, end_at: float) -> None:
        """A finished run: ``gpu_value`` = GPUs x their fair-share value, over ``[start_at, end_at)``."""
        if end_at <= start_at:
            return
        if end_at > self._as_of:
            self._as_of = end_at
        value = self._value.get(project, 0.0)
        at = self._value_at.get(project, self._as_of)
        if at < self._as_of:
            value = decay_usage(value, elapsed_s=self._as_of - at, half_life_s=self._half_life_s)
        hours = decayed_gpu_hours(
            start_at=start_at, end_at=end_at, now=self._as_of, half_life_s=self._half_life_s
        )
        self._value[project] = value + gpu_value * hours
        self._value_at[project] = self._as_of

    def usage_at(self, now: float, *, running: Iterable[tuple[str, float, float]] = ()) -> dict[str, float]:
        """Usage per project at ``now`` (>= every end added): finished runs plus ``running``
        ``(project, gpu_value, started_at)`` up to ``now``."""
        out: dict[str, float] = {}
        half_life_s = self._half_life_s
        if half_life_s <= 0:  # no memory: every value decays to 0 (`decay_usage`)
            for name in self._value:
                out[name] = 0.0
            for project, gpu_value, _started_at in running:
                out[project] = out.get(project, 0.0) + gpu_value * 0.0
            return out
        # `decay_usage` and `decayed_gpu_hours` written out (the same operations, so the same
        # floats): a replay asks every round, for every project and every running job
        power = math.pow
        if self._value:
            as_of = self._as_of
            value_at = self._value_at
            elapsed = max(0.0, now - as_of)
            for name, value in self._value.items():
                behind = (as_of - value_at[name]) + elapsed
                out[name] = value * power(0.5, (behind if behind > 0.0 else 0.0) / half_life_s)
        scale_s = half_life_s / math.log(2.0)
        for project, gpu_value, started_at in running:
            if now <= started_at:
                hours = 0.0
            else:
                since = now - started_at
                hours = scale_s * (1.0 - power(0.5, (since if since > 0.0 else 0.0) / half_life_s)) / HOUR_S
            out[project] = out.get(project, 0.0) + gpu_value * hours
        return out


def project_usage(
    runs: Iterable[tuple[str, float, float, float | None]], *, now: float, half_life_s: float
) -> dict[str, float]:
    """Decayed usage per project at ``now`` of ``runs`` ``(project, gpu_value, started_at, ended_at)``;
    ``ended_at`` None (or later than ``now``) is work still running, counted up to ``now``."""
    ledger = UsageLedger(half_life_s=half_life_s)
    running: list[tuple[str, float, float]] = []
    for project, gpu_value, started_at, ended_at in sorted(
        runs, key=lambda r: math.inf if r[3] is None else r[3]
    ):
        if started_at >= now:
            continue
        if ended_at is None or ended_at > now:
            running.append((project, gpu_value, started_at))
        else:
            ledger.add(project, gpu_value=gpu_value, start_at=started_at, end_at=ended_at)
    return ledger.usage_at(now, running=running)


@dataclass(frozen=True, slots=True)
class ProjectSpec:
    """A project's standing settings: fair-share weight and quotas."""

    name: str
    weight: float = 1.0
    guaranteed: tuple[tuple[str, int], ...] = ()  # (gpu_type, GPUs)
    borrow_limit: int | None = None
    borrow_limits: tuple[tuple[str, int], ...] = ()  # (gpu_type, GPUs) above its guarantee


def project_shares(specs: Sequence[ProjectSpec], *, usage: Mapping[str, float]) -> tuple[ProjectShare, ...]:
    """The snapshot's projects: every spec with its decayed usage (0 without history), in name order."""
    return ShareBuilder(specs).shares(usage)


class _ShareSlots:
    """`ProjectShare`'s very slots, writable: `ShareBuilder` fills one of these and then makes
    it a `ProjectShare` (``__class__`` assignment, allowed between classes of the same slots),
    which gives the same object as the dataclass' ``__init__`` (that one goes through
    ``object.__setattr__`` per field, the frozen route, several times slower)."""

    __slots__ = ("name", "weight", "decayed_usage", "guaranteed", "borrow_limit", "borrow_limits")  # noqa: RUF023
    name: str
    weight: float
    decayed_usage: float
    guaranteed: tuple[tuple[str, int], ...]
    borrow_limit: int | None
    borrow_limits: tuple[tuple[str, int], ...]


# a `ProjectShare` field added or moved must be mirrored above (or the assignment fails)
assert _ShareSlots.__slots__ == ProjectShare.__slots__, "_ShareSlots must mirror ProjectShare"


class ShareBuilder:
    """`project_shares` for one fixed list of specs, called again and again (a replay's rounds).

    The specs are sorted once; a project whose usage has not changed since the last call keeps
    its `ProjectShare` object (equal anyway: it is immutable); the others are built through
    `_ShareSlots` (a replay builds every project's share every round: its usage decays).
    """

    __slots__ = ("_last", "_specs")

    def __init__(self, specs: Sequence[ProjectSpec]) -> None:
        self._specs = sorted(specs, key=lambda s: s.name)
        self._last: list[ProjectShare | None] = [None] * len(self._specs)

    def shares(self, usage: Mapping[str, float]) -> tuple[ProjectShare, ...]:
        """Every spec with its decayed usage from ``usage`` (0 without history), in name order."""
        last = self._last
        get = usage.get
        for index, spec in enumerate(self._specs):
            used = get(spec.name, 0.0)
            share = last[index]
            if share is not None:
                old = share.decayed_usage
                if (
                    old == used
                    and type(old) is type(used)
                    and (used != 0.0 or math.copysign(1.0, used) == math.copysign(1.0, old))
                ):
                    continue  # the very same value: the same share
            slots = _ShareSlots()  # the type call: faster than ``object.__new__(_ShareSlots)``
            slots.name = spec.name
            slots.weight = spec.weight
            slots.decayed_usage = used
            slots.guaranteed = spec.guaranteed
            slots.borrow_limit = spec.borrow_limit
            slots.borrow_limits = spec.borrow_limits
            slots.__class__ = ProjectShare  # type: ignore[assignment]  # the same slots, now frozen
            last[index] = slots  # type: ignore[call-overload]  # a ProjectShare since the line above
        return tuple(last)  # type: ignore[arg-type]  # every entry was set above


def headroom_gpus(*, upper: float | None, booked: int, capacity: int, max_fraction: float) -> int:
    """GPUs of one type to hold for on-demand sessions in one hour.

    The forecast's upper band rounded up (None: no usable forecast, 0), minus the GPUs open
    bookings hold in that hour (they are reserved through their own allocations), at least 0 and
    at most ``max_fraction`` of the capacity that bookings leave.
    """
    want = math.ceil(upper - 1e-6) if upper is not None else 0
    free = max(0, capacity - booked)
    return max(0, min(want - booked, math.floor(free * max_fraction)))


def interactive_pool(
    hours: Sequence[tuple[float, Mapping[str, float]]],
    *,
    capacity: Mapping[str, int],
    max_fraction: float,
) -> tuple[tuple[float, str, int], ...]:
    """``PolicyConfig.interactive_pool`` from per-hour forecast upper bands ``(start_at, {type: upper})``.

    Each entry is the session demand itself (bookings are not subtracted: the engine adds
    booked GPUs to the pool), capped at ``max_fraction`` of the type's capacity like the
    headroom; zero entries are left out; ascending by hour, then type.
    """
    out: list[tuple[float, str, int]] = []
    for start_at, uppers in sorted(hours, key=lambda h: h[0]):
        for gpu_type in sorted(uppers):
            gpus = headroom_gpus(
                upper=uppers[gpu_type],
                booked=0,
                capacity=capacity.get(gpu_type, 0),
                max_fraction=max_fraction,
            )
            if gpus > 0:
                out.append((start_at, gpu_type, gpus))
    return tuple(out)


MIN_RESUMED_S = 60.0  # a resumed job is never predicted to need less than a minute more


def resumed_prediction(p50_s: float, p90_s: float, *, saved_s: float) -> tuple[float, float]:
    """A requeued job's (p50, p90): the prediction it ran with, less the progress its checkpoint
    kept from that run (``saved_s``; 0 for a job that lost everything), floored at
    `MIN_RESUMED_S`.  A job keeps the prediction made at its submission while it waits (the
    hourly task fills only missing ones), so subtracting each run's saved progress in turn leaves
    its submission prediction less all the progress kept so far."""
    if saved_s <= 0:
        return p50_s, p90_s
    return max(p50_s - saved_s, MIN_RESUMED_S), max(p90_s - saved_s, MIN_RESUMED_S)
