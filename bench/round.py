"""Whole-round benchmark (DESIGN §8): one engine round on a real database, phase by phase.

    python -m bench.round --nodes N --gpus-per-node G --running R --pending P \
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
preemptible; the simulator starts them at setup, with true runtimes of 5 min to 8 h, so some
end during the rounds); P pending jobs from 200 users in 25 projects (5 % interactive, 80 %
with a stored runtime prediction, the rest predicted in the round from ``--history`` finished
jobs); an open booking per 20 nodes in the next day on GPUs left free; quotas on half the
projects.  Each round runs ``--step-s`` later than the one before on the engine clock, so the
rounds see jobs end, starts and preemptions as a live cluster would.  The first round starts
the most work (the free GPUs fill); it is reported on its own as ``first_round_ms`` and counted
in the quantiles like every other round.  The runtime predictor is built before the rounds (a
long-running worker has it) and its build reported as ``predictor_build_ms``; so is what a
worker does when its process starts (`scheduling.rounds.round_process_warm`, ``warm_ms``).
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
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bench._benchdb import database_create, database_drop, django_setup, redis_keys_delete
from bench._util import format_table, write_json
from scheduling.stats import percentile

PHASES = ("backend_snapshot", "reconcile", "snapshot_build", "plan", "persist", "apply")
DEFAULT_DB = "berth_bench_round"
# GPUs per running job: "full" packs 2,048 jobs onto ~95 % of 8,000 GPUs (the default; the first
# round then finds sessions blocked on a full cluster), "engine-scale" is bench.engine_scale's
# mix (~70 % busy, the queue head starts on free GPUs).
RUNNING_MIXES = {"full": (1, 2, 2, 4, 4, 8, 8), "engine-scale": (1, 1, 1, 2, 2, 4, 8)}
_PENDING_SIZES = (1, 1, 1, 2, 2, 4, 8)
_REQUESTED_S = (600, 3_600, 4 * 3_600, 12 * 3_600, 48 * 3_600)


@dataclass
class _Lab:
    """What the parts of `lab_build` share: the seeded RNG, the cluster and its people."""

    rng: random.Random
    now: datetime
    gpus_per_node: int
    running_sizes: tuple[int, ...] = RUNNING_MIXES["full"]
    cluster: Any = None
    gpu_type: Any = None
    users: list[Any] = field(default_factory=list)
    member_of: dict[int, Any] = field(default_factory=dict)

    def job_fields(self, size: int) -> dict[str, Any]:
        """A job's owner, project, size and estimate (30 % preemptible)."""
        user = self.users[self.rng.randrange(len(self.users))]
        return {
            "user": user,
            "project": self.member_of[user.pk],
            "cluster": self.cluster,
            "gpu_count": size,
            "requested_s": self.rng.choice(_REQUESTED_S),
            "is_preemptible": self.rng.random() < 0.3,
        }


def lab_build(
    *,
    nodes: int,
    gpus_per_node: int,
    running: int,
    pending: int,
    history: int,
    now: datetime,
    seed: int,
    running_mix: str = "full",
) -> dict[str, Any]:
    """Fill the bench database (see the module docstring); returns counts and the cluster id."""
    lab = _Lab(
        rng=random.Random(seed),
        now=now,
        gpus_per_node=gpus_per_node,
        running_sizes=RUNNING_MIXES[running_mix],
    )
    gpus_by_node = _lab_inventory(lab, nodes=nodes, seed=seed)
    _lab_people(lab, guaranteed=nodes * gpus_per_node // 50)
    history_count = _lab_history(lab, history)
    free = [list(g) for g in gpus_by_node]
    running_rows = _lab_running(lab, running, free=free)
    booking_count = _lab_bookings(lab, free=free, count=max(1, nodes // 20))
    pending_count = _lab_pending(lab, pending)
    _lab_sim_start(lab, running_rows)
    return {
        "cluster_id": lab.cluster.pk,
        "gpus": nodes * gpus_per_node,
        "running": len(running_rows),
        "running_gpus": sum(len(g) for _, g in running_rows),
        "pending": pending_count,
        "bookings": booking_count,
        "history": history_count,
    }


def _lab_inventory(lab: _Lab, *, nodes: int, seed: int) -> list[list[int]]:
    """The A100 type, the simulator cluster, its nodes and GPUs; GPU ids per node, in index order."""
    from scheduling.models import Cluster, Gpu, GpuType, Node

    lab.gpu_type = GpuType.objects.create(
        name="A100", memory_gib=80.0, precisions=["fp64", "tf32", "bf16", "fp16"], value=1.0
    )
    lab.cluster = Cluster.objects.create(
        name="bench-round",
        backend=Cluster.Backend.SIMULATOR,
        settings={"speedup": 1.0, "seed": seed, "policy": {"name": "berth"}},
    )
    node_rows = Node.objects.bulk_create(
        Node(
            cluster=lab.cluster,
            name=f"n{i:04d}",
            gpu_type=lab.gpu_type,
            gpu_count=lab.gpus_per_node,
            domain=f"r{i // 32}",
        )
        for i in range(nodes)
    )
    Gpu.objects.bulk_create(Gpu(node=node, index=i) for node in node_rows for i in range(lab.gpus_per_node))
    return [
        [g for g, _ in sorted(rows, key=lambda r: r[1])]
        for rows in _group(
            Gpu.objects.filter(node__cluster=lab.cluster).values_list("node_id", "id", "index")
        )
    ]


def _lab_people(lab: _Lab, *, guaranteed: int) -> None:
    """25 projects (quotas on every second one), 200 users, one membership each."""
    from django.contrib.auth import get_user_model

    from portal.accounts.models import Membership, Project, Quota

    user_model = get_user_model()
    projects = Project.objects.bulk_create(
        Project(slug=f"p{i:02d}", name=f"Project {i}", fair_share_weight=lab.rng.choice((1.0, 1.0, 2.0)))
        for i in range(25)
    )
    lab.users = user_model.objects.bulk_create(user_model(username=f"u{i:03d}") for i in range(200))
    lab.member_of = {u.pk: projects[i % len(projects)] for i, u in enumerate(lab.users)}
    Membership.objects.bulk_create(
        Membership(user=u, project=lab.member_of[u.pk], role=Membership.Role.MEMBER) for u in lab.users
    )
    Quota.objects.bulk_create(
        Quota(project=p, gpu_type=lab.gpu_type, guaranteed_gpus=guaranteed, borrow_limit_gpus=None)
        for p in projects[::2]
    )


def _lab_history(lab: _Lab, count: int) -> int:
    """Finished jobs of the last week: what the runtime predictor and the fair-share usage read."""
    from scheduling.models import Job

    rows = []
    for i in range(count):
        fields = lab.job_fields(lab.rng.choice(_PENDING_SIZES))
        ended = lab.now - timedelta(seconds=lab.rng.uniform(600, 7 * 86_400))
        run_s = lab.rng.uniform(0.1, 1.0) * fields["requested_s"]
        rows.append(
            Job(
                **fields,
                name=f"hist-{i % 40}",
                status=Job.Status.COMPLETED,
                submitted_at=ended - timedelta(seconds=run_s + 60),
                started_at=ended - timedelta(seconds=run_s),
                ended_at=ended,
                exit_code=0,
            )
        )
    Job.objects.bulk_create(rows, batch_size=2_000)
    return len(rows)


def _lab_running(lab: _Lab, count: int, *, free: list[list[int]]) -> list[tuple[Any, list[int]]]:
    """Running jobs packed onto the nodes (taking their GPUs out of ``free``), with allocations."""
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

    from scheduling.models import Allocation, Job

    rng, now = lab.rng, lab.now
    order = list(range(len(free)))
    rows: list[tuple[Any, list[int]]] = []
    for i in range(count):
        size = min(rng.choice(lab.running_sizes), lab.gpus_per_node)
        rng.shuffle(order)
        index = next((n for n in order if len(free[n]) >= size), None)
        if index is None:
            size, index = 1, next((n for n in order if free[n]), None)
            if index is None:
                break
        gpus, free[index] = free[index][:size], free[index][size:]
        fields = lab.job_fields(size)
        started = now - timedelta(seconds=rng.uniform(0, fields["requested_s"] / 2))
        job = Job(
            **fields,
            name=f"run-{i % 40}",
            status=Job.Status.RUNNING,
            submitted_at=started - timedelta(seconds=rng.uniform(0, 3_600)),
            started_at=started,
            predicted_p50_s=fields["requested_s"] * 0.4,
            predicted_p90_s=fields["requested_s"] * 0.8,
            payload={"sim_runtime_s": rng.uniform(300, 8 * 3_600)},
        )
        rows.append((job, gpus))
    Job.objects.bulk_create([job for job, _ in rows], batch_size=2_000)
    Allocation.objects.bulk_create(
        (
            Allocation(
                gpu_id=g,
                job=job,
                period=DateTimeTZRange(
                    job.started_at,
                    (job.started_at or now) + timedelta(seconds=(job.requested_s or 0) * 2),
                    "[)",
                ),
                state=Allocation.State.ACTIVE,
                is_preemptible=job.is_preemptible,
            )
            for job, gpus in rows
            for g in gpus
        ),
        batch_size=5_000,
    )
    return rows


def _lab_bookings(lab: _Lab, *, free: list[list[int]], count: int) -> int:
    """Bookings in the next day on GPUs no running job holds; returns how many."""
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

    from scheduling.models import Allocation, Booking

    rng = lab.rng
    with_room = [n for n in range(len(free)) if free[n]]
    rng.shuffle(with_room)
    made = 0
    for index in with_room[:count]:
        gpu_count = min(len(free[index]), rng.choice((1, 2, 4)))
        gpus, free[index] = free[index][:gpu_count], free[index][gpu_count:]
        user = lab.users[rng.randrange(len(lab.users))]
        start = lab.now + timedelta(seconds=rng.uniform(600, 86_400))
        end = start + timedelta(seconds=rng.choice((3_600, 4 * 3_600)))
        booking = Booking.objects.create(
            user=user,
            project=lab.member_of[user.pk],
            cluster=lab.cluster,
            gpu_type=lab.gpu_type,
            gpu_count=gpu_count,
            start_at=start,
            end_at=end,
        )
        Allocation.objects.bulk_create(
            Allocation(
                gpu_id=g,
                booking=booking,
                period=DateTimeTZRange(start, end, "[)"),
                state=Allocation.State.PLANNED,
            )
            for g in gpus
        )
        made += 1
    return made


def _lab_pending(lab: _Lab, count: int) -> int:
    """The queue: 5 % interactive sessions, 80 % with a stored runtime prediction."""
    from scheduling.models import Job

    rng = lab.rng
    rows = []
    for i in range(count):
        is_interactive = rng.random() < 0.05
        size = min(rng.choice((1, 2)) if is_interactive else rng.choice(_PENDING_SIZES), lab.gpus_per_node)
        fields = lab.job_fields(size)
        has_prediction = rng.random() < 0.8
        rows.append(
            Job(
                **{**fields, "is_preemptible": not is_interactive and rng.random() < 0.5},
                name=f"queued-{i % 40}",
                kind=Job.Kind.INTERACTIVE if is_interactive else Job.Kind.BATCH,
                status=Job.Status.PENDING,
                submitted_at=lab.now - timedelta(seconds=rng.uniform(0, 86_400)),
                predicted_p50_s=fields["requested_s"] * 0.4 if has_prediction else None,
                predicted_p90_s=fields["requested_s"] * 0.8 if has_prediction else None,
                payload={"sim_runtime_s": rng.uniform(300, 8 * 3_600)},
            )
        )
    Job.objects.bulk_create(rows, batch_size=2_000)
    return len(rows)


def _lab_sim_start(lab: _Lab, running_rows: list[tuple[Any, list[int]]]) -> None:
    """The simulator runs what the database says runs (through its own apply, the real interface)."""
    from scheduling.backends.registry import backend_for_cluster
    from scheduling.engine.types import Plan, StartAction

    backend = backend_for_cluster(lab.cluster, clock=lambda: lab.now.timestamp())
    starts = tuple(
        StartAction(
            job_id=str(job.pk),
            gpu_ids=tuple(gpus),
            node_ids=(),
            expected_end_at=float("inf"),
            is_preemptible=job.is_preemptible,
        )
        for job, gpus in running_rows
    )
    payloads = {str(job.pk): {"sim_runtime_s": job.payload["sim_runtime_s"]} for job, _ in running_rows}
    refused = [r for r in backend.apply(Plan(starts=starts), payloads=payloads) if not r.is_ok]
    if refused:
        raise SystemExit(f"the simulator refused {len(refused)} setup starts: {refused[0].message}")


def _group(rows: Any) -> list[list[tuple[int, int]]]:
    by_node: dict[int, list[tuple[int, int]]] = {}
    for node_id, gpu_id, index in rows:
        by_node.setdefault(node_id, []).append((gpu_id, index))
    return [by_node[k] for k in sorted(by_node)]


def rounds_run(*, cluster_id: int, rounds: int, now: datetime, step_s: float) -> list[dict[str, Any]]:
    """Run ``rounds`` engine rounds, ``step_s`` apart on the engine clock; one dict per round."""
    from scheduling.rounds import engine_round_run

    out = []
    for i in range(rounds):
        at = now + timedelta(seconds=step_s * (i + 1))
        started = time.perf_counter()
        result = engine_round_run(cluster_id=cluster_id, now=at)
        wall_ms = (time.perf_counter() - started) * 1000.0
        # The round runs with the cyclic collector paused (`rounds.cyclic_gc_paused`); what it
        # left for the collector, timed apart: the worker pays it after the apply.
        gc_t0 = time.perf_counter()
        gc.collect()
        gc_ms = (time.perf_counter() - gc_t0) * 1000.0
        if result.status != "ok":
            raise SystemExit(f"round {i + 1}: {result.status}: {result.message}")
        out.append(
            {
                "round_ms": wall_ms,
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


def state_check(*, cluster_id: int) -> dict[str, int]:
    """What the rounds left in the database, against the simulator: counts of anything wrong.

    ``overlaps``: pairs of live allocations of one GPU that overlap in time (the exclusion
    constraint makes it 0); ``running_not_in_backend`` / ``backend_not_in_db``: running jobs the
    other side does not run; ``gpu_mismatch``: running jobs whose active allocations are not
    the GPUs the simulator runs them on; ``unexplained``: pending jobs without a reason.
    """
    from django.db import connection

    from scheduling.backends.registry import backend_for_cluster
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
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--running", type=int, required=True)
    parser.add_argument("--pending", type=int, required=True)
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
