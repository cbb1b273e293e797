"""Online runtime prediction (p50/p90) from the history of finished jobs.

The engine backfills on these quantiles instead of the user's wall-clock limit, and the
portal shows them as ETAs.  The simulator calls :meth:`HistoryRuntimePredictor.predict`
and :meth:`HistoryRuntimePredictor.observe` for every job of a replay, so both are cheap:
bounded per-key windows, no scans over the whole history, amortised refreshes.

How a prediction is made (all in log space, where runtimes are roughly symmetric):

* **Keys**, from most to least specific: (user, name, GPUs), (user, requested time, GPUs),
  (user, requested time), (user, GPU type, GPUs), (project, name), (user, GPUs), user,
  project, requested time, everyone.  Keys whose feature a job lacks (no name, no GPU type,
  no requested time: most traces) are skipped for it.  Each key
  keeps the last ``window`` finished jobs: log runtime and, when the job had a requested
  time, log(runtime / requested).
* **Name templates**: (user, name) and (project, name) with every run of digits in the
  name replaced, so the runs of a sweep (``sweep-lr0.01-seed3``) pool together.
* **Session keys** (``CONTEXT_LEVELS``): the same user's jobs split by what the portal
  knows at submit time about the user's own recent activity: the outcome of the user's
  last finished job (ended within a minute, hit its limit, failed, other), the time since
  the user's previous submission and since the user's last job ended (log buckets), how
  many of the user's jobs are queued or running, and the hour of the day (the phase of
  ``submit_at`` modulo a day, so an unknown time zone or epoch does not matter).  The
  predictor derives all of them from the calls it sees: a job's first :meth:`predict` is
  its submission, :meth:`observe` its end (``ended_at``/``status`` when the caller has
  them, else the newest submit time seen stands in for the clock).
* **Pooling.** Every key that has history votes with its recent jobs, weighted by the key's
  level weight and by recency (the newest job of a key weighs 1, each older one ``decay``
  times less).  When the job has a requested time, votes are ratios scaled by *this* job's
  requested time: a user who asks for 4 h and runs 1 h will likely run 15 min when asking
  for 1 h.  The same user with the same limit needs no ratio: both coincide there.
* **Level weights are learned online** (``learn_weights``): each finished job scores every
  level that voted for it by the share of that level's vote weight that fell within a
  factor of two of the actual runtime, and the weights move towards each level's
  posterior responsibility (an online EM step of a mixture of experts, step ``weight_step``).
  The weights start from ``levels``; what a log's users make predictable (limits, sessions,
  GPU counts) decides which keys end up counting, with no per-trace constants.
* **Window mode, not median.** The p50 is the centre of the log-window of width log 4 that
  holds the most vote weight.  Runtimes are often bimodal (a job fails within a minute or
  runs close to its limit); a median lands between the modes and is wrong for both, while
  the densest factor-of-two window is right for the larger group.
* **p90** is the p50 times a conformal factor: the 90th percentile of the last
  ``residual_window`` residuals log(actual / p50) of this predictor, so the band is
  calibrated online and needs no distributional assumption; kept per outcome of the
  user's last job once a group has 100 residuals (after a crash the next runtime is less
  certain than after a run to the limit: on the KTH log a global factor covers 0.835 of
  the jobs after a short one and 0.918 after one that hit its limit; per group 0.88-0.90).
* Both quantiles are capped at the requested time when the job has one: jobs are killed at
  their limit.

Runtimes are floored at ``min_runtime_s`` so a zero-length job does not produce log(0).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Protocol

from forecasting.core.runtime_votes import (
    LEVEL_KEYS,
    LOG4,
    Context,
    KeyFn,
    densest_window,
    level_key,
    name_template,
    window_mode,
)
from scheduling.engine.types import JobRequest

__all__ = ["CONTEXT_LEVELS", "DEFAULT_LEVELS", "HistoryRuntimePredictor", "RuntimePredictor", "window_mode"]

_LOG2 = math.log(2.0)
_LOG_SHORT = math.log(60.0)  # a job that ended within a minute did not really run
_LOG_AT_LIMIT = math.log(0.9)  # ran to (nearly) its requested time
_DAY_S = 86_400.0


class RuntimePredictor(Protocol):
    """What the engine and the simulator need from a runtime model."""

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """Return (p50_s, p90_s) for a job that has not finished yet."""
        ...

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Record that ``job`` finished after ``runtime_s`` seconds."""
        ...


# (level name, initial vote weight).  More specific keys weigh more; the broad ones only
# matter for new users or new limits, where they are all there is.
DEFAULT_LEVELS: tuple[tuple[str, float], ...] = (
    ("user_name_gpus", 1.0),
    ("user_req_gpus", 1.0),
    ("user_req", 0.5),
    ("user_type_gpus", 0.5),
    ("project_name", 0.3),
    ("user_gpus", 0.3),
    ("user", 0.25),
    ("project", 0.1),
    ("req", 0.1),
    ("all", 0.02),
)

# The user's session state at submit time (see the module docstring), and the job name with
# its numbers dropped: "sweep-lr0.01-seed3" and "sweep-lr0.1-seed4" are one kind of work.
CONTEXT_LEVELS: tuple[tuple[str, float], ...] = (
    ("user_template", 0.5),
    ("project_template", 0.2),
    ("user_req_prev", 0.5),
    ("user_prev", 0.25),
    ("user_req_gap", 0.5),
    ("user_req_end", 0.5),
    ("user_req_busy", 0.5),
    ("user_hour", 0.25),
    ("req_prev", 0.1),
    ("prev_gap", 0.02),
)

# Bucket edges (seconds) of the time since the user's previous submission / last end.
_GAP_EDGES_S = (60.0, 600.0, 3600.0, 6 * 3600.0, _DAY_S)

_Context = Context
# A job's votes: (values, weights, spans), each span (level index, start, end) saying which
# votes a level cast, in level order and, within a level, newest first.
_Votes = tuple[list[float], list[float], list[tuple[int, int, int]]]
# One level's votes for one key and one requested time, in a batch: values and weights as in
# _Votes, the same (value, weight) pairs sorted, (level index, values, weights), the part of a
# job's votes it is (built once: ~26,500 uses of ~9,300 segments in a round's batch), and the
# sum of its weights.
_Segment = tuple[
    list[float], list[float], list[tuple[float, float]], tuple[int, list[float], list[float]], float
]
_NO_SEGMENT: _Segment = ([], [], [], (-1, [], []), 0.0)  # a key without history
# A job's votes as the segments they come from: (level index, values, weights), in level
# order (without the pairs: a kept prediction should not hold them).
_Parts = list[tuple[int, list[float], list[float]]]


def _votes_of(parts: _Parts) -> _Votes:
    """The votes of ``parts`` as one (values, weights, spans)."""
    values: list[float] = []
    weights: list[float] = []
    spans: list[tuple[int, int, int]] = []
    for i, seg_values, seg_weights in parts:
        start = len(values)
        values += seg_values
        weights += seg_weights
        spans.append((i, start, len(values)))
    return values, weights, spans


def _bucket(gap_s: float | None) -> int:
    """0 when unknown, else 1 + the number of edges at or below ``gap_s``."""
    if gap_s is None:
        return 0
    for i, edge in enumerate(_GAP_EDGES_S):
        if gap_s < edge:
            return i + 1
    return len(_GAP_EDGES_S) + 1


def _requested(job: JobRequest) -> float | None:
    """The job's requested time when it is a usable positive number, else None."""
    req = job.requested_s
    return req if req is not None and math.isfinite(req) and req > 0 else None


def _upper_decile(values: deque[float]) -> float:
    """The empirical 90% quantile (the smallest value at or above 90% of them)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


class _UserState:
    """What the predictor has seen of one user: submissions, active jobs, the last end."""

    __slots__ = ("active", "last_end_at", "last_log_ratio", "last_log_rt", "last_status", "last_submit_at")

    def __init__(self) -> None:
        self.last_submit_at: float | None = None
        self.last_end_at: float | None = None
        self.last_log_rt: float | None = None
        self.last_log_ratio: float | None = None
        self.last_status: str | None = None
        self.active: set[str] = set()


class HistoryRuntimePredictor:
    """p50/p90 runtimes learned online from finished jobs; see the module docstring.

    ``window`` bounds each key's history (memory is O(keys * window)); ``decay`` is the
    per-job recency weight; ``levels`` lists the keys and their initial vote weights
    (``DEFAULT_LEVELS + CONTEXT_LEVELS`` unless given); ``learn_weights`` turns on the
    online re-weighting of the levels; ``default_s`` answers before any job finished when a
    job has no requested time.  ``predict`` of a job already seen is pure with respect to
    the history: calling it twice gives the same answer (its session context is fixed at
    its first prediction).
    """

    def __init__(
        self,
        *,
        window: int = 16,
        decay: float = 0.85,
        levels: tuple[tuple[str, float], ...] | None = None,
        learn_weights: bool = True,
        weight_step: float = 0.003,
        residual_window: int = 500,
        refresh_every: int = 50,
        default_s: float = 3600.0,
        min_runtime_s: float = 1.0,
    ) -> None:
        if levels is None:
            levels = DEFAULT_LEVELS + CONTEXT_LEVELS
        probe = JobRequest(id="", user="", project="", gpu_count=1, submit_at=0.0)
        # "LEVEL:raw" votes with the raw runtimes of LEVEL's key instead of ratios scaled to
        # this job's requested time (same history, another reading of it).
        self._key_levels = [level.removesuffix(":raw") for level, _ in levels]
        self._is_raw = [level.endswith(":raw") for level, _ in levels]
        plain = {level for level, is_raw in zip(self._key_levels, self._is_raw, strict=True) if not is_raw}
        for level, is_raw in zip(self._key_levels, self._is_raw, strict=True):
            level_key(level, probe, None)
            if is_raw and level not in plain:
                raise ValueError(f"{level}:raw needs {level} among the levels")
        # (level index, key function, is raw): the levels' keys resolved once, not per vote.
        self._level_fns: list[tuple[int, KeyFn, bool]] = [
            (i, LEVEL_KEYS[level], is_raw)
            for i, (level, is_raw) in enumerate(zip(self._key_levels, self._is_raw, strict=True))
        ]
        self.window = window
        self.decay = decay
        self.levels = levels
        self.learn_weights = learn_weights
        self.weight_step = weight_step
        self.refresh_every = refresh_every
        self.default_s = default_s
        self.min_runtime_s = min_runtime_s
        # key -> recent (log runtime, log runtime/requested or None), oldest first
        self._history: dict[Hashable, deque[tuple[float, float | None]]] = {}
        total = sum(weight for _, weight in levels) or 1.0
        self._alpha = [weight / total for _, weight in levels]
        self._decay_pows = [decay**k for k in range(window)]
        self._residuals: deque[float] = deque(maxlen=residual_window)
        self._log_q90 = math.log(3.0)  # prior band until enough residuals exist
        # The same per outcome of the user's last job (the session context's third field):
        # after a crash the next runtime is less certain than after a run to the limit.
        self._group_residuals: dict[int, deque[float]] = {}
        self._group_q90: dict[int, float] = {}
        self._min_group_residuals = 100
        self._since_refresh = 0
        self._n_observed = 0
        self._clock = -math.inf  # newest submit or end time seen
        self._users: dict[str, _UserState] = {}
        # job id -> session context at its first prediction (bounded like _predicted)
        self._contexts: dict[str, _Context] = {}
        self._context_users: dict[str, str] = {}  # job id -> user, to forget a stale job
        # job id -> (observation count when predicted, log p50); reused while nothing new
        # was observed, and scored against the actual runtime when the job finishes.
        self._predicted: dict[str, tuple[int, float]] = {}
        self._max_predicted = 200_000
        # job id -> the votes of its latest prediction, which observe() scores to learn the
        # level weights (bounded: about 2 x 200 floats a job; in a batch, references to lists
        # shared with other jobs')
        self._pending_votes: dict[str, _Votes | _Parts] = {}
        self._max_pending_votes = 20_000
        # During `predict_many` only: (level index, key, log requested time or None) -> that
        # level's votes for the key, shared by every job of the batch asking it (a round asks
        # ~2,000 jobs with ~9,300 distinct segments among ~26,500).  Dropped with the batch, so
        # a worker does not keep (and its collector does not walk) them between rounds.
        self._segments: dict[tuple[int, Hashable, float | None], _Segment] | None = None
        self._max_segments = 100_000
        # During `predict_many` only: each level's weight times every recency decay.
        self._weight_rows: list[list[float]] | None = None
        # During `predict_many` only: whether every vote weight is >= 0 (`densest_window`'s
        # early stop needs it)
        self._is_weight_bounded = False

    @property
    def n_observed(self) -> int:
        """How many finished jobs the predictor has learned from."""
        return self._n_observed

    @property
    def level_weights(self) -> dict[str, float]:
        """The current (learned) vote weight of each level, summing to 1."""
        return {level: alpha for (level, _), alpha in zip(self.levels, self._alpha, strict=True)}

    # ---- session context ----

    def _user(self, name: str) -> _UserState:
        state = self._users.get(name)
        if state is None:
            state = self._users[name] = _UserState()
        return state

    def _context(self, job: JobRequest) -> _Context:
        """The job's session context, fixed (and the submission recorded) on first sight."""
        ctx = self._contexts.get(job.id)
        if ctx is not None:
            return ctx
        state = self._user(job.user)
        submit = job.submit_at
        gap = None if state.last_submit_at is None else max(submit - state.last_submit_at, 0.0)
        since_end = None if state.last_end_at is None else max(submit - state.last_end_at, 0.0)
        prev = 0
        if state.last_log_rt is not None:
            if state.last_log_rt < _LOG_SHORT:
                prev = 1
            elif state.last_log_ratio is not None and state.last_log_ratio >= _LOG_AT_LIMIT:
                prev = 2
            elif state.last_status == "failed":
                prev = 3
            else:
                prev = 4
        busy = min(len(state.active), 3)
        hour_b = int((submit % _DAY_S) // (6 * 3600.0)) if math.isfinite(submit) else 0
        ctx = (_bucket(gap), _bucket(since_end), prev, busy, hour_b)
        if len(self._contexts) >= self._max_predicted:
            # Jobs seen but never finished (cancelled): forget the oldest.
            for stale in list(self._contexts)[: self._max_predicted // 10]:
                del self._contexts[stale]
                owner = self._users.get(self._context_users.pop(stale, ""))
                if owner is not None:
                    owner.active.discard(stale)
        self._contexts[job.id] = ctx
        self._context_users[job.id] = job.user
        if state.last_submit_at is None or submit >= state.last_submit_at:
            state.last_submit_at = submit
        state.active.add(job.id)
        if math.isfinite(submit):
            self._clock = max(self._clock, submit)
        return ctx

    # ---- prediction ----

    def _segment(self, i: int, key: Hashable, log_req: float | None) -> _Segment:
        """Level ``i``'s votes for ``key`` in a batch: ratios scaled to ``log_req``, raw runtimes
        without it, newest first, weighted by the level's weight (computed once for the batch:
        the same products) and the recency decay; and the pairs sorted once for every job that
        merges them."""
        hist = self._history.get(key)
        if not hist or self._weight_rows is None:
            return _NO_SEGMENT
        if log_req is None:
            values = [rt for rt, _ in reversed(hist)]
        else:
            values = [rt if ratio is None else ratio + log_req for rt, ratio in reversed(hist)]
        weights = self._weight_rows[i][: len(hist)]
        pairs = sorted(zip(values, weights, strict=True))
        return values, weights, pairs, (i, values, weights), sum(weights)

    def _votes_one(
        self, job: JobRequest, ctx: _Context, *, log_req: float | None, req: int | None, template: str
    ) -> tuple[_Votes, list[tuple[float, float]]]:
        """`_votes` outside a batch: the votes built for this job alone."""
        values: list[float] = []
        weights: list[float] = []
        spans: list[tuple[int, int, int]] = []
        history = self._history
        pows = self._decay_pows
        alphas = self._alpha
        for i, key_fn, is_raw in self._level_fns:
            key = key_fn(job, req, ctx, template)
            hist = None if key is None else history.get(key)
            if not hist:
                continue
            start = len(values)
            if log_req is None or is_raw:
                values += [rt for rt, _ in reversed(hist)]
            else:
                values += [rt if ratio is None else ratio + log_req for rt, ratio in reversed(hist)]
            alpha = alphas[i]
            weights += [alpha * p for p in pows[: len(hist)]]
            spans.append((i, start, len(values)))
        pairs = list(zip(values, weights, strict=True))
        pairs.sort()
        return (values, weights, spans), pairs

    def _votes(
        self, job: JobRequest, ctx: _Context
    ) -> tuple[_Votes | _Parts, list[tuple[float, float]], float | None]:
        """The votes of every key of ``job`` with history, the same (value, weight) pairs sorted,
        and in a batch the sum of their weights.  In a batch the votes are the segments they
        come from, in level order (``_votes_of`` makes them a ``_Votes`` when the job finishes)."""
        requested = _requested(job)
        log_req = math.log(requested) if requested else None
        req = round(requested) if requested else None
        template = name_template(job.name) if job.name else ""
        segments = self._segments
        if segments is None:  # one prediction: nothing to share
            votes, sorted_votes = self._votes_one(job, ctx, log_req=log_req, req=req, template=template)
            return votes, sorted_votes, None
        parts: _Parts = []
        total = 0.0
        pairs: list[tuple[float, float]] = []
        for i, key_fn, is_raw in self._level_fns:
            key = key_fn(job, req, ctx, template)
            if key is None:
                continue
            at = (i, key, None if is_raw else log_req)
            segment = segments.get(at)
            if segment is None:
                if len(segments) >= self._max_segments:
                    segments.clear()
                segment = segments[at] = self._segment(i, key, at[2])
            if segment[0]:
                parts.append(segment[3])
                pairs += segment[2]
                total += segment[4]
        pairs.sort()  # in a batch, a merge of the segments' sorted runs
        return parts, pairs, total

    def _log_p50(self, job: JobRequest) -> float | None:
        parts, pairs, total = self._votes(job, self._context(job))
        if not pairs:
            return None
        if len(self._pending_votes) >= self._max_pending_votes:
            # Learning from a job that was predicted long ago recomputes its votes instead.
            for stale in list(self._pending_votes)[: self._max_pending_votes // 10]:
                del self._pending_votes[stale]
        self._pending_votes[job.id] = parts
        # window_mode(list(zip(values, weights))) with the pairs already sorted; in a batch whose
        # weights are all non-negative, the scan may stop once the weight left cannot win.
        limit = total if total is not None and self._is_weight_bounded else math.inf
        left, right, _ = densest_window(pairs, LOG4, limit)
        return 0.5 * (pairs[left][0] + pairs[right - 1][0])

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """Return (p50_s, p90_s) for ``job`` from the jobs observed so far.

        Guarantees ``min_runtime_s <= p50 <= p90`` and, when ``job.requested_s`` is set,
        ``p90 <= max(requested_s, min_runtime_s)``.
        """
        cached = self._predicted.get(job.id)
        if cached is not None and cached[0] == self._n_observed:
            log_p50: float | None = cached[1]
        else:
            log_p50 = self._log_p50(job)
            if log_p50 is not None:
                if len(self._predicted) >= self._max_predicted:
                    # Jobs that were predicted but never finished (cancelled): drop the oldest.
                    for stale in list(self._predicted)[: self._max_predicted // 10]:
                        del self._predicted[stale]
                self._predicted[job.id] = (self._n_observed, log_p50)
        requested = _requested(job)
        if log_p50 is None:
            p50 = requested if requested else self.default_s
            p90 = p50
        else:
            p50 = math.exp(log_p50)
            q90 = self._group_q90.get(self._context(job)[2], self._log_q90)
            p90 = math.exp(log_p50 + max(q90, 0.0))
        if requested:
            p50 = min(p50, requested)
            p90 = min(p90, requested)
        p50 = max(p50, self.min_runtime_s)
        return p50, max(p90, p50)

    def predict_many(self, jobs: Iterable[JobRequest]) -> list[tuple[float, float]]:
        """``[self.predict(job) for job in jobs]``: the same answers and the same state after,
        for less work when the jobs share keys (nothing is learned between them, so their
        common keys' votes are built once for the batch)."""
        self._segments = {}
        self._weight_rows = [[alpha * p for p in self._decay_pows] for alpha in self._alpha]
        # every vote weight is a level weight times a power of the decay (NaN fails the test)
        self._is_weight_bounded = all(a >= 0.0 for a in self._alpha) and self.decay >= 0.0
        try:
            return [self.predict(job) for job in jobs]
        finally:
            self._segments = self._weight_rows = None
            self._is_weight_bounded = False

    # ---- learning ----

    def _learn_weights(
        self, values: list[float], weights: list[float], spans: list[tuple[int, int, int]], log_rt: float
    ) -> None:
        """One online EM step on the level weights from a finished job's (capped) votes."""
        if len(spans) < 2:
            return
        lo, hi = log_rt - _LOG2, log_rt + _LOG2
        alpha = self._alpha
        resp: list[float] = []
        for i, start, end in spans:
            total = inside = 0.0
            for k in range(start, end):
                w = weights[k]
                total += w
                if lo <= values[k] <= hi:
                    inside += w
            # Responsibility of a level: its weight times the likelihood it gave the actual
            # (the share of its votes within a factor of two; a small floor keeps every
            # level alive).
            resp.append(alpha[i] * (inside / total + 1e-3) if total > 0.0 else 0.0)
        norm = sum(resp)
        if norm <= 0.0:
            return
        mass = sum(alpha[i] for i, _, _ in spans)
        step = self.weight_step
        for (i, _, _), r in zip(spans, resp, strict=True):
            alpha[i] = (1.0 - step) * alpha[i] + step * mass * r / norm

    def observe(
        self,
        job: JobRequest,
        runtime_s: float,
        *,
        ended_at: float | None = None,
        status: str | None = None,
    ) -> None:
        """Learn from a finished job: amortised O(levels * window) time, bounded memory per key.

        ``ended_at`` (the end time, same clock as ``submit_at``) and ``status``
        (``"completed"``/``"failed"``/...) sharpen the user's session context when the caller
        knows them; without ``ended_at`` the newest time seen so far stands in for it.
        A NaN or infinite runtime is ignored (nothing to learn); negatives count as the floor.
        """
        ctx = self._context(job)
        self._contexts.pop(job.id, None)
        self._context_users.pop(job.id, None)
        state = self._user(job.user)
        state.active.discard(job.id)
        if not math.isfinite(runtime_s):
            self._predicted.pop(job.id, None)
            self._pending_votes.pop(job.id, None)
            return
        log_rt = math.log(max(runtime_s, self.min_runtime_s))
        requested = _requested(job)
        log_cap = math.log(requested) if requested else math.inf
        cached = self._predicted.pop(job.id, None)
        pending = self._pending_votes.pop(job.id, None)
        if pending is None:
            pending = self._votes(job, ctx)[0]
        values, weights, spans = pending if isinstance(pending, tuple) else _votes_of(pending)
        if requested:
            values = [v if v < log_cap else log_cap for v in values]  # above the limit = the limit
        log_p50 = cached[1] if cached is not None else None
        if log_p50 is None and values:
            log_p50 = window_mode(list(zip(values, weights, strict=True)))
        if log_p50 is not None:
            residual = log_rt - min(log_p50, log_cap)
            self._residuals.append(residual)
            group = self._group_residuals.get(ctx[2])
            if group is None:
                group = self._group_residuals[ctx[2]] = deque(maxlen=self._residuals.maxlen)
            group.append(residual)
        if self.learn_weights:
            self._learn_weights(values, weights, spans, log_rt)
        log_ratio = log_rt - math.log(requested) if requested else None
        req = round(requested) if requested else None
        template = name_template(job.name) if job.name else ""
        for _, key_fn, is_raw in self._level_fns:
            key = None if is_raw else key_fn(job, req, ctx, template)
            if key is None:
                continue
            hist = self._history.get(key)
            if hist is None:
                hist = self._history[key] = deque(maxlen=self.window)
            hist.append((log_rt, log_ratio))
        end = ended_at if ended_at is not None and math.isfinite(ended_at) else self._clock
        if math.isfinite(end):
            self._clock = max(self._clock, end)
            if state.last_end_at is None or end >= state.last_end_at:
                state.last_end_at = end
                state.last_log_rt, state.last_log_ratio, state.last_status = log_rt, log_ratio, status
        else:
            state.last_log_rt, state.last_log_ratio, state.last_status = log_rt, log_ratio, status
        self._n_observed += 1
        self._since_refresh += 1
        if self._since_refresh >= self.refresh_every and len(self._residuals) >= 20:
            # Refreshing the conformal factor every few jobs keeps observe() amortised cheap.
            self._since_refresh = 0
            self._log_q90 = _upper_decile(self._residuals)
            for key, residuals in self._group_residuals.items():
                if len(residuals) >= self._min_group_residuals:
                    self._group_q90[key] = _upper_decile(residuals)
