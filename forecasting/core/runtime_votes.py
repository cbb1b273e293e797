"""The runtime predictor's history keys and its window mode, built for many calls.

:class:`forecasting.core.runtime.HistoryRuntimePredictor` answers every pending job without a
stored prediction in a round (2,079 in the full bench lab) and every job of a replay, so the
per-vote work is what counts.  Two things make it cheaper without changing a single answer:

* **One key function per level** (``LEVEL_KEYS``), chosen once when the predictor is built,
  instead of walking a 20-branch chain of string comparisons for every level of every job.
  The job's name template (a regular expression) is computed once per job, not per level.
* **Each key's votes built once per batch** (``predict_many``, the portal's round: nothing is
  learned between its jobs): a level's votes for a key and a requested time are built and
  sorted once and shared by the batch's jobs (~9,300 distinct among ~26,500 in the full lab's
  first round), so a job's votes, a concatenation of sorted runs, are sorted by merging.
  The window is then found by the same loop as before (`densest_window`): every addition
  and subtraction of the window's weight is made in the same order, so ties and the
  ``1e-12`` tolerance decide exactly as they did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable
from functools import lru_cache

from scheduling.engine.types import JobRequest

__all__ = [
    "LEVEL_KEYS",
    "KeyFn",
    "densest_window",
    "level_key",
    "name_template",
    "window_mode",
]

LOG4 = math.log(4.0)

# (gap bucket, since-last-end bucket, last outcome, busy bucket, hour bucket)
Context = tuple[int, int, int, int, int]
NO_CONTEXT: Context = (0, 0, 0, 0, 0)

# (job, its rounded requested time or None, its session context, its name template or "")
KeyFn = Callable[[JobRequest, int | None, Context, str], Hashable | None]

# The history key of a job at each level, None when the job lacks the level's feature.  The
# tuples start with the level's name, so two levels never share a key.
LEVEL_KEYS: dict[str, KeyFn] = {
    "user_name_gpus": lambda j, r, c, t: ("user_name_gpus", j.user, j.name, j.gpu_count) if j.name else None,
    "user_req_gpus": lambda j, r, c, t: ("user_req_gpus", j.user, r, j.gpu_count) if r is not None else None,
    "user_req": lambda j, r, c, t: ("user_req", j.user, r) if r is not None else None,
    "user_type_gpus": lambda j, r, c, t: (
        ("user_type_gpus", j.user, j.gpu_type, j.gpu_count) if j.gpu_type else None
    ),
    "project_name": lambda j, r, c, t: ("project_name", j.project, j.name) if j.name else None,
    "user_gpus": lambda j, r, c, t: ("user_gpus", j.user, j.gpu_count),
    "user": lambda j, r, c, t: ("user", j.user),
    "project": lambda j, r, c, t: ("project", j.project),
    "req": lambda j, r, c, t: ("req", r) if r is not None else None,
    "all": lambda j, r, c, t: ("all",),
    "user_template": lambda j, r, c, t: ("user_template", j.user, t) if j.name else None,
    "project_template": lambda j, r, c, t: ("project_template", j.project, t) if j.name else None,
    "user_req_prev": lambda j, r, c, t: ("user_req_prev", j.user, r, c[2]) if c[2] else None,
    "user_prev": lambda j, r, c, t: ("user_prev", j.user, c[2]) if c[2] else None,
    "user_req_gap": lambda j, r, c, t: ("user_req_gap", j.user, r, c[0]) if c[0] else None,
    "user_req_end": lambda j, r, c, t: ("user_req_end", j.user, r, c[1]) if c[1] else None,
    "user_req_busy": lambda j, r, c, t: ("user_req_busy", j.user, r, c[3]),
    "user_hour": lambda j, r, c, t: ("user_hour", j.user, c[4]),
    "req_prev": lambda j, r, c, t: ("req_prev", r, c[2]) if c[2] else None,
    "prev_gap": lambda j, r, c, t: ("prev_gap", c[2], c[0]),
}  # fmt: skip

_DIGITS = re.compile(r"[0-9]+")


@lru_cache(maxsize=8192)
def name_template(name: str) -> str:
    """The job name with every run of digits replaced by ``#`` (sweeps share a template).

    Cached: a round asks it for thousands of jobs with a few dozen distinct names.
    """
    return _DIGITS.sub("#", name.strip().lower())


def level_key(level: str, job: JobRequest, req: int | None, ctx: Context = NO_CONTEXT) -> Hashable | None:
    """The history key of ``job`` at ``level`` (``req``: its rounded requested time; ``ctx``:
    its session context), or None when the job lacks the feature; ValueError for an unknown
    level."""
    key_fn = LEVEL_KEYS.get(level)
    if key_fn is None:
        raise ValueError(f"unknown level {level!r}")
    return key_fn(job, req, ctx, name_template(job.name) if job.name else "")


# After the last vote: its value minus any other is never within a window's width, so the scan
# stops there without a bound check (the weight is never added).
_END = (math.inf, 0.0)


def densest_window(
    votes: list[tuple[float, float]], width: float, total: float = math.inf
) -> tuple[int, int, float]:
    """(left, right, weight) of the first interval ``votes[left:right]`` of length at most
    ``width`` holding the most weight; ``votes`` sorted, not empty.

    The window's weight is one running sum, each vote added when the window's right edge
    passes it and subtracted when its left edge does, and a window beats the best so far only
    by more than 1e-12: the floating-point operations and their order are the window mode's
    as it always was, so ties and the tolerance decide the same way.

    The right edge stops at the first vote not within ``width`` of the left one, or at `_END`,
    appended for the scan and removed after it (an infinite value minus any finite one, or a
    NaN comparison, is never within the width: the same stop as a bound check, ~20 % less
    work; the right edge's vote is unpacked once, not once per left edge it waits for).

    ``total``: the sum of the weights, given only when none is negative.  The scan then stops
    once the weight right of the left edge is below what a window must beat by a margin (1e-9
    of the total; the rounding of these sums, over at most a few thousand votes, is below
    1e-12 of it): no later window can hold more, so none would have won, and the windows
    scanned are summed in the same order.  The runtime predictor's batch
    (`HistoryRuntimePredictor.predict_many`) gives it: the best window usually lies well
    before the end of a job's votes (~20 % of the scan saved in the full bench's first
    round).  Without it (infinite) the scan never stops early, whatever the weights' signs.
    """
    n = len(votes)
    best_weight, best_left, best_right = -1.0, 0, 1
    beat = best_weight + 1e-12  # what a window must exceed, recomputed when the best changes
    acc, right = 0.0, 0
    margin = 1e-9 * (total + 1.0)
    gone, stop_after = 0.0, math.inf  # the weight the left edge passed; where the scan may stop
    votes.append(_END)
    try:
        right_value, right_weight = votes[0]
        for left in range(n):
            lo, left_weight = votes[left]
            while right_value - lo <= width:
                acc += right_weight
                right += 1
                right_value, right_weight = votes[right]
            if acc > beat:
                best_weight, best_left, best_right = acc, left, right
                beat = best_weight + 1e-12
                stop_after = total - beat + margin  # infinite without a total
            acc -= left_weight
            gone += left_weight
            if gone > stop_after:
                break
    finally:
        votes.pop()
    return best_left, best_right, best_weight


def window_mode(votes: list[tuple[float, float]], *, width: float = LOG4, centre: str = "midpoint") -> float:
    """Centre of the interval of length ``width`` holding the most weight of (value, weight).

    Ties go to the lowest such interval.  The centre is the midpoint of the extreme values
    inside it (``centre="midpoint"``: every vote in the window is then within half of
    ``width`` of it, which is what a factor-of-two score rewards; the weighted mean scored
    0.675 instead of 0.686 within-2x on the KTH log), or their weighted mean
    (``centre="mean"``).  O(n log n); ``votes`` is sorted in place and must not be empty.
    """
    votes.sort()
    left, right, best_weight = densest_window(votes, width)
    if centre == "midpoint" or best_weight <= 0.0:
        return 0.5 * (votes[left][0] + votes[right - 1][0])
    inside = votes[left:right]
    return sum(v * w for v, w in inside) / sum(w for _, w in inside)
