"""Demand-forecast benchmark: rolling-origin backtests of Prophet, seasonal naives and berth.

    python -m bench.forecast --series CSV [--target COL[+COL...]] [--agg sum|mean]
        [--by COLUMN] [--horizon-h 24] [--days 28] [--models a,b,...] [--ablation]
        [--events FILE.json] [--jobs N] --out FILE.json
    python -m bench.forecast --series CSV --target COL --refresh 200 --jobs 2 --out FILE.json

The CSV has a ``ds`` timestamp column (or ``--ds-col``).  Without ``--target`` it must be a
plain two-column ``timestamp,value`` table (any header: the first column is the time, the
second the value), as ``bench.replay --dump-demand`` writes.  Targets joined by ``+`` are
added, then resampled to hourly with ``--agg`` (``sum`` for counts, ``mean`` for levels).
Without ``--by`` the rows of each timestamp are summed first (a cluster total); with
``--by`` every group is its own series and the output also has ``"groups": {G: {"models":
...}}``; the top-level ``models`` are then the *mean over groups* of each metric.

Output: ``{"series", "target", "agg", "by", "horizon_h", "days", "models": {NAME: {"mase",
"smape", "coverage_80", "coverage_upper_95", "fit_s_mean", "fit_cpu_s_mean",
"fit_child_cpu_s_mean", "origins"}}, "berth_vs_best"}``
(see forecasting/core/backtest.py for the definitions; docs/forecasting.md for the
results).  ``berth_vs_best`` is berth's MASE over the best MASE of the baselines run
(seasonal naives, MSTL, AutoETS, Prophet), when berth and a baseline were run.

``--refresh N`` instead times what the portal's hourly refresh does: fit ``berth`` once and
forecast ``--horizon-h`` hours for N series (the groups, cycled, each cut a different
number of days short so no two fits are equal) on ``--jobs`` processes:
``{"refresh": {"series", "jobs", "wall_s", "fit_s_mean", "fit_s_max", "fit_cpu_s_mean",
"fit_cpu_s_median"}}`` (CPU: this process's and its CmdStan children's, per fit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from forecasting.core.backtest import backtest, children_cpu_s
from forecasting.core.events import Event, events_from_json
from forecasting.core.models import ABLATION_NAMES, MODEL_NAMES, ForecastModel, make_model
from forecasting.core.series import to_hourly

_METRICS = (
    "mase", "smape", "coverage_80", "coverage_upper_95",
    "fit_s_mean", "fit_cpu_s_mean", "fit_child_cpu_s_mean",
)  # fmt: skip
_BASELINES = ("seasonal_naive_24", "seasonal_naive_168", "mstl", "autoets", "prophet")


def _berth_vs_best(models: dict[str, dict[str, float]]) -> float | None:
    """berth's MASE over the best baseline MASE in the same run (None if either is missing)."""
    base = [models[b]["mase"] for b in _BASELINES if b in models]
    if "berth" not in models or not base or min(base) <= 0:
        return None
    return models["berth"]["mase"] / min(base)


def plain_columns(series_csv: str | Path) -> tuple[str, str]:
    """(time column, value column) of a plain two-column ``timestamp,value`` CSV."""
    header = pd.read_csv(series_csv, nrows=0).columns.tolist()
    if len(header) != 2:
        raise SystemExit(f"{series_csv}: without --target the CSV needs exactly two columns, has {header}")
    return str(header[0]), str(header[1])


def _factories(names: Sequence[str], events: Sequence[Event]) -> list[Callable[[], ForecastModel]]:
    return [partial(make_model, name, events=events) for name in names]


def _run_one(
    item: tuple[str, pd.Series], *, names: Sequence[str], events: Sequence[Event], days: int, horizon_h: int
) -> tuple[str, dict[str, dict[str, float]]]:
    group, series = item
    results = backtest(series, _factories(names, events), days=days, horizon_h=horizon_h)
    return group, {r.model: r.as_dict() for r in results}


def run(
    *,
    series_csv: str | Path,
    targets: Sequence[str],
    agg: str = "sum",
    by: str | None = None,
    horizon_h: int = 24,
    days: int = 28,
    models: Sequence[str] = MODEL_NAMES,
    events: Sequence[Event] = (),
    ds_col: str = "ds",
    jobs: int = 1,
) -> dict[str, Any]:
    """Backtest ``models`` on the series in ``series_csv``; returns the JSON document."""
    frame = pd.read_csv(series_csv)
    series = to_hourly(frame, value_cols=list(targets), agg=agg, ds_col=ds_col, by=by)
    worker = partial(_run_one, names=list(models), events=list(events), days=days, horizon_h=horizon_h)
    if jobs > 1 and len(series) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            per_group = dict(pool.map(worker, series.items()))
    else:
        per_group = dict(map(worker, series.items()))
    doc: dict[str, Any] = {
        "series": str(series_csv),
        "target": "+".join(targets),
        "agg": agg,
        "by": by,
        "horizon_h": horizon_h,
        "days": days,
    }
    if by is None:
        doc["models"] = per_group["all"]
        doc["berth_vs_best"] = _berth_vs_best(doc["models"])
        return doc
    doc["groups"] = {g: {"models": m} for g, m in per_group.items()}
    doc["models"] = {
        name: {
            key: float(pd.Series([m[name][key] for m in per_group.values()]).mean())
            for key in (*_METRICS, "origins")
        }
        for name in models
    }
    doc["berth_vs_best"] = _berth_vs_best(doc["models"])
    return doc


def _fit_once(series: pd.Series, *, horizon_h: int) -> tuple[float, float]:
    """(wall s, CPU s of this process and its CmdStan children) of one berth fit + forecast."""
    t0, c0, k0 = time.perf_counter(), time.process_time(), children_cpu_s()
    make_model("berth").fit(series).forecast(horizon_h)
    return time.perf_counter() - t0, time.process_time() - c0 + children_cpu_s() - k0


def refresh(
    *,
    series_csv: str | Path,
    targets: Sequence[str],
    agg: str,
    by: str | None,
    n: int,
    jobs: int,
    horizon_h: int = 24,
    ds_col: str = "ds",
) -> dict[str, Any]:
    """Time ``n`` berth fits (see the module docstring)."""  # fmt: skip
    frame = pd.read_csv(series_csv)
    groups = list(to_hourly(frame, value_cols=list(targets), agg=agg, ds_col=ds_col, by=by).values())
    batch = []
    for i in range(n):
        series = groups[i % len(groups)]
        batch.append(series.iloc[: len(series) - 24 * (i // len(groups))])
    t0 = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            measured = list(pool.map(partial(_fit_once, horizon_h=horizon_h), batch))
    else:
        measured = [_fit_once(s, horizon_h=horizon_h) for s in batch]
    wall = time.perf_counter() - t0
    times = [m[0] for m in measured]
    cpu = sorted(m[1] for m in measured)
    return {
        "series": str(series_csv),
        "refresh": {
            "series": n, "jobs": jobs, "wall_s": wall,
            "fit_s_mean": sum(times) / len(times), "fit_s_max": max(times),
            "fit_cpu_s_mean": sum(cpu) / len(cpu), "fit_cpu_s_median": cpu[len(cpu) // 2],
        },
    }  # fmt: skip


def _print_table(doc: dict[str, Any]) -> None:
    title = f"{doc['series']} {doc['target']} ({doc['agg']}"
    title += f", mean over {len(doc['groups'])} groups by {doc['by']})" if doc.get("by") else ")"
    print(title)
    print(f"{'model':<22}{'mase':>8}{'smape':>8}{'cov80':>8}{'cov_u95':>8}{'fit_s':>8}{'cpu_s':>8}")
    for name, m in doc["models"].items():
        print(
            f"{name:<22}{m['mase']:>8.3f}{m['smape']:>8.1f}{m['coverage_80']:>8.3f}"
            f"{m['coverage_upper_95']:>8.3f}{m['fit_s_mean']:>8.3f}{m['fit_cpu_s_mean']:>8.3f}"
        )
    if doc.get("berth_vs_best") is not None:
        print(f"berth MASE / best baseline: {doc['berth_vs_best']:.3f}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.forecast", description=__doc__.split("\n")[0])
    parser.add_argument("--series", required=True, help="CSV with a timestamp column")
    parser.add_argument(
        "--target", default=None, help="column, or columns joined by '+' (default: a timestamp,value CSV)"
    )
    parser.add_argument("--agg", choices=("sum", "mean"), default="sum")
    parser.add_argument("--by", default=None, help="one series per value of this column")
    parser.add_argument("--horizon-h", type=int, default=24)
    parser.add_argument("--days", type=int, default=28, help="rolling daily origins")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--ablation", action="store_true", help="also run the berth_no_* variants")
    parser.add_argument("--events", default=None, help="JSON event calendar (Prophet holidays)")
    parser.add_argument("--ds-col", default="ds")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (per group)")
    parser.add_argument("--refresh", type=int, default=0, help="only time N berth refits")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.target is None:
        args.ds_col, args.target = plain_columns(args.series)
    if args.refresh:
        doc = refresh(
            series_csv=args.series, targets=args.target.split("+"), agg=args.agg, by=args.by,
            n=args.refresh, jobs=args.jobs, horizon_h=args.horizon_h, ds_col=args.ds_col,
        )  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        r = doc["refresh"]
        print(f"{r['series']} berth refits on {r['jobs']} processes: {r['wall_s']:.1f} s wall, "
              f"{r['fit_s_mean']:.3f} s mean / {r['fit_s_max']:.3f} s max per fit, "
              f"CPU with children {r['fit_cpu_s_mean']:.3f} s mean / "
              f"{r['fit_cpu_s_median']:.3f} s median")  # fmt: skip
        return 0
    models = [m for m in args.models.split(",") if m]
    if args.ablation:
        models += [m for m in ABLATION_NAMES if m not in models]
    t0 = time.perf_counter()
    doc = run(
        series_csv=args.series,
        targets=args.target.split("+"),
        agg=args.agg,
        by=args.by,
        horizon_h=args.horizon_h,
        days=args.days,
        models=models,
        events=events_from_json(args.events) if args.events else (),
        ds_col=args.ds_col,
        jobs=args.jobs,
    )
    doc["wall_s"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    _print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
