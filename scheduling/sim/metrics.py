"""Replay metrics (DESIGN §8 contract), computed from a `ReplayRecord`.

Definitions:
* ``utilization``: useful GPU-time / (capacity x span), span = first arrival to last end.
  Useful GPU-time counts batch work that was kept (not later lost to a preemption),
  interactive sessions and booking owners' use.
* ``busy_utilization``: the same ratio restricted to the instants when some queued job could
  run on the empty cluster (its size fits the cluster's GPUs of a matching type); 0.0 when no
  job ever had to wait.
* Batch waits: ``wait = completion - first submit - runtime`` (the time a job was not making
  kept progress, so requeues and lost work count); equal to start - submit for jobs never
  preempted.  ``jct = completion - first submit``; bounded slowdown ``max(1, jct / max(runtime, 10 s))``.
  A job still unfinished when the replay ends (e.g. larger than a static batch partition) is
  counted with the replay's end as its completion (a censored, optimistic value) and
  reported in ``unfinished_jobs``: leaving it out would reward a policy for never running it.
* ``interactive_wait_p95_s``: on-demand sessions, start - submit (nearest-rank p95); a session
  whose user gave up counts with the time it waited (its patience).
* ``interactive_over_60s_share``: sessions that waited more than 60 s or gave up, over all
  sessions.
* ``bookings_honored``: share of bookings whose owner showed up and got all booked GPUs within
  60 s of arriving (a fixed threshold, whatever the policy's grace; no-shows, including owners
  later than the release grace, are not counted).  1.0 when there is nothing to honor.
* ``jain_fairness``: Jain's index over users' mean bounded slowdown of batch jobs.
* ``idle_gpu_hours``: the engine's idle reasons integrated over time; free GPUs the plan did
  not explain are reported as ``unexplained``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from scheduling.engine.types import IdleReason
from scheduling.stats import jain_index, percentile

SLOWDOWN_FLOOR_S = 10.0
UNEXPLAINED = "unexplained"


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A batch job as replayed."""

    id: str
    user: str
    gpu_count: int
    submit_at: float  # first submission
    runtime_s: float  # true work
    end_at: float | None  # None: never finished within the replay


@dataclass(frozen=True, slots=True)
class BookingOutcome:
    id: str
    is_honored: bool | None  # None: the owner never came (not counted)
    owner_wait_s: float = 0.0


@dataclass(slots=True)
class ReplayRecord:
    """Everything a replay observed; the input of `compute_metrics`."""

    capacity_gpus: int
    span_start: float = 0.0
    span_end: float = 0.0
    jobs: list[JobOutcome] = field(default_factory=list)
    interactive_waits_s: list[float] = field(default_factory=list)
    bookings: list[BookingOutcome] = field(default_factory=list)
    # (start, useful_end, gpus): useful_end < end when a preemption threw work away
    segments: list[tuple[float, float, int]] = field(default_factory=list)
    # disjoint, sorted intervals during which some queued job could run on the empty cluster
    queue_windows: list[tuple[float, float]] = field(default_factory=list)
    # GPU-seconds that could have been busy in the queue windows (``busy_util_ceiling``)
    ceiling_gpu_s: float = 0.0
    useful_gpu_s_by_kind: dict[str, float] = field(default_factory=dict)  # batch / interactive / booking
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    restore_gpu_s: float = 0.0  # part of lost_gpu_s: restores after resuming from a checkpoint
    idle_gpu_s: dict[str, float] = field(default_factory=dict)
    round_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def add_queue_window(self, start: float, end: float) -> None:
        """Append [start, end), merging with the last window when they touch."""
        if end <= start:
            return
        if self.queue_windows and self.queue_windows[-1][1] >= start:
            last_start, last_end = self.queue_windows[-1]
            self.queue_windows[-1] = (last_start, max(last_end, end))
        else:
            self.queue_windows.append((start, end))


def windows_overlap(windows: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of [start, end) covered by sorted disjoint ``windows`` (O(log n) with a prefix)."""
    return _Coverage(windows).between(start, end)


class _Coverage:
    def __init__(self, windows: list[tuple[float, float]]) -> None:
        self._starts = [w[0] for w in windows]
        self._windows = windows
        self._prefix = [0.0]
        for w_start, w_end in windows:
            self._prefix.append(self._prefix[-1] + (w_end - w_start))

    def upto(self, t: float) -> float:
        """Covered length in (-inf, t)."""
        index = bisect.bisect_right(self._starts, t) - 1
        if index < 0:
            return 0.0
        w_start, w_end = self._windows[index]
        return self._prefix[index] + (min(t, w_end) - w_start)

    def between(self, start: float, end: float) -> float:
        return max(0.0, self.upto(end) - self.upto(start)) if end > start else 0.0


# GPUs asked, in buckets: (label, smallest, largest); the last is open-ended.
WIDTH_BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("1", 1, 1),
    ("2-4", 2, 4),
    ("5-16", 5, 16),
    ("17-32", 17, 32),
    ("33-64", 33, 64),
    ("65+", 65, math.inf),
)


def wait_by_width(widths: list[int], waits: list[float]) -> dict[str, dict[str, float]]:
    """Batch jobs, mean and largest wait per width bucket (`WIDTH_BUCKETS`), with each bucket's
    share of all the wait: a mean wait can be a few wide jobs waiting for months (the whole-trace
    KTH overlay: jobs of 17 GPUs or more, 9 % of the jobs, held 88 % of berth's wait)."""
    total = sum(waits)
    out: dict[str, dict[str, float]] = {}
    for label, low, high in WIDTH_BUCKETS:
        inside = [wait for width, wait in zip(widths, waits, strict=True) if low <= width <= high]
        if inside:
            out[label] = {
                "jobs": len(inside),
                "wait_mean_s": sum(inside) / len(inside),
                "wait_max_s": max(inside),
                "wait_share": sum(inside) / total if total > 0 else 0.0,
            }
    return out


def compute_metrics(record: ReplayRecord) -> dict[str, Any]:
    """The contract's per-policy metrics dict from a replay record."""
    capacity = record.capacity_gpus
    span = max(record.span_end - record.span_start, 0.0)
    useful_gpu_s = sum((useful_end - start) * gpus for start, useful_end, gpus in record.segments)
    coverage = _Coverage(record.queue_windows)
    window_s = coverage.upto(math.inf) if record.queue_windows else 0.0
    useful_in_windows = sum(
        coverage.between(start, useful_end) * gpus for start, useful_end, gpus in record.segments
    )

    unfinished = sum(1 for job in record.jobs if job.end_at is None)
    widths: list[int] = []
    waits: list[float] = []
    jcts: list[float] = []
    slowdowns: list[float] = []
    per_user: dict[str, list[float]] = {}
    for job in record.jobs:
        end_at = job.end_at if job.end_at is not None else max(record.span_end, job.submit_at + job.runtime_s)
        jct = end_at - job.submit_at
        wait = max(0.0, jct - job.runtime_s)
        slowdown = max(1.0, jct / max(job.runtime_s, SLOWDOWN_FLOOR_S))
        widths.append(job.gpu_count)
        waits.append(wait)
        jcts.append(jct)
        slowdowns.append(slowdown)
        per_user.setdefault(job.user, []).append(slowdown)

    counted = [b for b in record.bookings if b.is_honored is not None]
    honored = sum(1 for b in counted if b.is_honored)
    idle = {reason.value: 0.0 for reason in IdleReason}
    for reason, gpu_s in record.idle_gpu_s.items():
        idle[reason] = idle.get(reason, 0.0) + gpu_s
    if not idle.get(UNEXPLAINED):
        idle.pop(UNEXPLAINED, None)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return {
        "utilization": useful_gpu_s / (capacity * span) if capacity and span else 0.0,
        "busy_utilization": useful_in_windows / (capacity * window_s) if capacity and window_s else 0.0,
        "busy_util_ceiling": record.ceiling_gpu_s / (capacity * window_s) if capacity and window_s else 0.0,
        "wait_mean_s": mean(waits),
        "wait_p95_s": percentile(waits, 95),
        "wait_by_width": wait_by_width(widths, waits),
        "jct_mean_s": mean(jcts),
        "bounded_slowdown_mean": mean(slowdowns),
        "interactive_wait_p95_s": percentile(record.interactive_waits_s, 95),
        "interactive_over_60s_share": (
            sum(1 for w in record.interactive_waits_s if w > 60.0) / len(record.interactive_waits_s)
            if record.interactive_waits_s
            else 0.0
        ),
        "bookings_honored": honored / len(counted) if counted else 1.0,
        "preemptions": record.preemptions,
        "lost_gpu_hours": record.lost_gpu_s / 3600.0,
        "jain_fairness": jain_index([mean(v) for _, v in sorted(per_user.items())]),
        "idle_gpu_hours": {reason: gpu_s / 3600.0 for reason, gpu_s in idle.items()},
        "round_ms_p99": percentile(record.round_ms, 99),
        "wall_s": record.wall_s,
        "unfinished_jobs": unfinished,
        "useful_gpu_hours": useful_gpu_s / 3600.0,
        "useful_gpu_hours_by_kind": {
            kind: gpu_s / 3600.0 for kind, gpu_s in record.useful_gpu_s_by_kind.items()
        },
        "rounds": len(record.round_ms),
        **record.extra,
    }
