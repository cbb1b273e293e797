"""Trace replay benchmark (DESIGN §8): every policy on the same workload through the simulator.

    python -m bench.replay --trace CSV --cluster SPEC [--cluster-scale F] \
        --policies fifo,easy,static,berth [--interactive-share F] [--booking-share F] \
        [--arrival-scale F] [--seed N] [--limit-jobs N] [--workers N] [--no-bounds] \
        [--dump-demand CSV] --out FILE.json

``SPEC`` is ``NxG[:TYPE]`` or an inventory CSV (scaled by ``--cluster-scale``, keeping the GPU
type mix and node sizes).  Arrivals and runtimes come from the trace, never its start times;
overlays and batch preemptibility flags are seeded and identical for every policy.  The
semantics of each metric are in ``scheduling/sim/metrics.py`` and ``docs/benchmarks.md``.

Bounds (``bounds`` in the JSON, same workload): ``session_floor``, ``busy_util_ceiling`` (the
largest of the policies' own ceilings, each an upper bound on that policy's busy_utilization)
and the greedy ``busy_util_packing`` estimate (`scheduling.sim.bounds`), and ``easy_oracle``
(``easy`` with true runtimes as the estimates, replayed like a policy).  berth's interactive
headroom and pool come from the portal's forecaster fitted on the overlay's own past session
demand (`scheduling.sim.forecast`), once in the parent before the workers fork (``forecast`` in
the JSON gives the fits and their cost); fits are cached on disk by the hash of their inputs and
code (``--forecast-cache``), so a re-run of the same workload skips them.

Policies replay independently, so they run in parallel worker processes (``--workers``, by
default one per replay, `_default_workers`); each policy's ``wall_s`` is measured inside its
worker (so it includes time shared with the others), and the JSON is the same whatever the
number of workers.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench._util import DEFAULT_ENGINE, format_table, load_callable, write_json
from scheduling.sim import bounds
from scheduling.sim.arrivals import scale_arrivals
from scheduling.sim.forecast import SessionForecast, fit_session_forecast, hourly_demand
from scheduling.sim.inventory import Inventory, load_inventory
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import Overlay, OverlayConfig, build_overlay
from scheduling.sim.replay import POLICIES, PlanFn, ReplayOptions, run_replay
from scheduling.sim.runtime import default_predictor
from scheduling.sim.trace import Trace, load_trace

_DEFAULT_FORECAST_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "berth-bench",
    "forecast",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True, help="trace CSV (gzip allowed)")
    parser.add_argument("--cluster", required=True, help="NxG[:TYPE] or an inventory CSV")
    parser.add_argument("--cluster-scale", type=float, default=1.0, help="share of the inventory CSV's nodes")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy names")
    parser.add_argument(
        "--interactive-share", type=float, default=0.0, help="on-demand sessions, share of GPU-h"
    )
    parser.add_argument("--booking-share", type=float, default=0.0, help="advance bookings, share of GPU-h")
    parser.add_argument("--preemptible-share", type=float, default=OverlayConfig().preemptible_share)
    parser.add_argument("--checkpointable-share", type=float, default=OverlayConfig().checkpointable_share)
    parser.add_argument(
        "--guaranteed-share",
        type=float,
        default=OverlayConfig().guaranteed_share,
        help="share of capacity split over projects as guaranteed GPUs (default 0.5; 0: no quotas); "
        "under berth work above a project's guarantee borrows as preemptible work (Kueue)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit-jobs", type=int, default=None, help="replay only the first N jobs")
    parser.add_argument(
        "--arrival-scale",
        type=float,
        default=1.0,
        help="divide every gap between submissions by F: the same jobs (sizes, runtimes, order) "
        "arriving F times faster, for contention on a trace that samples its cluster's load; "
        "1 (default) replays the logged arrivals",
    )
    parser.add_argument(
        "--engine", default=DEFAULT_ENGINE, help="module:function with plan_round's signature"
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=ReplayOptions().tick_s,
        help="round tick while jobs wait and GPUs are free (doubles while idle); 0 disables",
    )
    parser.add_argument(
        "--still-ticks",
        choices=("skip", "plan", "verify"),
        default="skip",
        help="easy, static and berth: a tick that would plan what the last round planned is skipped "
        "(default), planned like any round, or planned and checked to be the no-op skipping "
        "assumes (an error if not); the metrics are the same (scheduling/sim/replay_still.py)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="parallel replay processes (default: one per replay, at most 4 per CPU; 1: all in this process)",
    )
    parser.add_argument("--no-bounds", action="store_true", help="skip the bounds (faster)")
    parser.add_argument(
        "--forecast-cache",
        default=_DEFAULT_FORECAST_CACHE,
        help="directory of cached forecast fits (each named by the hash of its inputs and of the "
        "forecasting code, so a re-run of the same workload reads them); '' disables "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--dump-demand",
        default=None,
        help="write the overlay's hourly session demand as CSV (ds,demand_gpus)",
    )
    parser.add_argument("--out", required=True, help="JSON output path")
    return parser.parse_args(argv)


@dataclass(frozen=True, slots=True)
class _Workload:
    """What every policy's replay shares (built once, inherited by forked workers)."""

    trace: Trace
    inventory: Inventory
    overlay: Overlay
    plan_fn: PlanFn
    options: ReplayOptions
    seed: int
    forecast: SessionForecast | None


_WORKLOAD: _Workload | None = None  # set in the parent before the workers fork
ORACLE = "easy_oracle"  # easy with true runtimes: a bound, replayed like a policy


def _replay_policy(policy: str) -> tuple[str, dict[str, Any], int, float]:
    """Replay one policy; returns (policy, its metrics with ``wall_s``, rounds, CPU seconds)."""
    work = _WORKLOAD
    assert work is not None, "the workload is set before replaying"
    predictor = default_predictor()
    started = time.perf_counter()
    cpu_started = time.process_time()
    is_oracle = policy == ORACLE
    record = run_replay(
        work.trace,
        work.inventory,
        work.overlay,
        policy="easy" if is_oracle else policy,
        plan_fn=work.plan_fn,
        predictor=predictor,
        options=work.options,
        seed=work.seed,
        forecast=work.forecast,
        oracle=is_oracle,
    )
    record.wall_s = time.perf_counter() - started
    metrics = compute_metrics(record)
    metrics["predictor"] = type(predictor).__name__ if policy in work.options.predict_for else None
    metrics["cpu_s"] = time.process_time() - cpu_started
    return policy, metrics, len(record.round_ms), time.process_time() - cpu_started


def _ignore_sigint() -> None:
    # ctrl-C reaches the whole process group: the parent handles it and terminates the workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _default_workers(replays: int, cpus: int) -> int:
    """One process per replay, at most four per CPU.

    The replays are unequal and none can be split, so a pool of one worker per CPU leaves CPUs
    idle at the end: on two CPUs the whole-trace overlay run (easy, static, berth) put easy
    after static on one worker, about static + easy = 305 s, while three processes sharing the
    two CPUs took 284-286 s (docs/benchmarks.md, "Issue 11 targets at a glance").  With one
    process each, the kernel shares the CPUs and the wall time approaches max(longest replay,
    total CPU / CPUs), the least any order reaches.  Four per CPU bounds the memory (each
    worker holds its own replay state).
    """
    return max(1, min(replays, 4 * cpus))


# Which replays usually take longest (CPU per replay on the KTH runs of docs/benchmarks.md,
# seed 1, whole trace: berth 64 s, static 44 s, easy 38 s, fifo 27 s, at load 0.4-1.3): berth
# plans the most per round.  Dispatching the longest first (LPT) keeps one worker from
# starting a long replay last: on the KTH four-policy run with 2 workers, arrival order put
# fifo (then 75 s, before its ticks were cut) and berth on one worker (143.7 s wall for 227
# CPU-s).  Only the dispatch order changes; results are reported and returned in
# ``policies`` order.
_EXPECTED_COST = {"berth": 4, "static": 3, "easy": 2, "fifo": 1}


def _longest_first(policies: list[str]) -> list[str]:
    """``policies`` sorted by expected replay cost, longest first (stable for ties)."""
    return sorted(policies, key=lambda p: -_EXPECTED_COST.get(p, 2))


def _replay_all(
    policies: list[str],
    workers: int,
    *,
    partial_path: str | None = None,
    bound_values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every policy's metrics, in ``policies`` order; in parallel when ``workers`` > 1.

    Workers are forked so they inherit the loaded workload; a worker's exception is re-raised
    here, and an error or ctrl-C terminates the other workers before propagating.  With
    ``partial_path``, the metrics of the policies done so far are written there as each one
    finishes, with the workload's ``bound_values`` (a long run that is stopped keeps what it
    measured).
    """
    done: dict[str, dict[str, Any]] = {}

    def report(policy: str, metrics: dict[str, Any], rounds: int, cpu_s: float) -> None:
        done[policy] = metrics
        line = f"  {policy}: {metrics['wall_s']:.1f} s wall, {cpu_s:.1f} s CPU, {rounds} rounds"
        print(line, file=sys.stderr)
        if partial_path:
            write_json(partial_path, {"partial": True, "bounds": bound_values or {}, "policies": done})

    can_fork = "fork" in multiprocessing.get_all_start_methods()
    if workers <= 1 or len(policies) <= 1 or not can_fork:
        for policy in policies:
            report(*_replay_policy(policy))
    else:
        context = multiprocessing.get_context("fork")
        with context.Pool(min(workers, len(policies)), initializer=_ignore_sigint) as pool:
            # leaving the block (normally, on a worker's error or on ctrl-C) terminates the pool
            for result in pool.imap_unordered(_replay_policy, _longest_first(policies)):
                report(*result)
    return {policy: done[policy] for policy in policies}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Replay every requested policy and return the benchmark's JSON document."""
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; expected some of {', '.join(POLICIES)}")
    plan_fn = load_callable(args.engine)
    trace = scale_arrivals(load_trace(args.trace, limit_jobs=args.limit_jobs), args.arrival_scale)
    inventory = load_inventory(args.cluster, scale=args.cluster_scale, seed=args.seed)
    overlay = build_overlay(
        trace,
        OverlayConfig(
            interactive_share=args.interactive_share,
            booking_share=args.booking_share,
            preemptible_share=args.preemptible_share,
            checkpointable_share=args.checkpointable_share,
            guaranteed_share=args.guaranteed_share,
            seed=args.seed,
        ),
        inventory=inventory,
    )
    options = ReplayOptions(
        tick_s=args.tick_s,
        max_tick_s=max(args.tick_s, ReplayOptions().max_tick_s),
        skip_still_ticks=args.still_ticks != "plan",
        verify_still_ticks=args.still_ticks == "verify",
    )
    cpus = _usable_cpus()
    replays = len(policies) + (0 if args.no_bounds else 1)  # the oracle replays like a policy
    workers = args.workers if args.workers is not None else _default_workers(replays, cpus)
    started = time.perf_counter()
    cpu_started = time.process_time()
    span_end = max((job.submit_at for job in trace.jobs), default=0.0)
    if args.dump_demand:
        _dump_demand(args.dump_demand, overlay, hours=math.ceil(span_end / 3600.0) + 1)
    forecast = None
    if "berth" in policies and overlay.sessions:
        forecast = fit_session_forecast(
            overlay,
            inventory,
            end_at=span_end,
            week_phase_s=trace.week_phase_s,
            workers=min(workers, cpus),
            cache_dir=args.forecast_cache or None,
        )
        print(
            f"  forecast: {forecast.fits} fits ({forecast.cached} from the cache), "
            f"{forecast.fit_s:.1f} s wall",
            file=sys.stderr,
        )
    global _WORKLOAD
    _WORKLOAD = _Workload(trace, inventory, overlay, plan_fn, options, args.seed, forecast)
    bound_values: dict[str, Any] = {}
    replayed = list(policies)
    if not args.no_bounds:
        bound_values = _workload_bounds(trace, overlay, inventory)
        replayed.append(ORACLE)
    try:
        results = _replay_all(
            replayed, workers, partial_path=args.out + ".partial", bound_values=bound_values
        )
    finally:
        _WORKLOAD = None
    if not args.no_bounds:
        _replayed_bounds(results, bound_values)
    total_s = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = time.process_time() - cpu_started + children.ru_utime + children.ru_stime
    load = os.getloadavg()
    print(
        f"  total: {total_s:.1f} s wall, {cpu_s:.1f} s CPU for {len(replayed)} replays "
        f"(load average {load[0]:.2f})",
        file=sys.stderr,
    )
    run_info = {"wall_s": total_s, "cpu_s": cpu_s, "load_average_1m": load[0], "workers": workers}
    return _document(args, trace, inventory, overlay, results, bound_values, forecast, run_info)


def _workload_bounds(trace: Trace, overlay: Overlay, inventory: Inventory) -> dict[str, Any]:
    """The bounds computed from the workload alone: the session floor and the packing bound."""
    capacity_by_type: dict[str, int] = {}
    for node in inventory.nodes:
        capacity_by_type[node.gpu_type] = capacity_by_type.get(node.gpu_type, 0) + len(node.gpu_ids)
    bounds_started = time.perf_counter()
    found: dict[str, Any] = {
        "session_floor": bounds.session_floor(overlay, capacity_gpus=inventory.capacity_gpus),
        "busy_util_packing": bounds.busy_util_packing(trace, overlay, capacity_by_type=capacity_by_type),
    }
    found["packing_wall_s"] = time.perf_counter() - bounds_started
    return found


def _replayed_bounds(results: dict[str, Any], bound_values: dict[str, Any]) -> None:
    """Add the bounds that come from the replays to ``bound_values``; the oracle's replay
    leaves ``results`` (it is a bound, not a policy)."""
    # per policy on its own queue windows (scheduling.sim.bounds): the largest bounds them all
    bound_values["busy_util_ceiling"] = max(m["busy_util_ceiling"] for m in results.values())
    if ORACLE in results:
        oracle = results.pop(ORACLE)
        bound_values["easy_oracle"] = {
            key: oracle[key] for key in ("busy_utilization", "wait_mean_s", "bounded_slowdown_mean")
        } | {
            "wall_s": oracle["wall_s"],
            "interactive_over_60s_share": oracle["interactive_over_60s_share"],
            "busy_util_ceiling": oracle["busy_util_ceiling"],
        }


def _document(
    args: argparse.Namespace,
    trace: Trace,
    inventory: Inventory,
    overlay: Overlay,
    results: dict[str, Any],
    bound_values: dict[str, Any],
    forecast: SessionForecast | None,
    run_info: dict[str, Any],
) -> dict[str, Any]:
    """The benchmark's JSON document (DESIGN §8 keys)."""
    return {
        "trace": trace.name,
        "jobs": len(trace.jobs),
        "capacity_gpus": inventory.capacity_gpus,
        "cluster": inventory.name,
        "gpu_types": {
            t.name: sum(len(n.gpu_ids) for n in inventory.nodes if n.gpu_type == t.name)
            for t in inventory.gpu_types
        },
        "seed": args.seed,
        "arrival_scale": args.arrival_scale,
        "tick_s": args.tick_s,
        "skipped_jobs": {"no_runtime": trace.skipped_no_runtime, "no_gpus": trace.skipped_no_gpus},
        "trace_gpu_hours": trace.gpu_hours,
        "overlay": {
            "interactive_share": args.interactive_share,
            "booking_share": args.booking_share,
            "preemptible_share": args.preemptible_share,
            "checkpointable_share": args.checkpointable_share,
            "parameters": overlay.parameters(),
            **overlay.stats(),
        },
        "policies": results,
        "bounds": bound_values,
        "forecast": forecast.report() if forecast is not None else None,
        "run": run_info,
    }


def _dump_demand(path: str, overlay: Overlay, *, hours: int) -> None:
    """The overlay's hourly session demand (GPUs, hourly mean) as ``ds,demand_gpus`` for bench.forecast."""
    import pandas as pd

    values = hourly_demand(overlay, hours=hours)
    index = pd.date_range("2000-01-03", periods=len(values), freq="h")
    pd.DataFrame({"ds": index, "demand_gpus": values}).to_csv(path, index=False)


def summary(document: dict[str, Any]) -> str:
    """The short table printed after a run."""
    header = [
        "policy",
        "util",
        "busy_util",
        "wait_mean_s",
        "wait_p95_s",
        "bsld",
        "int_wait_p95",
        "int_>60s",
        "abandoned",
        "honored",
        "preempt",
        "lost_gpu_h",
        "frag_idle_h",
        "wall_s",
    ]
    rows = []
    for name, m in document["policies"].items():
        rows.append(
            [
                name,
                m["utilization"],
                m["busy_utilization"],
                m["wait_mean_s"],
                m["wait_p95_s"],
                m["bounded_slowdown_mean"],
                m["interactive_wait_p95_s"],
                m["interactive_over_60s_share"],
                m["sessions_abandoned"],
                m["bookings_honored"],
                m["preemptions"],
                m["lost_gpu_hours"],
                m["idle_gpu_hours"].get("fragmentation", 0.0),
                m["wall_s"],
            ]
        )
    title = (
        f"{document['trace']}: {document['jobs']} jobs on {document['capacity_gpus']} GPUs"
        f" ({document['cluster']})"
    )
    text = title + "\n" + format_table(header, rows)
    b = document.get("bounds") or {}
    if b:
        floor = b["session_floor"]
        oracle = b.get("easy_oracle", {})
        text += (
            f"\nbounds: session floor p95 {floor['interactive_wait_p95_s']:.0f} s, "
            f">60 s {floor['interactive_over_60s_share']:.3f}; "
            f"busy_util ceiling {b['busy_util_ceiling']:.3f} (packing {b['busy_util_packing']:.3f}); "
            f"easy_oracle busy {oracle.get('busy_utilization', 0):.3f}, "
            f"wait {oracle.get('wait_mean_s', 0):.0f} s, "
            f"bsld {oracle.get('bounded_slowdown_mean', 0):.1f}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        document = run(args)
    except KeyboardInterrupt:
        print("interrupted: no results written", file=sys.stderr)
        return 130
    write_json(args.out, document)
    print(summary(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
