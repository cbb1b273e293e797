"""Runtime-prediction benchmark: online p50 predictions against the users' own estimates.

    python -m bench.runtime --trace CSV --out FILE.json

Jobs are visited in submit order.  Before each prediction, every job that *finished*
strictly before that job's submit time is fed to the predictor (in end order), so no
prediction sees the future.  Scores (DESIGN §8):

* ``within_2x``: fraction of jobs whose prediction / actual runtime lies in [0.5, 2];
* ``mae_s``: mean absolute error in seconds;

for ``predictor`` (the p50 of :class:`forecasting.core.runtime.HistoryRuntimePredictor`) and
``user_estimate`` (the trace's ``requested_time``; only jobs that have one).  Runtimes are
floored at 1 s on both sides so a zero-length job does not divide by zero.  Jobs without a
start or end time have no actual runtime and are skipped.  Extra keys: ``coverage_p90``
(fraction of actuals at or below the p90), ``median_ae_s``, ``predict_us``/``observe_us``
(mean wall time per call).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forecasting.core.runtime import HistoryRuntimePredictor
from scheduling.engine.types import JobRequest

_FLOOR_S = 1.0


def _jobs_from_csv(path: str | Path) -> tuple[list[JobRequest], list[float], list[float]]:
    """Jobs with a known runtime in submit order, their actual runtimes (s) and end times."""
    df = pd.read_csv(path, dtype={"user": "string", "group": "string", "job_id": "string"})
    df = df.dropna(subset=["start_time", "end_time", "submit_time"])
    df = df.sort_values(["submit_time", "job_id"], kind="stable")
    has_req = "requested_time" in df.columns
    jobs: list[JobRequest] = []
    runtimes: list[float] = []
    ends: list[float] = []
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
    return jobs, runtimes, ends


def _score(pred: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    p = np.maximum(pred, _FLOOR_S)
    a = np.maximum(actual, _FLOOR_S)
    ratio = p / a
    return {
        "within_2x": float(np.mean((ratio >= 0.5) & (ratio <= 2.0))),
        "mae_s": float(np.mean(np.abs(p - a))),
        "median_ae_s": float(np.median(np.abs(p - a))),
        "n": len(a),
    }


def run(trace: str | Path) -> dict[str, Any]:
    """Replay ``trace`` online and return the benchmark's JSON document."""
    jobs, runtimes, ends = _jobs_from_csv(trace)
    predictor = HistoryRuntimePredictor()
    finished: list[tuple[float, int]] = []  # heap of (end_at, index) for started jobs
    p50s = np.empty(len(jobs))
    p90s = np.empty(len(jobs))
    predict_s = observe_s = 0.0
    n_observed = 0
    for i, job in enumerate(jobs):
        while finished and finished[0][0] < job.submit_at:
            _, k = heapq.heappop(finished)
            t0 = time.perf_counter()
            predictor.observe(jobs[k], runtimes[k])
            observe_s += time.perf_counter() - t0
            n_observed += 1
        t0 = time.perf_counter()
        p50s[i], p90s[i] = predictor.predict(job)
        predict_s += time.perf_counter() - t0
        # The end time only decides when the job enters the history, never the prediction.
        heapq.heappush(finished, (ends[i], i))
    actual = np.asarray(runtimes)
    req = np.array([j.requested_s if j.requested_s else np.nan for j in jobs])
    has_req = ~np.isnan(req)
    predictor_scores = _score(p50s, actual)
    predictor_scores["coverage_p90"] = float(np.mean(np.maximum(actual, _FLOOR_S) <= p90s))
    predictor_scores["predict_us"] = 1e6 * predict_s / max(len(jobs), 1)
    predictor_scores["observe_us"] = 1e6 * observe_s / max(n_observed, 1)
    return {
        "trace": str(trace),
        "jobs": len(jobs),
        "predictor": predictor_scores,
        "user_estimate": _score(req[has_req], actual[has_req]),
    }


def _print_table(doc: dict[str, Any]) -> None:
    print(f"{doc['trace']}: {doc['jobs']} jobs")
    print(f"{'model':<16}{'within_2x':>10}{'mae_s':>10}{'median_ae_s':>13}")
    for name in ("predictor", "user_estimate"):
        r = doc[name]
        print(f"{name:<16}{r['within_2x']:>10.3f}{r['mae_s']:>10.0f}{r['median_ae_s']:>13.0f}")
    p = doc["predictor"]
    print(
        f"p90 coverage {p['coverage_p90']:.3f}; "
        f"predict {p['predict_us']:.1f} us, observe {p['observe_us']:.1f} us per call"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", required=True, help="job trace CSV (traces README format)")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    doc = run(args.trace)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    _print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
