"""Online runtime prediction (p50/p90) from the history of finished jobs.

The engine backfills on these quantiles instead of the user's wall-clock limit, and the
portal shows them as ETAs.  The simulator calls :meth:`HistoryRuntimePredictor.predict`
and :meth:`HistoryRuntimePredictor.observe` for every job of a replay, so both are cheap:
bounded per-key windows, no scans over the history, cached quantiles.

How a prediction is made (all in log space, where runtimes are roughly symmetric):

* **Keys** from most to least specific: (user, name, GPUs), (user, requested time, GPUs),
  (user, requested time), (user, GPUs), user, project, global.  Each key keeps its last
  ``window`` finished jobs.
* **Experts** compete per user: ``recent`` takes the most specific key with enough history
  and its recency-weighted median; ``last2`` is the mean of the user's last two runtimes
  (Tsafrir et al., 2007); ``ratio`` scales the requested time by the user's recent median
  runtime/requested ratio (useful when users pick limits that track their jobs).  Each
  expert's hit rate (prediction within 2x of the actual) is tracked with exponential
  forgetting per user and globally; the best one for the user answers.
* **p90** is the p50 times a conformal factor: the 90th percentile of recent
  log(actual / p50) residuals of the chosen expert, so the band is calibrated online.
* Both quantiles are capped at the requested time when the job has one: jobs are killed at
  their limit, so a longer prediction is never right.

Times are float seconds; runtimes are floored at ``min_runtime_s`` so a zero-length job
does not produce log(0).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from scheduling.engine.types import JobRequest

__all__ = ["HistoryRuntimePredictor", "RuntimePredictor"]


class RuntimePredictor(Protocol):
    """What the engine and the simulator need from a runtime model."""

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """Return (p50_s, p90_s) for a job that has not finished yet."""
        ...

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Record that ``job`` finished after ``runtime_s`` seconds."""
        ...


_EXPERTS = ("recent", "last2", "ratio")


@dataclass(slots=True)
class _KeyStats:
    """Last few observations of one key, with a cached weighted median."""

    logs: deque[float]
    median: float | None = None  # cache; None means stale

    def add(self, value: float) -> None:
        self.logs.append(value)
        self.median = None


@dataclass(slots=True)
class _Scores:
    """Exponentially forgotten hit rates of each expert (prior: 0.5 each)."""

    hits: list[float] = field(default_factory=lambda: [0.5] * len(_EXPERTS))
    weight: float = 0.0


def _weighted_median(values: deque[float], *, decay: float) -> float:
    """Median of ``values`` where the newest has weight 1 and each older one ``decay`` times less."""
    n = len(values)
    if n == 1:
        return values[0]
    pairs = sorted((v, decay ** (n - 1 - i)) for i, v in enumerate(values))
    half = sum(w for _, w in pairs) / 2.0
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return v
    return pairs[-1][0]


class HistoryRuntimePredictor:
    """p50/p90 runtimes learned online from finished jobs; see the module docstring.

    ``window`` bounds each key's history; ``decay`` is the per-job recency weight of the
    median; ``min_count`` is how many observations a key needs before ``recent`` trusts it
    (the user-level keys need one, because users repeat jobs); ``score_decay`` is the
    per-job forgetting of the expert hit rates; ``default_s`` answers before any job
    finished and no requested time is known.
    """

    def __init__(
        self,
        *,
        window: int = 16,
        decay: float = 0.7,
        score_decay: float = 0.9,
        residual_window: int = 400,
        default_s: float = 3600.0,
        min_runtime_s: float = 1.0,
    ) -> None:
        self.window = window
        self.decay = decay
        self.score_decay = score_decay
        self.default_s = default_s
        self.min_runtime_s = min_runtime_s
        self._keys: dict[Hashable, _KeyStats] = {}
        self._ratio_keys: dict[Hashable, _KeyStats] = {}
        self._last2: dict[str, deque[float]] = {}
        self._user_scores: dict[str, _Scores] = {}
        self._global_scores = _Scores()
        self._residuals: list[deque[float]] = [deque(maxlen=residual_window) for _ in _EXPERTS]
        self._q90: list[float] = [math.log(3.0)] * len(_EXPERTS)  # prior band until data exists
        self._since_refresh = 0
        # Expert predictions made at predict() time, scored when the job is observed.
        self._pending: dict[str, tuple[float | None, ...]] = {}

    # ---- keys ----

    @staticmethod
    def _key_chain(job: JobRequest) -> tuple[Hashable, ...]:
        req = round(job.requested_s) if job.requested_s else None
        chain: list[Hashable] = []
        if job.name:
            chain.append(("un", job.user, job.name, job.gpu_count))
        if req is not None:
            chain.append(("urg", job.user, req, job.gpu_count))
            chain.append(("ur", job.user, req))
        chain.append(("ug", job.user, job.gpu_count))
        chain.append(("u", job.user))
        chain.append(("p", job.project))
        chain.append(("*",))
        return tuple(chain)

    def _median(self, stats: _KeyStats) -> float:
        if stats.median is None:
            stats.median = _weighted_median(stats.logs, decay=self.decay)
        return stats.median

    # ---- experts (log-space point predictions; None when an expert has nothing) ----

    def _experts(self, job: JobRequest) -> tuple[float | None, ...]:
        recent: float | None = None
        for key in self._key_chain(job):
            stats = self._keys.get(key)
            if stats is not None and stats.logs:
                recent = self._median(stats)
                break
        last = self._last2.get(job.user)
        last2 = math.log(sum(math.exp(v) for v in last) / len(last)) if last else None
        ratio: float | None = None
        if job.requested_s:
            for rkey in (("u", job.user), ("p", job.project), ("*",)):
                rstats = self._ratio_keys.get(rkey)
                if rstats is not None and rstats.logs:
                    ratio = math.log(job.requested_s) + self._median(rstats)
                    break
        return (recent, last2, ratio)

    def _choose(self, user: str, experts: tuple[float | None, ...]) -> int:
        scores = self._user_scores.get(user)
        best, best_score = -1, -1.0
        for i, value in enumerate(experts):
            if value is None:
                continue
            g = self._global_scores.hits[i]
            if scores is not None:
                # Shrink the user's hit rate toward the global one while the user is new.
                w = scores.weight
                s = (w * scores.hits[i] + 3.0 * g) / (w + 3.0)
            else:
                s = g
            if s > best_score:
                best, best_score = i, s
        return best

    # ---- protocol ----

    def predict(self, job: JobRequest) -> tuple[float, float]:
        """Return (p50_s, p90_s) for ``job`` from the jobs observed so far.

        Never above ``job.requested_s`` when that is set; p90 >= p50 > 0.
        """
        experts = self._experts(job)
        self._pending[job.id] = experts
        choice = self._choose(job.user, experts)
        if choice < 0:
            p50 = job.requested_s if job.requested_s else self.default_s
            p90 = p50
        else:
            log_p50 = experts[choice]
            assert log_p50 is not None
            p50 = math.exp(log_p50)
            p90 = math.exp(log_p50 + max(self._q90[choice], 0.0))
        if job.requested_s:
            p50 = min(p50, job.requested_s)
            p90 = min(p90, job.requested_s)
        p50 = max(p50, self.min_runtime_s)
        return p50, max(p90, p50)

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Learn from a finished job (amortised O(window) time, bounded memory per key)."""
        log_rt = math.log(max(runtime_s, self.min_runtime_s))
        experts = self._pending.pop(job.id, None)
        if experts is None:
            experts = self._experts(job)
        self._score(job.user, experts, log_rt)
        for key in self._key_chain(job):
            stats = self._keys.get(key)
            if stats is None:
                stats = self._keys[key] = _KeyStats(deque(maxlen=self.window))
            stats.add(log_rt)
        if job.requested_s:
            log_ratio = log_rt - math.log(job.requested_s)
            for rkey in (("u", job.user), ("p", job.project), ("*",)):
                rstats = self._ratio_keys.get(rkey)
                if rstats is None:
                    rstats = self._ratio_keys[rkey] = _KeyStats(deque(maxlen=self.window))
                rstats.add(log_ratio)
        last = self._last2.get(job.user)
        if last is None:
            last = self._last2[job.user] = deque(maxlen=2)
        last.append(log_rt)

    def _score(self, user: str, experts: tuple[float | None, ...], log_rt: float) -> None:
        scores = self._user_scores.get(user)
        if scores is None:
            scores = self._user_scores[user] = _Scores()
        d = self.score_decay
        for i, value in enumerate(experts):
            if value is None:
                continue
            hit = 1.0 if abs(value - log_rt) <= math.log(2.0) else 0.0
            scores.hits[i] = d * scores.hits[i] + (1.0 - d) * hit
            self._global_scores.hits[i] = 0.99 * self._global_scores.hits[i] + 0.01 * hit
            self._residuals[i].append(log_rt - value)
        scores.weight = d * scores.weight + 1.0
        self._since_refresh += 1
        if self._since_refresh >= 50:
            # Refreshing the conformal factors every 50 jobs keeps observe() amortised cheap.
            self._since_refresh = 0
            for i, res in enumerate(self._residuals):
                if len(res) >= 20:
                    ordered = sorted(res)
                    self._q90[i] = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
