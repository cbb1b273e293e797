"""The time-aware interactive pool: forecast session demand hour by hour (berth).

``PolicyConfig.interactive_pool`` lists ``(hour start_at, gpu_type or "*", GPUs)``: the forecast
p95 of on-demand session demand for each coming hour.  A GPU type's level at an instant is the
sum of the entries of its hour that name the type or ``"*"``; after the last listed hour the
last level holds (the forecast says nothing later, and the last level is the best guess).
Booked GPUs are held by the bookings themselves, so the pool's size each hour is this forecast
plus what is booked.

What the scheduler asks of it:

* `level_at`: the level now, held idle (lendable to preemptible work) like
  ``interactive_headroom``, which it replaces when a forecast exists;
* `peak`: the highest level over a job's expected run, booked GPUs included (`booked_windows`),
  for the admission of non-preemptible work (which sessions cannot take back: it must leave the
  pool's peak free until its p90 end);
* `next_rise`: when the level next goes up, so work that restarts from scratch borrows pool
  GPUs only if it is predicted to be gone by then.

An empty ``interactive_pool`` means no forecast over time: `PoolForecast.of` returns None and
the scheduler keeps the old behaviour (``interactive_headroom`` as the level for now).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from scheduling.engine.types import Booking, PolicyConfig

HOUR_S = 3_600.0

# (start_at, end_at, GPU type or "*", GPUs) of each booking not yet over
BookedWindows = tuple[tuple[float, float, str, int], ...]


def booked_windows(bookings: Iterable[Booking], now: float) -> BookedWindows:
    """The windows of the bookings not over at ``now``, for `PoolForecast.peak`."""
    return tuple((b.start_at, b.end_at, b.gpu_type or "*", b.gpu_count) for b in bookings if b.end_at > now)


@dataclass(frozen=True, slots=True)
class PoolForecast:
    """Hourly levels per type key (a GPU type name or ``"*"``), ascending start times."""

    starts: tuple[float, ...]
    levels: dict[str, tuple[int, ...]]  # key -> level at each of ``starts``

    @staticmethod
    def of(policy: PolicyConfig) -> PoolForecast | None:
        """The forecast of a policy, or None when it has none; the same (immutable) forecast
        again while the very same ``interactive_pool`` comes back (a replay changes it hourly
        and plans many rounds in between)."""
        entries = policy.interactive_pool
        if not entries:
            return None
        last = _LAST[0]
        if last is not None and last[0] is entries:  # the entry keeps ``entries`` alive
            return last[1]
        found = PoolForecast.build(entries)
        _LAST[0] = (entries, found)
        return found

    @staticmethod
    def build(entries: tuple[tuple[float, str, int], ...]) -> PoolForecast:
        """The forecast of ``interactive_pool`` entries (see the module docstring)."""
        starts = tuple(sorted({at for at, _name, _gpus in entries}))
        index = {at: i for i, at in enumerate(starts)}
        levels: dict[str, list[int]] = {}
        for at, name, gpus in entries:
            row = levels.setdefault(name, [0] * len(starts))
            row[index[at]] += max(0, int(gpus))
        return PoolForecast(starts=starts, levels={k: tuple(v) for k, v in levels.items()})

    def _keys(self, types: Collection[str]) -> list[str]:
        return [key for key in self.levels if key == "*" or key in types]

    def _slot(self, at: float) -> int:
        """Index of the hour containing ``at`` (the first hour for instants before it)."""
        return max(0, bisect.bisect_right(self.starts, at) - 1)

    def level_at(self, types: Collection[str], at: float) -> int:
        """Forecast session GPUs of ``types`` at an instant."""
        slot = self._slot(at)
        return sum(self.levels[key][slot] for key in self._keys(types))

    def type_levels_at(self, at: float) -> tuple[tuple[str, int], ...]:
        """(type key, level) at an instant, in the shape of ``interactive_headroom``."""
        slot = self._slot(at)
        return tuple((key, row[slot]) for key, row in self.levels.items() if row[slot] > 0)

    def peak(
        self,
        types: Collection[str],
        start: float,
        end: float,
        *,
        only_named: bool = False,
        booked: BookedWindows = (),
    ) -> int:
        """Highest forecast level of ``types`` over [start, end], plus the GPUs of the
        ``booked`` windows of those types open at the same instant (``only_named``: entries
        and bookings that name one of the types, without the ``"*"`` ones).

        Booked GPUs are held by their bookings, so sessions at the forecast level and the
        bookings together are what non-preemptible work must leave free."""
        keys = [k for k in self._keys(types) if not (only_named and k == "*")]
        wanted = set(types)
        windows = [
            (b_start, b_end, gpus)
            for b_start, b_end, key, gpus in booked
            if b_start <= end and b_end > start and (key in wanted or (key == "*" and not only_named))
        ]
        if not keys and not windows:
            return 0
        first = self._slot(start)
        last = self._slot(end) if end > start else first
        if not windows:
            return max(sum(self.levels[key][slot] for key in keys) for slot in range(first, last + 1))
        # the sum is a step function: its maximum is at the start, an hour start or a booking start
        instants = {start, *(self.starts[slot] for slot in range(first + 1, last + 1))}
        instants.update(b_start for b_start, _e, _g in windows if b_start > start)
        best = 0
        for at in instants:
            slot = self._slot(at)
            level = sum(self.levels[key][slot] for key in keys)
            level += sum(gpus for b_start, b_end, gpus in windows if b_start <= at < b_end)
            best = max(best, level)
        return best

    def next_rise(self, types: Collection[str], at: float) -> float:
        """Start of the first later hour whose level exceeds the level at ``at``; the end of the
        forecast when none does (nothing is known beyond it)."""
        keys = self._keys(types)
        slot = self._slot(at)
        now_level = sum(self.levels[key][slot] for key in keys)
        for later in range(slot + 1, len(self.starts)):
            if sum(self.levels[key][later] for key in keys) > now_level:
                return self.starts[later]
        return self.starts[-1] + HOUR_S

    def low_window(
        self, types: Collection[str], at: float, duration_s: float, room: int, *, booked: BookedWindows = ()
    ) -> float | None:
        """Earliest hour start or booking end (or ``at`` itself) from which the level, booked
        GPUs included, stays at most ``room`` for ``duration_s``, within the forecast; None when
        there is none."""
        ends = {b_end for _s, b_end, _k, _g in booked if b_end > at}
        candidates = sorted({at, *(s for s in self.starts if s > at), *ends})
        last = self.starts[-1] + HOUR_S if self.starts else at
        for start in candidates:
            if start > last and start != at:
                break
            if self.peak(types, start, start + duration_s, booked=booked) <= room:
                return start
        return None


# the last ``interactive_pool`` asked for and its forecast (`PoolForecast.of`)
_LAST: list[tuple[tuple[tuple[float, str, int], ...], PoolForecast] | None] = [None]


def ends_before_rise(forecast: PoolForecast, types: Collection[str], now: float, end_at: float) -> bool:
    """Whether work expected to end at ``end_at`` (its p90 under berth) is gone before the
    pool's next demand rise after ``now``: restartable work may then take pool GPUs (or run
    into the forecast peak's room), since no session is expected to need them before it ends."""
    return end_at <= forecast.next_rise(types, now)
