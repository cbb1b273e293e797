"""CLI smoke tests of bench.forecast and bench.runtime on the shipped samples (real Prophet)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench import forecast as bench_forecast
from bench import runtime as bench_runtime

CONTRACT_MODELS = ("prophet", "seasonal_naive_24", "seasonal_naive_168", "mstl", "autoets", "berth")
METRIC_KEYS = ("mase", "smape", "coverage_80", "coverage_upper_95", "fit_s_mean", "fit_cpu_s_mean")


def _check_models(models: dict[str, dict[str, float]]) -> None:
    for name in CONTRACT_MODELS:
        assert name in models
        for key in METRIC_KEYS:
            assert isinstance(models[name][key], float)
        assert 0.0 <= models[name]["coverage_80"] <= 1.0
        assert 0.0 <= models[name]["coverage_upper_95"] <= 1.0
        assert models[name]["mase"] >= 0.0


def test_bench_forecast_total_writes_contract_json(samples_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "f.json"
    code = bench_forecast.main(
        [
            "--series", str(samples_dir / "venus_submit_hourly_sample.csv.gz"),
            "--target", "submit_gpu_num", "--agg", "sum", "--horizon-h", "24",
            "--days", "2", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    _check_models(doc["models"])
    assert doc["models"]["berth"]["origins"] == 2.0
    # Prophet fits in a CmdStan child process: its CPU is counted in the fit's CPU time
    for name in ("prophet", "berth"):
        assert doc["models"][name]["fit_child_cpu_s_mean"] > 0.0
        assert doc["models"][name]["fit_cpu_s_mean"] >= doc["models"][name]["fit_child_cpu_s_mean"]
    assert doc["models"]["seasonal_naive_24"]["fit_child_cpu_s_mean"] == 0.0
    best = min(doc["models"][m]["mase"] for m in CONTRACT_MODELS if m != "berth")
    assert doc["berth_vs_best"] == pytest.approx(doc["models"]["berth"]["mase"] / best)
    assert "berth" in capsys.readouterr().out


def test_bench_forecast_reads_a_plain_timestamp_value_csv(samples_dir: Path, tmp_path: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(samples_dir / "venus_submit_hourly_sample.csv.gz")
    plain = tmp_path / "demand.csv"
    frame.rename(columns={"ds": "timestamp", "submit_gpu_num": "value"})[["timestamp", "value"]].to_csv(
        plain, index=False
    )
    out = tmp_path / "p.json"
    args = ["--days", "1", "--models", "seasonal_naive_24,autoets", "--out", str(out)]
    assert bench_forecast.main(["--series", str(plain), *args]) == 0
    doc = json.loads(out.read_text())
    assert doc["target"] == "value"
    ref = tmp_path / "r.json"
    bench_forecast.main(
        ["--series", str(samples_dir / "venus_submit_hourly_sample.csv.gz"), "--target", "submit_gpu_num",
         *args[:-1], str(ref)]
    )  # fmt: skip
    # Same numbers as the same column read by name.
    assert doc["models"]["autoets"]["mase"] == pytest.approx(
        json.loads(ref.read_text())["models"]["autoets"]["mase"]
    )


def test_bench_forecast_plain_csv_needs_two_columns(samples_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="exactly two columns"):
        bench_forecast.main(
            [
                "--series",
                str(samples_dir / "earth_vc_gpus_hourly_sample.csv.gz"),
                "--out",
                str(tmp_path / "x"),
            ]
        )


@pytest.mark.slow
def test_bench_forecast_by_group_averages_groups(samples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    bench_forecast.main(
        [
            "--series", str(samples_dir / "earth_vc_gpus_hourly_sample.csv.gz"),
            "--target", "running_gpus+pending_gpus", "--agg", "mean", "--by", "group",
            "--days", "2", "--events", str(samples_dir / "events_example.json"), "--out", str(out),
        ]
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert set(doc["groups"]) == {"vcSoL", "vcpDC", "vcdI0"}
    _check_models(doc["models"])
    for group in doc["groups"].values():
        _check_models(group["models"])
    mean_mase = sum(g["models"]["berth"]["mase"] for g in doc["groups"].values()) / 3
    assert doc["models"]["berth"]["mase"] == pytest.approx(mean_mase)


def test_bench_runtime_writes_contract_json(samples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = bench_runtime.main(["--trace", str(samples_dir / "kth_sp2_jobs_sample.csv.gz"), "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    for side in ("predictor", "user_estimate"):
        assert 0.0 <= doc[side]["within_2x"] <= 1.0
        assert doc[side]["mae_s"] >= 0.0
    assert doc["jobs"] == 2000
    # learning from history beats the users' own limits on this sample as on the full log
    assert doc["predictor"]["within_2x"] > doc["user_estimate"]["within_2x"]


def test_bench_runtime_only_learns_from_jobs_finished_before_each_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,user,group,submit_time,start_time,end_time,num_gpus,gpu_type,status,requested_time\n"
        "1,u1,g1,0,0,100,1,,completed,1000\n"
        "2,u1,g1,50,60,500,1,,completed,1000\n"
        "3,u1,g1,100,100,200,1,,completed,1000\n"  # job 1 ended at 100: not strictly before
        "4,u1,g1,600,600,700,1,,completed,1000\n"
    )
    events: list[tuple[str, str]] = []

    class Spy(bench_runtime.HistoryRuntimePredictor):
        def predict(self, job):  # type: ignore[no-untyped-def]
            events.append(("predict", job.id))
            return super().predict(job)

        def observe(self, job, runtime_s, **kwargs):  # type: ignore[no-untyped-def]
            events.append(("observe", job.id))
            super().observe(job, runtime_s, **kwargs)

    monkeypatch.setattr(bench_runtime, "HistoryRuntimePredictor", Spy)
    bench_runtime.run(trace)
    assert events == [
        ("predict", "1"),
        ("predict", "2"),
        ("predict", "3"),
        ("observe", "1"),
        ("observe", "3"),
        ("observe", "2"),
        ("predict", "4"),
    ]


def test_bench_forecast_refresh_times_berth_refits(samples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "refresh.json"
    bench_forecast.main(
        [
            "--series", str(samples_dir / "earth_vc_gpus_hourly_sample.csv.gz"),
            "--target", "running_gpus", "--agg", "mean", "--by", "group",
            "--refresh", "2", "--out", str(out),
        ]
    )  # fmt: skip
    refresh = json.loads(out.read_text())["refresh"]
    assert refresh["series"] == 2
    assert refresh["wall_s"] >= refresh["fit_s_max"] >= refresh["fit_s_mean"] > 0.0
    assert refresh["fit_cpu_s_mean"] > 0.0
    assert refresh["fit_cpu_s_median"] > 0.0


def test_bench_runtime_scores_baselines_and_times_a_repeated_history(
    samples_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    trace = str(samples_dir / "kth_sp2_jobs_sample.csv.gz")
    assert bench_runtime.main(["--trace", trace, "--repeat", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    single = bench_runtime.run(trace)
    assert doc["jobs"] == 2 * single["jobs"]
    for name in ("predictor", "user_estimate", "last_two"):
        for key in ("within_2x", "mae_s", "p90_coverage", "under_2x_share"):
            assert 0.0 <= doc[name][key] <= (1.0 if key != "mae_s" else 1e9), (name, key)
    # A user estimate is a limit: almost nobody runs past twice it, and it covers as p90.
    assert doc["user_estimate"]["under_2x_share"] < 0.05
    assert doc["user_estimate"]["p90_coverage"] > doc["last_two"]["p90_coverage"]
    assert doc["predictor"]["history_jobs_at_end"] > single["predictor"]["history_jobs_at_end"]
    assert doc["predictor"]["predict_us_last_copy"] > 0.0


def test_last_two_is_the_mean_of_the_users_last_two_runtimes() -> None:
    from scheduling.engine.types import JobRequest

    lt = bench_runtime.LastTwo(default_s=100.0)
    j = JobRequest(id="a", user="u", project="p", gpu_count=1, submit_at=0.0, requested_s=50.0)
    assert lt.predict(j) == 50.0  # the limit before any history
    for rt in (10.0, 20.0, 40.0):
        lt.observe(j, rt)
    assert lt.predict(j) == 30.0
    assert lt.predict(JobRequest(id="b", user="v", project="p", gpu_count=1, submit_at=0.0)) == 100.0


def test_bench_runtime_without_requested_times_scores_no_user_estimate(tmp_path: Path) -> None:
    """A trace without requested times (the Alibaba pod list) has no user estimates to score:
    the JSON says so with nulls and n = 0 (no NaN, which is not JSON)."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,user,group,submit_time,start_time,end_time,num_gpus,gpu_type,status\n"
        "1,,LS,0,0,100,1,,completed\n"
        "2,,LS,200,200,300,1,,completed\n"
        "3,,BE,400,400,4000,1,,completed\n"
    )
    out = tmp_path / "r.json"
    assert bench_runtime.main(["--trace", str(trace), "--out", str(out)]) == 0
    text = out.read_text()
    assert "NaN" not in text
    doc = json.loads(text)
    assert doc["user_estimate"]["n"] == 0
    assert doc["user_estimate"]["within_2x"] is None
    assert doc["predictor"]["n"] == 3
    # Job 1 has no history (1 h default), job 2 learns job 1's 100 s (a hit), job 3 of
    # another class only has the global 100 s for its 3600 s.
    assert doc["predictor"]["within_2x"] == pytest.approx(1 / 3)


def test_rank_corr_sees_the_ranking_that_within_2x_does_not() -> None:
    actual = np.array([10.0, 20.0, 40.0, 80.0, 160.0, 320.0])
    # Both predictors are within 2x for the same three jobs; one keeps the order, one reverses it.
    in_order = np.array([10.0, 20.0, 40.0, 320.0, 640.0, 1280.0])
    reversed_ = np.array([10.0, 20.0, 40.0, 5.0, 2.5, 1.25])
    kept, flipped = bench_runtime._score(in_order, actual), bench_runtime._score(reversed_, actual)
    assert kept["within_2x"] == flipped["within_2x"] == 0.5
    assert kept["rank_corr"] == pytest.approx(1.0)
    assert flipped["rank_corr"] < 0.0
    # Ties share their mean rank; a constant prediction ranks nothing.
    assert bench_runtime._score(np.full(6, 50.0), actual)["rank_corr"] is None
    tied = bench_runtime._score(np.array([1.0, 1.0, 1.0, 9.0, 9.0, 9.0]), actual)["rank_corr"]
    # mean ranks 2, 2, 2, 5, 5, 5 against 1..6: covariance 13.5, variances 13.5 and 17.5
    assert tied == pytest.approx(math.sqrt(13.5 / 17.5))
