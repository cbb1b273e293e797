"""The runtime predictor as it was before its per-vote work was made cheaper (main at 4e80920).

Kept verbatim (module docstring and `RuntimePredictor` protocol dropped) as the reference
that `test_runtime_identity` compares the shipped predictor with: every answer, learned
weight and band must stay bit-identical.  Do not "fix" this file: it is the old behaviour.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Hashable

from scheduling.engine.types import JobRequest

__all__ = ["HistoryRuntimePredictor", "window_mode"]

_LOG2 = math.log(2.0)
_LOG4 = math.log(4.0)
_LOG_SHORT = math.log(60.0)  # a job that ended within a minute did not really run
_LOG_AT_LIMIT = math.log(0.9)  # ran to (nearly) its requested time
_DAY_S = 86_400.0


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

# (gap bucket, since-last-end bucket, last outcome, busy bucket, hour bucket)
_Context = tuple[int, int, int, int, int]
_NO_CONTEXT: _Context = (0, 0, 0, 0, 0)


def _bucket(gap_s: float | None) -> int:
    """0 when unknown, else 1 + the number of edges at or below ``gap_s``."""
    if gap_s is None:
        return 0
    for i, edge in enumerate(_GAP_EDGES_S):
        if gap_s < edge:
            return i + 1
    return len(_GAP_EDGES_S) + 1


_DIGITS = re.compile(r"[0-9]+")


def _name_template(name: str) -> str:
    """The job name with every run of digits replaced by ``#`` (sweeps share a template)."""
    return _DIGITS.sub("#", name.strip().lower())


def _requested(job: JobRequest) -> float | None:
    """The job's requested time when it is a usable positive number, else None."""
    req = job.requested_s
    return req if req is not None and math.isfinite(req) and req > 0 else None


def _level_key(level: str, job: JobRequest, req: int | None, ctx: _Context = _NO_CONTEXT) -> Hashable | None:
    """The history key of ``job`` at ``level`` (``req``: its rounded requested time; ``ctx``:
    its session context), or None when the job lacks the feature."""
    if level == "user_name_gpus":
        return (level, job.user, job.name, job.gpu_count) if job.name else None
    if level == "user_req_gpus":
        return (level, job.user, req, job.gpu_count) if req is not None else None
    if level == "user_req":
        return (level, job.user, req) if req is not None else None
    if level == "user_type_gpus":
        return (level, job.user, job.gpu_type, job.gpu_count) if job.gpu_type else None
    if level == "project_name":
        return (level, job.project, job.name) if job.name else None
    if level == "user_gpus":
        return (level, job.user, job.gpu_count)
    if level == "user":
        return (level, job.user)
    if level == "project":
        return (level, job.project)
    if level == "req":
        return (level, req) if req is not None else None
    if level == "all":
        return (level,)
    if level == "user_template":
        return (level, job.user, _name_template(job.name)) if job.name else None
    if level == "project_template":
        return (level, job.project, _name_template(job.name)) if job.name else None
    gap_b, end_b, prev, busy, hour_b = ctx
    if level == "user_req_prev":
        return (level, job.user, req, prev) if prev else None
    if level == "user_prev":
        return (level, job.user, prev) if prev else None
    if level == "user_req_gap":
        return (level, job.user, req, gap_b) if gap_b else None
    if level == "user_req_end":
        return (level, job.user, req, end_b) if end_b else None
    if level == "user_req_busy":
        return (level, job.user, req, busy)
    if level == "user_hour":
        return (level, job.user, hour_b)
    if level == "req_prev":
        return (level, req, prev) if prev else None
    if level == "prev_gap":
        return (level, prev, gap_b)
    raise ValueError(f"unknown level {level!r}")


def window_mode(votes: list[tuple[float, float]], *, width: float = _LOG4, centre: str = "midpoint") -> float:
    """Centre of the interval of length ``width`` holding the most weight of (value, weight).

    Ties go to the lowest such interval.  The centre is the midpoint of the extreme values
    inside it (``centre="midpoint"``: every vote in the window is then within half of
    ``width`` of it, which is what a factor-of-two score rewards; the weighted mean scored
    0.675 instead of 0.686 within-2x on the KTH log), or their weighted mean
    (``centre="mean"``).  O(n log n); ``votes`` is sorted in place and must not be empty.
    """
    votes.sort()
    n = len(votes)
    best_weight, best = -1.0, (0, 1)
    acc, right = 0.0, 0
    for left in range(n):
        lo = votes[left][0]
        while right < n and votes[right][0] - lo <= width:
            acc += votes[right][1]
            right += 1
        if acc > best_weight + 1e-12:
            best_weight = acc
            best = (left, right)
        acc -= votes[left][1]
    left, right = best
    if centre == "midpoint" or best_weight <= 0.0:
        return 0.5 * (votes[left][0] + votes[right - 1][0])
    inside = votes[left:right]
    return sum(v * w for v, w in inside) / sum(w for _, w in inside)


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
            _level_key(level, probe, None)
            if is_raw and level not in plain:
                raise ValueError(f"{level}:raw needs {level} among the levels")
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
        # level weights (bounded: about 2 x 200 floats a job)
        self._pending_votes: dict[str, tuple[list[float], list[float], list[tuple[int, int, int]]]] = {}
        self._max_pending_votes = 20_000

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

    def _votes(
        self, job: JobRequest, ctx: _Context
    ) -> tuple[list[float], list[float], list[tuple[int, int, int]]]:
        """Log-runtime votes of every key of ``job`` with history: (values, weights, spans),
        where each span (level index, start, end) says which votes a level cast."""
        requested = _requested(job)
        log_req = math.log(requested) if requested else None
        req = round(requested) if requested else None
        values: list[float] = []
        weights: list[float] = []
        spans: list[tuple[int, int, int]] = []
        history = self._history
        pows = self._decay_pows
        for i, (level, alpha, is_raw) in enumerate(
            zip(self._key_levels, self._alpha, self._is_raw, strict=True)
        ):
            key = _level_key(level, job, req, ctx)
            if key is None:
                continue
            hist = history.get(key)
            if not hist:
                continue
            start = len(values)
            if log_req is None or is_raw:
                values.extend([rt for rt, _ in reversed(hist)])
            else:
                values.extend([rt if ratio is None else ratio + log_req for rt, ratio in reversed(hist)])
            weights.extend([alpha * p for p in pows[: len(hist)]])
            spans.append((i, start, len(values)))
        return values, weights, spans

    def _log_p50(self, job: JobRequest) -> float | None:
        votes = self._votes(job, self._context(job))
        values, weights, _ = votes
        if not values:
            return None
        if len(self._pending_votes) >= self._max_pending_votes:
            # Learning from a job that was predicted long ago recomputes its votes instead.
            for stale in list(self._pending_votes)[: self._max_pending_votes // 10]:
                del self._pending_votes[stale]
        self._pending_votes[job.id] = votes
        return window_mode(list(zip(values, weights, strict=True)))

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
        values, weights, spans = pending if pending is not None else self._votes(job, ctx)
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
        for level, is_raw in zip(self._key_levels, self._is_raw, strict=True):
            key = None if is_raw else _level_key(level, job, req, ctx)
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
