"""The runtime predictor's faster vote handling gives bit-identical answers.

`forecasting.core.runtime_votes` (key functions chosen once, each key's votes kept sorted per
round, the window scan stopped at the largest vote) must not change one prediction, learned
level weight or p90 band: backfill decides on these numbers, so a last-bit difference can
change which job starts.  Every comparison here is ``==`` on floats, against the predictor
as it was (`tests.forecasting.runtime_reference`, kept verbatim).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pandas as pd
import pytest

from forecasting.core.runtime import CONTEXT_LEVELS, DEFAULT_LEVELS, HistoryRuntimePredictor, window_mode
from scheduling.engine.types import JobRequest
from tests.forecasting import runtime_reference as reference
from tests.forecasting.conftest import SAMPLES

Predictor = HistoryRuntimePredictor | reference.HistoryRuntimePredictor


def _kth_jobs(limit: int) -> tuple[list[JobRequest], list[float], list[float], list[str]]:
    """The KTH sample's jobs in submit order (as `bench.runtime` reads a trace), with names,
    a GPU type on some, runtimes, end times and statuses."""
    df = pd.read_csv(SAMPLES / "kth_sp2_jobs_sample.csv.gz", dtype={"user": "string", "group": "string"})
    df = df.dropna(subset=["start_time", "end_time", "submit_time"]).sort_values(["submit_time", "job_id"])
    jobs, runtimes, ends, statuses = [], [], [], []
    for k, row in enumerate(df.head(limit).itertuples(index=False)):
        req = float(row.requested_time) if pd.notna(row.requested_time) and row.requested_time > 0 else None
        jobs.append(
            JobRequest(
                id=str(row.job_id),
                user=str(row.user),
                project=str(row.group),
                gpu_count=int(row.num_gpus),
                submit_at=float(row.submit_time),
                requested_s=req,
                # names and GPU types so the name, template and type levels vote too
                name=f"run-{int(row.num_gpus) % 3}-seed{k % 7}" if k % 4 else "",
                gpu_type="a100" if k % 5 == 0 else None,
            )
        )
        runtimes.append(max(float(row.end_time) - float(row.start_time), 0.0))
        ends.append(float(row.end_time))
        statuses.append(str(row.status))
    return jobs, runtimes, ends, statuses


def _replay(predictor: Predictor, limit: int = 2_000) -> list[tuple[float, float]]:
    """`bench.runtime`'s online replay: before each prediction, observe every job that
    finished before its submission (end time and status given)."""
    jobs, runtimes, ends, statuses = _kth_jobs(limit)
    finished = sorted(range(len(jobs)), key=lambda i: (ends[i], i))
    answers, done = [], 0
    for job in jobs:
        while done < len(finished) and ends[finished[done]] < job.submit_at:
            k = finished[done]
            predictor.observe(jobs[k], runtimes[k], ended_at=ends[k], status=statuses[k])
            done += 1
        answers.append(predictor.predict(job))
    return answers


def _state(predictor: Predictor) -> tuple[object, ...]:
    return (
        predictor.level_weights,
        predictor._log_q90,
        dict(predictor._group_q90),
        predictor.n_observed,
        dict(predictor._contexts),
    )


@pytest.mark.parametrize(
    ("levels", "learn"),
    [
        (None, True),  # the shipped predictor
        (DEFAULT_LEVELS, False),  # the static ablation of `bench.runtime --ablation`
        ((*DEFAULT_LEVELS, ("user:raw", 0.3), ("user_req:raw", 0.2), *CONTEXT_LEVELS), True),
    ],
)
def test_a_replay_of_the_kth_sample_gives_the_same_answers_bit_for_bit(
    levels: tuple[tuple[str, float], ...] | None, learn: bool
) -> None:
    new = HistoryRuntimePredictor(levels=levels, learn_weights=learn)
    old = reference.HistoryRuntimePredictor(levels=levels, learn_weights=learn)
    answers = _replay(new)
    assert answers == _replay(old)
    assert _state(new) == _state(old)
    assert len(set(answers)) > 100  # the replay really predicts from history


def test_a_round_of_predictions_between_observations_gives_the_same_answers() -> None:
    """The portal's case (`predict_many`): the predictor learns the history, then a round
    asks a prediction for hundreds of pending jobs with nothing observed in between (their
    common keys' votes are shared), then some of them finish (their kept votes are scored)
    and the next round asks again."""
    jobs, runtimes, ends, statuses = _kth_jobs(1_500)
    new, old = HistoryRuntimePredictor(), reference.HistoryRuntimePredictor()
    for predictor in (new, old):
        for k in sorted(range(1_000), key=lambda i: (ends[i], i)):
            predictor.observe(jobs[k], runtimes[k], ended_at=ends[k], status=statuses[k])
    rng = random.Random(7)
    pending = [replace(j, submit_at=j.submit_at + rng.choice([0.0, 30.0, 4e5])) for j in jobs[1_000:]]
    pending += pending[:50]  # asked twice in one batch
    assert new.predict_many(pending) == [old.predict(j) for j in pending]
    assert new._segments is None  # the batch's shared votes are not kept
    for predictor in (new, old):
        for k in range(0, 500, 3):  # a third of them finish, predicted or not
            end = ends[1_000 + k] + 4e5
            predictor.observe(pending[k], runtimes[1_000 + k], ended_at=end, status="failed")
    assert new.predict_many(pending[::-1]) == [old.predict(j) for j in pending[::-1]]
    assert [new.predict(j) for j in pending[:300]] == [old.predict(j) for j in pending[:300]]
    assert _state(new) == _state(old)


def test_window_mode_chooses_the_same_window_on_ties_and_duplicates() -> None:
    """Votes with repeated values and weights (the same finished job votes at several levels),
    exact ties between windows, zero and negative weights (no early stop then) and the
    weighted-mean centre."""
    rng = random.Random(3)
    for trial in range(3_000):
        n = rng.randint(1, 60)
        grid = [math.log(s) for s in (1, 30, 59, 60, 120, 240, 241, 3600, 7200, 14_400)]
        weights = [0.0, 0.1, 0.1 * 0.85, 0.25, 0.5 * 0.85**3, 1.0]
        if trial % 10 == 0:
            weights.append(-0.2)
        votes = [
            (rng.choice(grid) if rng.random() < 0.7 else rng.uniform(0.0, 10.0), rng.choice(weights))
            for _ in range(n)
        ]
        for centre in ("midpoint", "mean"):
            expected = reference.window_mode(list(votes), centre=centre)
            got = window_mode(list(votes), centre=centre)
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (votes, centre)


def test_the_bounded_window_scan_stops_early_on_the_same_window() -> None:
    """`densest_window` given the total (the batch's scan, weights never negative) gives the
    window of the full scan and of the reference window mode, on vote lists with repeated
    values and weights, zero weights, exact ties between windows, and sums far from 1."""
    from forecasting.core.runtime_votes import LOG4, densest_window

    rng = random.Random(5)
    for trial in range(3_000):
        n = rng.randint(1, 200)
        grid = [math.log(s) for s in (1, 30, 59, 60, 120, 240, 241, 3600, 7200, 14_400, 86_400)]
        scale = (1.0, 1e-6, 1e6)[trial % 3]
        weights = [w * scale for w in (0.0, 0.1, 0.1 * 0.85, 0.25, 0.5 * 0.85**3, 1.0)]
        votes = sorted(
            (rng.choice(grid) if rng.random() < 0.7 else rng.uniform(0.0, 12.0), rng.choice(weights))
            for _ in range(n)
        )
        total = sum(w for _, w in votes)
        full = densest_window(list(votes), LOG4)
        bounded = densest_window(list(votes), LOG4, total)
        assert (bounded[0], bounded[1], bounded[2].hex()) == (full[0], full[1], full[2].hex()), votes
        left, right, _ = bounded
        assert 0.5 * (votes[left][0] + votes[right - 1][0]) == reference.window_mode(list(votes))
