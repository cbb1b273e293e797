"""Runtime-prediction benchmark: online p50 predictions against the users' own estimates.

    python -m bench.runtime --trace CSV [--repeat K] --out FILE.json

``--repeat K`` replays the trace K times back to back (each copy shifted by the trace's
span, same users), so the predictor answers with K times the history: with K=4 on the
KTH log (28,475 jobs) the last copy predicts at 85k-114k jobs of history, and
``predict_us_last_copy`` is the mean time per prediction there.  Scores are then over all
copies.

Jobs are visited in submit order.  Before each prediction, every job that *finished*
strictly before that job's submit time is fed to the predictor (in end order), so no
prediction sees the future.  Scores (DESIGN §8):

* ``within_2x``: fraction of jobs whose p50 / actual runtime lies in [0.5, 2];
* ``mae_s``: mean absolute error of the p50 in seconds;
* ``p90_coverage``: fraction of jobs whose runtime is at or below the p90;
* ``under_2x_share``: fraction of jobs that ran longer than twice the p50 (what hurts
  backfill: the reservation behind them slips);
* ``rank_corr``: Spearman's rank correlation of the p50 and the runtime (what an order or a
  backfill by predicted length uses; None when either side is constant);

for ``predictor`` (:class:`forecasting.core.runtime.HistoryRuntimePredictor`, the shipped
model), ``user_estimate`` (the trace's ``requested_time`` as both p50 and p90; only jobs
that have one) and ``last_two`` (Tsafrir et al.: the mean of the user's last two finished
runtimes, as both p50 and p90; the requested time, else 1 h, until the user has one).  All
three are scored on the same run.  Runtimes are floored at 1 s on both sides so a
zero-length job does not divide by zero.  Jobs without a start or end time have no actual
runtime and are skipped.  Extra keys: ``coverage_p90`` (= ``p90_coverage``, the old name),
``median_ae_s``, ``predict_us``/``observe_us`` (mean wall time per call).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from forecasting.core.runtime import DEFAULT_LEVELS, HistoryRuntimePredictor
from scheduling.engine.types import JobRequest

_FLOOR_S = 1.0


def _jobs_from_csv(path: str | Path) -> tuple[list[JobRequest], list[float], list[float], list[str | None]]:
    """Jobs with a known runtime in submit order, their actual runtimes (s), end times and
    statuses (None where the trace has none)."""
    df = pd.read_csv(path, dtype={"user": "string", "group": "string", "job_id": "string"})
    df = df.dropna(subset=["start_time", "end_time", "submit_time"])
    df = df.sort_values(["submit_time", "job_id"], kind="stable")
    has_req = "requested_time" in df.columns
    has_status = "status" in df.columns
    jobs: list[JobRequest] = []
    runtimes: list[float] = []
    ends: list[float] = []
    statuses: list[str | None] = []
    for row in df.itertuples(index=False):
        req = float(row.requested_time) if has_req and pd.notna(row.requested_time) else None
        user = str(row.user) if pd.notna(row.user) else ""
        group = str(row.group) if pd.notna(row.group) else ""
        jobs.append(
            JobRequest(
                id=str(row.job_id),
                user=user or group,
                project=group or user,
                gpu_count=int(row.num_gpus) if pd.notna(row.num_gpus) else 1,
                submit_at=float(row.submit_time),
                requested_s=req if req and req > 0 else None,
            )
        )
        runtimes.append(max(float(row.end_time) - float(row.start_time), 0.0))
        ends.append(float(row.end_time))
        statuses.append(str(row.status) if has_status and pd.notna(row.status) else None)
    return jobs, runtimes, ends, statuses


def _score(pred: np.ndarray, actual: np.ndarray, p90: np.ndarray | None = None) -> dict[str, float | None]:
    if not len(actual):
        # No job to score (a trace without requested times has no user estimates).
        keys = ("within_2x", "mae_s", "median_ae_s", "p90_coverage", "under_2x_share", "rank_corr")
        return {**dict.fromkeys(keys), "n": 0}
    p = np.maximum(pred, _FLOOR_S)
    a = np.maximum(actual, _FLOOR_S)
    q90 = p if p90 is None else np.maximum(p90, _FLOOR_S)
    ratio = p / a
    return {
        "within_2x": float(np.mean((ratio >= 0.5) & (ratio <= 2.0))),
        "mae_s": float(np.mean(np.abs(p - a))),
        "median_ae_s": float(np.median(np.abs(p - a))),
        "p90_coverage": float(np.mean(a <= q90)),
        "under_2x_share": float(np.mean(a > 2.0 * p)),
        "rank_corr": _rank_corr(p, a),
        "n": len(a),
    }


def _rank_corr(pred: np.ndarray, actual: np.ndarray) -> float | None:
    """Spearman's rank correlation of predictions and runtimes (ties share their mean rank).

    What berth's order and backfill use is the ranking (which job is shorter), which
    ``within_2x`` does not see: a predictor that gives every job of a class the same value can be
    within 2x as often as one with independent noise around each job's runtime and rank far
    worse (docs/benchmarks.md, "What runtime knowledge is worth on Alibaba").  None when either
    side is constant.
    """
    if len(actual) < 2 or np.ptp(pred) == 0 or np.ptp(actual) == 0:
        return None
    return float(stats.spearmanr(pred, actual).statistic)


class LastTwo:
    """Tsafrir et al.'s predictor: the mean of the user's last two finished runtimes."""

    def __init__(self, *, default_s: float = 3600.0) -> None:
        self.default_s = default_s
        self._last: dict[str, tuple[float, ...]] = {}

    def predict(self, job: JobRequest) -> float:
        """Mean of the user's last two runtimes; the requested time (else ``default_s``) before."""
        last = self._last.get(job.user)
        if last:
            return sum(last) / len(last)
        return job.requested_s or self.default_s

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        """Remember ``runtime_s`` as the user's newest runtime."""
        self._last[job.user] = (*self._last.get(job.user, ())[-1:], runtime_s)


def _repeated(
    jobs: list[JobRequest], runtimes: list[float], ends: list[float], statuses: list[str | None], k: int
) -> tuple[list[JobRequest], list[float], list[float], list[str | None]]:
    """The trace ``k`` times back to back, each copy shifted by the span (new job ids)."""
    if k <= 1 or not jobs:
        return jobs, runtimes, ends, statuses
    span = max(ends) - min(j.submit_at for j in jobs) + 1.0
    out_j: list[JobRequest] = []
    out_e: list[float] = []
    for c in range(k):
        out_j += [replace(j, id=f"{j.id}#{c}", submit_at=j.submit_at + c * span) for j in jobs]
        out_e += [e + c * span for e in ends]
    return out_j, runtimes * k, out_e, statuses * k


def run(
    trace: str | Path, *, repeat: int = 1, end_info: bool = True, ablation: bool = False
) -> dict[str, Any]:
    """Replay ``trace`` online (``repeat`` times back to back) and return the JSON document.

    ``end_info``: the predictor's ``observe`` gets each job's end time and status (what the
    portal knows); off, it gets only the runtime.  ``ablation`` adds ``predictor_static``:
    the same predictor without the session keys and with fixed level weights (the model
    shipped before them), scored on the same run.
    """
    jobs, runtimes, ends, statuses = _repeated(*_jobs_from_csv(trace), repeat)
    last_copy_from = len(jobs) - len(jobs) // max(repeat, 1)
    predict_last_s = 0.0
    predictor = HistoryRuntimePredictor()
    static = HistoryRuntimePredictor(levels=DEFAULT_LEVELS, learn_weights=False) if ablation else None
    static_p = np.empty(len(jobs))
    static_p90 = np.empty(len(jobs))
    last_two = LastTwo()
    last_two_p = np.empty(len(jobs))
    finished: list[tuple[float, int]] = []  # heap of (end_at, index) for started jobs
    p50s = np.empty(len(jobs))
    p90s = np.empty(len(jobs))
    predict_s = observe_s = predict_cpu_s = predict_cpu_last_s = 0.0
    n_observed = 0
    for i, job in enumerate(jobs):
        while finished and finished[0][0] < job.submit_at:
            _, k = heapq.heappop(finished)
            t0 = time.perf_counter()
            if end_info:
                predictor.observe(jobs[k], runtimes[k], ended_at=ends[k], status=statuses[k])
            else:
                predictor.observe(jobs[k], runtimes[k])
            observe_s += time.perf_counter() - t0
            if static is not None:
                static.observe(jobs[k], runtimes[k])
            last_two.observe(jobs[k], runtimes[k])
            n_observed += 1
        t0, c0 = time.perf_counter(), time.process_time()
        p50s[i], p90s[i] = predictor.predict(job)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        predict_s += dt
        predict_cpu_s += dc
        if i >= last_copy_from:
            predict_last_s += dt
            predict_cpu_last_s += dc
        last_two_p[i] = last_two.predict(job)
        if static is not None:
            static_p[i], static_p90[i] = static.predict(job)
        # The end time only decides when the job enters the history, never the prediction.
        heapq.heappush(finished, (ends[i], i))
    actual = np.asarray(runtimes)
    req = np.array([j.requested_s if j.requested_s else np.nan for j in jobs])
    has_req = ~np.isnan(req)
    predictor_scores: dict[str, Any] = dict(_score(p50s, actual, p90s))
    predictor_scores["coverage_p90"] = predictor_scores["p90_coverage"]
    predictor_scores["predict_us"] = 1e6 * predict_s / max(len(jobs), 1)
    predictor_scores["observe_us"] = 1e6 * observe_s / max(n_observed, 1)
    predictor_scores["predict_us_last_copy"] = 1e6 * predict_last_s / max(len(jobs) - last_copy_from, 1)
    # CPU time of this process: on a shared machine the wall time also counts waiting for a core.
    predictor_scores["predict_cpu_us"] = 1e6 * predict_cpu_s / max(len(jobs), 1)
    predictor_scores["predict_cpu_us_last_copy"] = (
        1e6 * predict_cpu_last_s / max(len(jobs) - last_copy_from, 1)
    )
    predictor_scores["history_jobs_at_end"] = n_observed
    predictor_scores["level_weights"] = predictor.level_weights
    doc: dict[str, Any] = {
        "trace": str(trace),
        "jobs": len(jobs),
        "repeat": repeat,
        "end_info": end_info,
        "predictor": predictor_scores,
        "user_estimate": _score(req[has_req], actual[has_req]),
        "last_two": _score(last_two_p, actual),
    }
    if static is not None:
        doc["predictor_static"] = _score(static_p, actual, static_p90)
    return doc


def _print_table(doc: dict[str, Any]) -> None:
    print(f"{doc['trace']}: {doc['jobs']} jobs")
    print(
        f"{'model':<16}{'within_2x':>10}{'mae_s':>10}{'median_ae_s':>13}{'p90_cov':>9}{'under_2x':>10}"
        f"{'rank_corr':>10}"
    )
    for name in ("predictor", "predictor_static", "user_estimate", "last_two"):
        if name not in doc:
            continue
        r = doc[name]
        if not r["n"]:
            print(f"{name:<16}  (no job to score)")
            continue
        print(
            f"{name:<16}{r['within_2x']:>10.3f}{r['mae_s']:>10.0f}{r['median_ae_s']:>13.0f}"
            f"{r['p90_coverage']:>9.3f}{r['under_2x_share']:>10.3f}"
            f"{'-' if r['rank_corr'] is None else format(r['rank_corr'], '.3f'):>10}"
        )
    p = doc["predictor"]
    print(
        f"predictor: predict {p['predict_us']:.1f} us, observe {p['observe_us']:.1f} us per call; "
        f"{p['predict_us_last_copy']:.1f} us per predict ({p['predict_cpu_us_last_copy']:.1f} us CPU) "
        f"with {p['history_jobs_at_end']} jobs of history"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", required=True, help="job trace CSV (traces README format)")
    parser.add_argument("--repeat", type=int, default=1, help="replay the trace K times back to back")
    parser.add_argument(
        "--no-end-info",
        action="store_true",
        help="observe() gets only the runtime, not the end time and status (what the replay passes)",
    )
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="also score the predictor without session keys (predictor_static)",
    )
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    doc = run(args.trace, repeat=args.repeat, end_info=not args.no_end_info, ablation=args.ablation)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    _print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
