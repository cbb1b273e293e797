"""Whole-round benchmark (DESIGN §8): one engine round on a real database, phase by phase.

    python -m bench.round (--preset full|demo | --nodes N --gpus-per-node G --running R --pending P) \
        [--rounds K] [--history H] [--step-s S] [--running-mix full|engine-scale] \
        [--alternatives-bookings N] [--keep-db] --out FILE.json

What runs is the portal's own round, `scheduling.rounds.engine_round_run`: the simulator
backend's snapshot (its state in Redis, like the demo), reconcile, the frozen snapshot built by
the selectors, `plan_round` (policy ``berth``), the plan persisted in one transaction and the
backend's apply after the commit.  ``phases_ms`` holds the median of each phase over the rounds
(``backend_snapshot``, ``reconcile``, ``snapshot_build``, ``plan``, ``persist``, ``apply``).

The database is the bench's own: ``berth_bench_round`` (``--db-name``) on the server of
``DATABASE_URL`` is created, migrated, filled and dropped at the end (``--keep-db`` keeps it);
the simulator's Redis keys (on ``REDIS_URL``, prefixed with that database's name) are deleted
too.  The cluster: N nodes of G A100s; R running jobs of 1-8 GPUs packed onto the nodes (30 %
preemptible; the simulator starts them at setup, with true runtimes of 5 min to 8 h, so some end
during the rounds, and their backend references are recorded as the rounds that started them
would have); P pending jobs from 200 users in 25 projects (5 % interactive, 80 % with a stored
runtime prediction, the rest predicted in the round from ``--history`` finished jobs); an open
booking per 20 nodes in the next day on GPUs left free; quotas on half the projects; then
``ANALYZE`` (a database in service has planner statistics). Each round runs ``--step-s`` later
than the one before on the engine clock, so the rounds see jobs end, starts and preemptions as a
live cluster would. The first round starts the most work (the free GPUs fill); it is reported on
its own as ``first_round_ms`` and counted in the quantiles like every other round. The runtime
predictor is built before the rounds (a long-running worker has it) and its build reported as
``predictor_build_ms``; so is what a worker does when its process starts
(`scheduling.rounds.round_process_warm`, ``warm_ms``).
``round_ms_p99`` is the nearest-rank 99th percentile over the rounds run: with fewer than 100
rounds it is the slowest round, which is usually the first (it is never left out).  Per round
also ``cpu_ms`` (this process's CPU time, `time.process_time`) and ``db_cpu_ms`` (the CPU time
of the round's PostgreSQL backend process, read from ``/proc``: 0 for a remote server), with
p50/p99 in the summary: on a shared machine the wall time says how busy the cores were, CPU
time what the round cost.  ``--preset full|demo`` fills the size flags of the two targets.
Django runs with ``DEBUG`` off (``DJANGO_DEBUG=0`` unless set), as a worker does.
Rounds run with Python's cyclic collector paused; the collection each leaves is timed apart
(``per_round[].gc_after_ms``, ``gc_after_ms_p50``), not in ``round_ms``.

``--running-mix`` (`RUNNING_MIXES`): ``full`` (default) packs the running jobs onto ~95 % of the
GPUs, ``engine-scale`` like ``bench.engine_scale`` (~70 %).  ``--alternatives-bookings N`` then
times a refused booking's alternatives search on a calendar of N bookings (``bench._calendar``;
``alternatives`` in the JSON: ``alternatives_ms_p50``, ``alternatives_ms_p99`` over the refused
requests).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from bench._benchdb import database_create, database_drop, django_setup, redis_keys_delete
from bench._roundlab import RUNNING_MIXES, lab_build
from bench._util import format_table, write_json
from scheduling.stats import percentile

PHASES = ("backend_snapshot", "reconcile", "snapshot_build", "plan", "persist", "apply")
DEFAULT_DB = "berth_bench_round"
# The two labs of issue 13's targets: p99 <= 1 s at full size, <= 300 ms in the demo.
PRESETS: dict[str, dict[str, int]] = {
    "full": {"nodes": 1_000, "gpus_per_node": 8, "running": 2_048, "pending": 10_000},
    "demo": {"nodes": 32, "gpus_per_node": 5, "running": 30, "pending": 2_000},
}


def rounds_run(*, cluster_id: int, rounds: int, now: datetime, step_s: float) -> list[dict[str, Any]]:
    """Run ``rounds`` engine rounds, ``step_s`` apart on the engine clock; one dict per round."""
    from scheduling.rounds import cyclic_gc_paused, engine_round_run

    out = []
    db_cpu_s = _db_backend_cpu()
    for i in range(rounds):
        at = now + timedelta(seconds=step_s * (i + 1))
        # The round runs with the cyclic collector paused (`rounds.cyclic_gc_paused`), and the
        # worker's task holds it paused around the round as here: what the round left for the
        # collector is timed apart (the worker pays it after the round has returned).
        with cyclic_gc_paused():
            db_before = db_cpu_s()
            cpu_before = time.process_time()
            started = time.perf_counter()
            result = engine_round_run(cluster_id=cluster_id, now=at)
            wall_ms = (time.perf_counter() - started) * 1000.0
            cpu_ms = (time.process_time() - cpu_before) * 1000.0
            db_cpu_ms = (db_cpu_s() - db_before) * 1000.0
            gc_t0 = time.perf_counter()
        gc.collect()
        gc_ms = (time.perf_counter() - gc_t0) * 1000.0
        if result.status != "ok":
            raise SystemExit(f"round {i + 1}: {result.status}: {result.message}")
        out.append(
            {
                "round_ms": wall_ms,
                "cpu_ms": cpu_ms,
                "db_cpu_ms": db_cpu_ms,
                "gc_after_ms": gc_ms,
                "phases_ms": dict(result.phases_ms),
                "started": result.started,
                "finished": result.finished,
                "requeued": result.requeued,
                "preempted": result.preempted,
                "pending": result.pending,
                "conflicts": result.start_conflicts,
            }
        )
    return out


def _db_backend_cpu() -> Any:
    """A function giving the CPU seconds the round's PostgreSQL backend has used so far (its
    process on this machine, `bench._cpu`; 0 when it cannot be read, e.g. a remote server)."""
    from django.db import connection

    from bench._cpu import _proc_cpu_s

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    return lambda: _proc_cpu_s(pid)


def state_check(*, cluster_id: int) -> dict[str, int]:
    """What the rounds left in the database, against the simulator: counts of anything wrong.

    ``overlaps``: pairs of live allocations of one GPU that overlap in time (the exclusion
    constraint makes it 0); ``running_not_in_backend`` / ``backend_not_in_db``: running jobs the
    other side does not run; ``gpu_mismatch``: running jobs whose active allocations are not
    the GPUs the simulator runs them on; ``unexplained``: pending jobs without a reason.
    """
    from django.db import connection

    from scheduling.backend_registry import backend_for_cluster
    from scheduling.models import Allocation, Cluster, Job

    cluster = Cluster.objects.get(pk=cluster_id)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM scheduling_allocation a JOIN scheduling_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
             WHERE a.state <> 'released' AND b.state <> 'released'
            """
        )
        overlaps = int(cursor.fetchone()[0])
    backend = backend_for_cluster(cluster)
    records = backend.records()  # type: ignore[attr-defined]
    sim_running = {k: sorted(r["gpu_ids"]) for k, r in records.items() if r["state"] == "running"}
    db_running: dict[str, list[int]] = {}
    for job_id, gpu_id in Allocation.objects.filter(
        job__cluster=cluster,
        job__status__in=(Job.Status.RUNNING, Job.Status.STARTING),
        state=Allocation.State.ACTIVE,
    ).values_list("job_id", "gpu_id"):
        db_running.setdefault(str(job_id), []).append(gpu_id)
    running_ids = {
        str(pk)
        for pk in Job.objects.filter(
            cluster=cluster, status__in=(Job.Status.RUNNING, Job.Status.STARTING)
        ).values_list("pk", flat=True)
    }
    return {
        "overlaps": overlaps,
        "running_not_in_backend": len(running_ids - set(sim_running)),
        "backend_not_in_db": len(set(sim_running) - running_ids),
        "gpu_mismatch": sum(
            1 for k in running_ids & set(sim_running) if sorted(db_running.get(k, [])) != sim_running[k]
        ),
        "unexplained": Job.objects.filter(
            cluster=cluster, status=Job.Status.PENDING, pending_reason=""
        ).count(),
    }


def summarize(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["round_ms"] for r in per_round]
    return {
        "round_ms_p50": percentile(times, 50, method="nearest"),
        "round_ms_p99": percentile(times, 99, method="nearest"),
        "round_ms_mean": statistics.fmean(times) if times else 0.0,
        "first_round_ms": times[0] if times else 0.0,
        "cpu_ms_p50": percentile([r["cpu_ms"] for r in per_round], 50, method="nearest"),
        "cpu_ms_p99": percentile([r["cpu_ms"] for r in per_round], 99, method="nearest"),
        "db_cpu_ms_p50": percentile([r["db_cpu_ms"] for r in per_round], 50, method="nearest"),
        "db_cpu_ms_p99": percentile([r["db_cpu_ms"] for r in per_round], 99, method="nearest"),
        "phases_ms": {
            phase: percentile([r["phases_ms"].get(phase, 0.0) for r in per_round], 50, method="nearest")
            for phase in PHASES
        },
        "phases_ms_p99": {
            phase: percentile([r["phases_ms"].get(phase, 0.0) for r in per_round], 99, method="nearest")
            for phase in PHASES
        },
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.round", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="the lab of a target: 'full' (1,000x8, 2,048 running, 10,000 pending) or 'demo'"
        " (32x5, 30 running, 2,000 pending); the four size flags override it",
    )
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--running", type=int)
    parser.add_argument("--pending", type=int)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--history", type=int, default=5_000, help="finished jobs in the last week")
    parser.add_argument("--step-s", type=float, default=15.0, help="engine-clock seconds between rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db-name", default=DEFAULT_DB)
    parser.add_argument("--keep-db", action="store_true", help="keep the bench database afterwards")
    parser.add_argument(
        "--running-mix",
        choices=sorted(RUNNING_MIXES),
        default="full",
        help="GPUs per running job (see RUNNING_MIXES)",
    )
    parser.add_argument(
        "--alternatives-bookings",
        type=int,
        default=0,
        help="then time a refused booking's alternatives search on a calendar of this many bookings",
    )
    parser.add_argument("--out", required=True)
    return parser


def _measure(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Build the lab in the bench database at ``url``, run the rounds, check the state."""
    django_setup(url)
    from django.db import connections
    from django.utils import timezone

    redis_keys_delete(f"berth:livesim:{args.db_name}:*")
    now = timezone.now().replace(microsecond=0)
    setup_t0 = time.perf_counter()
    lab = lab_build(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        running=args.running,
        pending=args.pending,
        history=args.history,
        now=now,
        seed=args.seed,
        running_mix=args.running_mix,
    )
    setup_s = time.perf_counter() - setup_t0
    # A worker imports the forecasting app (pandas, for the headroom) and builds the cluster's
    # runtime predictor from its finished jobs once in its life (then feeds it what finishes),
    # not once per round: the rounds measured here are a long-running worker's.  The build is
    # reported on its own (``predictor_build_ms``).
    from forecasting.selectors import runtime_predictor_get
    from scheduling.rounds import round_process_warm

    predictor_t0 = time.perf_counter()
    runtime_predictor_get(cluster_id=lab["cluster_id"])
    predictor_build_ms = (time.perf_counter() - predictor_t0) * 1000.0
    # And what the worker does when its process starts (`scheduling.tasks`): the URL resolver.
    warm_t0 = time.perf_counter()
    round_process_warm()
    warm_ms = (time.perf_counter() - warm_t0) * 1000.0

    per_round = rounds_run(cluster_id=lab["cluster_id"], rounds=args.rounds, now=now, step_s=args.step_s)
    check = state_check(cluster_id=lab["cluster_id"])
    extra: dict[str, Any] = {}
    if args.alternatives_bookings > 0:
        from bench._calendar import alternatives_phase

        extra["alternatives"] = alternatives_phase(
            bookings=args.alternatives_bookings, now=now, seed=args.seed
        )
    connections.close_all()
    return {
        **extra,
        **summarize(per_round),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        **{key: lab[key] for key in ("running", "running_gpus", "pending", "bookings", "history")},
        "rounds": args.rounds,
        "step_s": args.step_s,
        "setup_s": setup_s,
        "running_mix": args.running_mix,
        "predictor_build_ms": predictor_build_ms,
        "warm_ms": warm_ms,
        "gc_after_ms_p50": percentile([r["gc_after_ms"] for r in per_round], 50, method="nearest"),
        "state": check,
        "per_round": per_round,
    }


def _print_report(document: dict[str, Any]) -> None:
    print(
        f"{document['nodes']}x{document['gpus_per_node']} GPUs, {document['running']} running"
        f" ({document['running_gpus']} GPUs), {document['pending']} pending, {document['rounds']} rounds"
        f" (setup {document['setup_s']:.1f} s)"
    )
    rows = [["round", document["round_ms_p50"], document["round_ms_p99"]]]
    rows += [[phase, document["phases_ms"][phase], document["phases_ms_p99"][phase]] for phase in PHASES]
    rows += [["cpu (bench)", document["cpu_ms_p50"], document["cpu_ms_p99"]]]
    rows += [["cpu (PostgreSQL)", document["db_cpu_ms_p50"], document["db_cpu_ms_p99"]]]
    rows += [["first round", document["first_round_ms"], document["first_round_ms"]]]
    print(format_table(["ms", "p50", "p99"], rows))
    print("state:", ", ".join(f"{k} {v}" for k, v in document["state"].items()))
    if "alternatives" in document:
        alt = document["alternatives"]
        print(
            f"alternatives on {alt['bookings']:,} bookings ({alt['calendar_days']} days, {alt['gpus']} GPUs),"
            f" {alt['refused_calls']} refused of {alt['calls']} calls:"
            f" p50 {alt['alternatives_ms_p50']:.1f} ms, p99 {alt['alternatives_ms_p99']:.1f} ms,"
            f" max {alt['alternatives_ms_max']:.1f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for key, value in PRESETS.get(args.preset or "", {}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    missing = [k for k in ("nodes", "gpus_per_node", "running", "pending") if getattr(args, k) is None]
    if missing:
        parser.error(f"give --preset or every size flag (missing: {', '.join(missing)})")
    if (
        min(args.nodes, args.gpus_per_node, args.rounds) < 1
        or min(args.running, args.pending, args.history) < 0
    ):
        parser.error("--nodes, --gpus-per-node and --rounds must be positive; counts non-negative")
    base_url = os.environ.get("DATABASE_URL", "postgres://berth:berth@127.0.0.1:55433/berth")
    url = database_create(base_url, args.db_name)
    try:
        document = _measure(args, url)
    finally:
        if not args.keep_db:
            try:
                redis_keys_delete(f"berth:livesim:{args.db_name}:*")
            except Exception as exc:  # Django never came up: nothing was written to Redis
                print(f"note: simulator keys not cleared: {exc}", file=sys.stderr)
            database_drop(base_url, args.db_name)
    write_json(args.out, document)
    _print_report(document)
    return 0 if not any(document["state"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
