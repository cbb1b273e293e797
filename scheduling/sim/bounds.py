"""Bounds computed on the same workload as the policies (``bench.replay`` JSON ``bounds``).

* `session_floor`: the best any batch policy can do for on-demand sessions.  Every batch job
  is evicted instantly, so sessions compete only with each other and with booking owners while
  they use their GPUs.  Relaxed further so it can only be optimistic: GPUs are counted, not
  placed (no node boundaries, any type), booked-but-unused GPUs are free, and a waiting session
  starts as soon as enough GPUs are free even if an earlier one still waits (greedy, in submit
  order).  Sessions give up after the overlay's patience like in the replay.
* `busy_util_ceiling`: an upper bound on ``busy_utilization``, computed for each policy on its
  own run (``busy_util_ceiling`` in its metrics; ``bounds.busy_util_ceiling`` is the largest over
  the replayed policies, so it bounds each of them).  At every instant of the policy's queue
  windows (some queued job fits the empty cluster) it counts the GPUs in use plus the best
  fill of the free GPUs with the jobs waiting at that instant (`instant_fill`: the largest sum
  of waiting jobs' sizes that fits in the free GPUs, counted, not placed: no node boundaries, no
  GPU types), integrated over the windows and divided by capacity x window length.

  Why it bounds the policy: ``busy_utilization`` integrates useful GPUs over the same windows;
  useful GPUs <= GPUs in use <= GPUs in use + any fill >= 0, at every instant.  The gap between
  the two is idle capacity that a waiting job could have filled at that instant (reservations,
  draining, estimates, lost work); ``1 - busy_util_ceiling`` is idle capacity that no waiting job
  fitted (every waiting job wider than the free GPUs), which no choice at that instant could
  avoid.  Ignoring node boundaries and types only raises the fill, so the bound stays valid.

  Why it is per policy and not one number per workload: the windows are the policy's own (the
  instants when *its* queue holds a job), so a policy chooses its denominator.  On two GPUs with
  a 2-GPU 10 h job and a 1-GPU 1 h job submitted together, running the wide job first waits
  only while the cluster is full (busy 1.0); running the small one first waits at half use
  (0.5).  A bound valid for every conceivable policy is the maximum of that choice over all
  schedules, a hard combinatorial problem; a greedy relaxation is not one (the earlier
  "fill every gap at once" simulation, kept as `busy_util_packing`, gave 0.749 on the first
  3,000 KTH jobs while berth reached 0.773).
* `busy_util_packing`: an estimate, not a bound: ``busy_utilization`` of a relaxed cluster
  where every idle gap is filled at once with waiting jobs: at every event, waiting jobs start
  largest first (or in submit order: the better of the two counts) wherever enough GPUs of
  their type are free (counted, not placed: no reservations, no estimates, true runtimes, no
  preemption), after sessions and booking owners take theirs.  It shows what greedy packing
  reaches on the workload; a policy that keeps different jobs waiting may exceed it.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from typing import cast

from scheduling.sim.overlays import InteractiveSession, Overlay
from scheduling.sim.trace import Trace, TraceJob
from scheduling.stats import percentile


def _owner_intervals(overlay: Overlay) -> list[tuple[float, float, int, str | None]]:
    out: list[tuple[float, float, int, str | None]] = []
    grace = overlay.config.booking_grace_s
    for b in overlay.bookings:
        if b.use_start_at is None or b.use_end_at is None:
            continue
        if grace > 0 and b.use_start_at > b.start_at + grace:
            continue  # released as a no-show before the owner came
        out.append((b.use_start_at, min(b.use_end_at, b.end_at), b.gpu_count, b.gpu_type))
    return out


def session_floor(overlay: Overlay, *, capacity_gpus: int) -> dict[str, float]:
    """``{"interactive_wait_p95_s", "interactive_over_60s_share"}`` with batch evicted instantly."""
    patience = overlay.config.session_patience_s
    events: list[tuple[float, int, int, int]] = []  # (t, order, kind, index); kind 0 free 1 hold 2 arrive
    owners = _owner_intervals(overlay)
    for i, (start, end, gpus, _) in enumerate(owners):
        events.append((start, 1, 1, i))
        events.append((end, 0, 0, gpus))
    for i, s in enumerate(overlay.sessions):
        events.append((s.submit_at, 2, 2, i))
    heapq.heapify(events)
    free = capacity_gpus
    waiting: list[int] = []
    waits: list[float] = []
    while events:
        t, _, kind, value = heapq.heappop(events)
        if kind == 0:
            free += value
        elif kind == 1:
            free -= owners[value][2]  # owners always get their GPUs: the floor is for sessions
        elif kind == 2:
            waiting.append(value)
            if patience > 0:
                heapq.heappush(events, (overlay.sessions[value].submit_at + patience, 3, 4, 0))
        elif kind == 3:
            free += value
        still: list[int] = []
        for index in waiting:
            session = overlay.sessions[index]
            if patience > 0 and t - session.submit_at >= patience:
                waits.append(patience)
                continue
            if session.gpu_count <= free:
                free -= session.gpu_count
                waits.append(t - session.submit_at)
                heapq.heappush(events, (t + session.duration_s, 0, 3, session.gpu_count))
            else:
                still.append(index)
        waiting = still
    waits.extend(patience if patience > 0 else math.inf for _ in waiting)
    return {
        "interactive_wait_p95_s": percentile(waits, 95),
        "interactive_over_60s_share": sum(1 for w in waits if w > 60.0) / len(waits) if waits else 0.0,
    }


def instant_fill(free: int, sizes: Counter[int]) -> int:
    """The largest sum of job sizes (``sizes``: GPUs -> how many jobs) that fits in ``free`` GPUs:
    a bounded subset sum, as a bitset of reachable totals."""
    if free <= 0:
        return 0
    mask = (1 << (free + 1)) - 1
    reach = 1
    for size, count in sizes.items():
        if size <= 0 or size > free or count <= 0:
            continue
        for _ in range(min(count, free // size)):
            grown = (reach | (reach << size)) & mask
            if grown == reach:
                break
            reach = grown
        if reach >> free & 1:
            return free
    return reach.bit_length() - 1


def busy_util_packing(trace: Trace, overlay: Overlay, *, capacity_by_type: dict[str, int]) -> float:
    """The greedy packing estimate of ``busy_utilization`` (module docstring; not a bound): the
    better of two fill orders."""
    return max(
        _packed_busy_util(trace, overlay, capacity_by_type=capacity_by_type, largest_first=True),
        _packed_busy_util(trace, overlay, capacity_by_type=capacity_by_type, largest_first=False),
    )


def _packed_busy_util(
    trace: Trace, overlay: Overlay, *, capacity_by_type: dict[str, int], largest_first: bool
) -> float:
    """busy_utilization of the relaxed cluster that fills every gap at once; waiting jobs are
    tried largest first (``largest_first``) or in submit order, each started wherever it fits."""
    if sum(capacity_by_type.values()) <= 0 or not trace.jobs:
        return 0.0
    return _Packer(trace, overlay, capacity_by_type, largest_first=largest_first).run()


class _Packer:
    """The relaxed cluster of `_packed_busy_util`: free GPUs per type, an event queue, the jobs
    and sessions waiting, and what ran (segments) while some job waited (windows)."""

    def __init__(
        self, trace: Trace, overlay: Overlay, capacity_by_type: dict[str, int], *, largest_first: bool
    ) -> None:
        self.capacity_by_type = capacity_by_type
        self.capacity = sum(capacity_by_type.values())
        self.largest_first = largest_first
        self.free = Counter(capacity_by_type)
        self.types = sorted(capacity_by_type)
        # events: (t, order, kind, payload); kind 0 end (type, gpus), 1 owner in, 2 batch, 3 session
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        for start, end, gpus, gpu_type in _owner_intervals(overlay):
            self.push(start, 1, (end, gpus, gpu_type))
        for job in trace.jobs:
            self.push(job.submit_at, 2, job)
        self.patience = overlay.config.session_patience_s
        for session in overlay.sessions:
            self.push(session.submit_at, 3, session)
        self.waiting: dict[int, list[TraceJob]] = {}  # GPUs -> waiting jobs of that size, in submit order
        self.sessions: list[InteractiveSession] = []
        self.segments: list[tuple[float, float, int]] = []
        self.windows: list[tuple[float, float]] = []
        self.feasible_waiting = 0

    def fits_empty(self, gpus: int, gpu_type: str | None) -> bool:
        return gpus <= (self.capacity_by_type.get(gpu_type, 0) if gpu_type else self.capacity)

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq if kind else -1, kind, payload))

    def take(self, gpus: int, gpu_type: str | None) -> str | None:
        free = self.free
        if gpu_type is not None:
            return gpu_type if free[gpu_type] >= gpus else None
        fitting = [t for t in self.types if free[t] >= gpus]
        return min(fitting, key=lambda t: free[t]) if fitting else None

    def run(self) -> float:
        events = self.events
        last_t = 0.0
        while events:
            t = events[0][0]
            windows = self.windows
            if self.feasible_waiting and t > last_t:
                if windows and windows[-1][1] >= last_t:
                    windows[-1] = (windows[-1][0], t)
                else:
                    windows.append((last_t, t))
            last_t = t
            while events and events[0][0] <= t:
                _, _, kind, payload = heapq.heappop(events)
                self.handle(kind, payload)
            self.seat_sessions(t)
            largest_free = max(self.free.values())
            if largest_free > 0 and self.waiting and not self.largest_first:
                self.fill_in_submit_order(t, largest_free)
            elif largest_free > 0 and self.waiting:
                self.fill_largest_first(t, largest_free)
        return self.useful_share()

    def handle(self, kind: int, payload: object) -> None:
        free = self.free
        if kind == 0:
            freed_type, gpus = cast(tuple[str, int], payload)
            free[freed_type] += gpus
        elif kind == 1:
            end, gpus, owner_type = cast(tuple[float, int, str | None], payload)
            held = owner_type or max(self.types, key=lambda name: free[name])
            free[held] -= gpus  # owners take theirs first (may go negative: batch waits)
            self.push(end, 0, (held, gpus))
        elif kind == 2:
            job = cast(TraceJob, payload)
            self.waiting.setdefault(job.gpu_count, []).append(job)
            if self.fits_empty(job.gpu_count, job.gpu_type):
                self.feasible_waiting += 1
        elif kind == 3:
            arrived = cast(InteractiveSession, payload)
            self.sessions.append(arrived)
            if self.patience > 0:
                self.push(arrived.submit_at + self.patience, 4, None)

    def seat_sessions(self, t: float) -> None:
        patience = self.patience
        still_sessions: list[InteractiveSession] = []
        for session in self.sessions:
            if patience > 0 and t - session.submit_at >= patience:
                continue
            chosen = self.take(session.gpu_count, None)
            if chosen is None:
                still_sessions.append(session)
                continue
            self.free[chosen] -= session.gpu_count
            self.segments.append((t, t + session.duration_s, session.gpu_count))
            self.push(t + session.duration_s, 0, (chosen, session.gpu_count))
        self.sessions = still_sessions

    def start(self, t: float, job: TraceJob, size: int, chosen: str) -> int:
        """Start ``job`` on ``chosen``; the largest free count left."""
        self.free[chosen] -= size
        if self.fits_empty(size, job.gpu_type):
            self.feasible_waiting -= 1
        end = t + job.runtime_s
        self.segments.append((t, end, size))
        self.push(end, 0, (chosen, size))
        return max(self.free.values())

    def fill_in_submit_order(self, t: float, largest_free: int) -> None:
        queue = sorted(
            ((job.submit_at, size, job) for size, jobs in self.waiting.items() for job in jobs),
            key=lambda item: item[0],
        )
        waiting: dict[int, list[TraceJob]] = {}
        self.waiting = waiting
        for _, size, job in queue:
            chosen = self.take(size, job.gpu_type) if size <= largest_free else None
            if chosen is None:
                waiting.setdefault(size, []).append(job)
                continue
            largest_free = self.start(t, job, size, chosen)

    def fill_largest_first(self, t: float, largest_free: int) -> None:
        waiting = self.waiting
        for size in sorted((k for k in waiting if k <= largest_free), reverse=True):
            kept: list[TraceJob] = []
            for job in waiting[size]:
                chosen = self.take(size, job.gpu_type) if size <= largest_free else None
                if chosen is None:
                    kept.append(job)
                    continue
                largest_free = self.start(t, job, size, chosen)
            if kept:
                waiting[size] = kept
            else:
                del waiting[size]
            if largest_free <= 0:
                break

    def useful_share(self) -> float:
        """Useful GPU-time inside the waiting windows over the capacity in them."""
        windows = self.windows
        window_s = sum(end - start for start, end in windows)
        if window_s <= 0:
            return 0.0
        useful = 0.0
        starts = [w[0] for w in windows]
        for start, end, gpus in self.segments:
            index = max(0, bisect.bisect_right(starts, start) - 1)
            while index < len(windows) and windows[index][0] < end:
                w_start, w_end = windows[index]
                overlap = min(end, w_end) - max(start, w_start)
                if overlap > 0:
                    useful += overlap * gpus
                index += 1
        return useful / (self.capacity * window_s)
