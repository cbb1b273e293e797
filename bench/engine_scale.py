"""Engine scale benchmark (DESIGN §8): how long one `plan_round` takes on a large snapshot.

    python -m bench.engine_scale --nodes N --gpus-per-node G --running R --pending P \
        [--rounds K] [--policies berth,...] --out FILE.json

The snapshot is synthetic but shaped like a busy cluster: R running jobs of 1-8 GPUs packed
onto nodes (some preemptible, on lent capacity), P pending jobs with users, projects,
requested times and runtime predictions, and a few bookings in the next day.  The same
snapshot is planned ``--rounds`` times per policy (plan_round is pure).
``decisions_per_s`` = pending jobs decided (started or explained) per second of planning.
Top-level keys are for ``berth``; ``policies`` has the same keys for every policy run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from bench._util import DEFAULT_ENGINE, format_table, load_callable, write_json
from scheduling.engine.types import (
    Booking,
    ClusterSnapshot,
    JobKind,
    JobRequest,
    Node,
    PolicyConfig,
    ProjectShare,
    RunningJob,
)
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.stats import percentile

_SIZES = (1, 1, 1, 2, 2, 4, 8)


def build_snapshot(
    *, nodes: int, gpus_per_node: int, running: int, pending: int, seed: int = 0
) -> ClusterSnapshot:
    """A deterministic busy-cluster snapshot at ``now = 0``."""
    rng = random.Random(seed)
    inventory = parse_cluster_spec(f"{nodes}x{gpus_per_node}:A100")
    projects = [f"p{i:02d}" for i in range(max(4, nodes // 8))]
    users = [(f"u{i:03d}", projects[i % len(projects)]) for i in range(max(8, nodes // 2))]
    free_by_node = [list(node.gpu_ids) for node in inventory.nodes]
    running_jobs: list[RunningJob] = []
    node_order = list(range(len(free_by_node)))
    for index in range(running):
        size = min(rng.choice(_SIZES), gpus_per_node)
        rng.shuffle(node_order)
        node_index = next((n for n in node_order if len(free_by_node[n]) >= size), None)
        if node_index is None:
            # No node has room for this size: place a 1-GPU job instead, or stop when full.
            size = 1
            node_index = next((n for n in node_order if free_by_node[n]), None)
            if node_index is None:
                break
        gpu_ids = tuple(free_by_node[node_index][:size])
        del free_by_node[node_index][:size]
        user, project = users[rng.randrange(len(users))]
        requested = rng.choice((3_600.0, 4 * 3_600.0, 12 * 3_600.0, 48 * 3_600.0))
        is_preemptible = rng.random() < 0.3
        job = JobRequest(
            id=f"r{index}",
            user=user,
            project=project,
            gpu_count=size,
            submit_at=-rng.uniform(3_600, 86_400),
            requested_s=requested,
            predicted_p50_s=requested * 0.3,
            predicted_p90_s=requested * 0.8,
            is_preemptible=is_preemptible,
            is_checkpointable=is_preemptible and rng.random() < 0.5,
        )
        running_jobs.append(
            RunningJob(
                job=job, gpu_ids=gpu_ids, started_at=-rng.uniform(0, requested), is_preemptible=is_preemptible
            )
        )
    pending_jobs = _pending_jobs(rng, pending, users, gpus_per_node)
    kept = _bookings(rng, inventory.nodes, nodes, gpus_per_node, users)
    return ClusterSnapshot(
        cluster=inventory.name,
        gpu_types=inventory.gpu_types,
        nodes=inventory.nodes,
        running=tuple(running_jobs),
        pending=tuple(pending_jobs),
        bookings=tuple(kept),
        projects=tuple(ProjectShare(name=p, decayed_usage=rng.uniform(0, 500)) for p in projects),
    )


def _pending_jobs(
    rng: random.Random, pending: int, users: list[tuple[str, str]], gpus_per_node: int
) -> list[JobRequest]:
    """``pending`` waiting jobs (5 % interactive sessions), drawn after the running ones."""
    pending_jobs: list[JobRequest] = []
    for index in range(pending):
        user, project = users[rng.randrange(len(users))]
        requested = rng.choice((600.0, 3_600.0, 4 * 3_600.0, 12 * 3_600.0, 48 * 3_600.0))
        is_interactive = rng.random() < 0.05
        pending_jobs.append(
            JobRequest(
                id=f"q{index}",
                user=user,
                project=project,
                gpu_count=min(rng.choice((1, 2)) if is_interactive else rng.choice(_SIZES), gpus_per_node),
                submit_at=-rng.uniform(0, 86_400),
                kind=JobKind.INTERACTIVE if is_interactive else JobKind.BATCH,
                requested_s=requested,
                predicted_p50_s=requested * 0.3,
                predicted_p90_s=requested * 0.8,
                is_preemptible=not is_interactive and rng.random() < 0.5,
            )
        )
    return pending_jobs


def _bookings(
    rng: random.Random,
    nodes: tuple[Node, ...],
    node_count: int,
    gpus_per_node: int,
    users: list[tuple[str, str]],
) -> list[Booking]:
    """One booking per 20 nodes over the next day, none overlapping another on a GPU."""
    bookings = []
    for index in range(max(1, node_count // 20)):
        node = nodes[rng.randrange(len(nodes))]
        start = rng.uniform(600, 86_400)
        count = min(gpus_per_node, rng.choice((1, 2, 4)))
        user, project = users[rng.randrange(len(users))]
        bookings.append(
            Booking(
                id=f"b{index}",
                user=user,
                project=project,
                gpu_count=count,
                start_at=start,
                end_at=start + rng.choice((3_600.0, 4 * 3_600.0)),
                gpu_ids=node.gpu_ids[:count],
            )
        )
    # Bookings must not overlap each other on a GPU (the database guarantees it).
    kept: list[Booking] = []
    for booking in sorted(bookings, key=lambda b: b.start_at):
        if all(
            set(booking.gpu_ids).isdisjoint(other.gpu_ids) or booking.start_at >= other.end_at
            for other in kept
        ):
            kept.append(booking)
    return kept


def time_policy(plan_fn: Any, snapshot: ClusterSnapshot, *, policy: str, rounds: int) -> dict[str, float]:
    """Plan ``snapshot`` ``rounds`` times; latency quantiles and decision throughput."""
    config = PolicyConfig(name=policy, interactive_headroom=(("*", 2),) if policy == "berth" else ())
    times_ms: list[float] = []
    decided = 0
    for _ in range(rounds):
        started = time.perf_counter()
        plan = plan_fn(snapshot, policy=config, now=0.0)
        # the portal stores every pending job's explanation each round: that is part of the
        # round, even where the engine computes it only when read
        _ = plan.pending
        times_ms.append((time.perf_counter() - started) * 1000.0)
        decided = len({s.job_id for s in plan.starts} | {p.job_id for p in plan.pending})
    mean_s = statistics.fmean(times_ms) / 1000.0
    return {
        "round_ms_p50": percentile(times_ms, 50),
        "round_ms_p99": percentile(times_ms, 99),
        "decisions_per_s": decided / mean_s if mean_s > 0 else 0.0,
        "starts": float(len(plan.starts)),
        "preemptions": float(len(plan.preemptions)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine_scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--running", type=int, required=True)
    parser.add_argument("--pending", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--policies", default="berth,easy,fifo,static")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--engine", default=DEFAULT_ENGINE, help="module:function with plan_round's signature"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    plan_fn = load_callable(args.engine)
    snapshot = build_snapshot(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        running=args.running,
        pending=args.pending,
        seed=args.seed,
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results = {
        policy: time_policy(plan_fn, snapshot, policy=policy, rounds=args.rounds) for policy in policies
    }
    headline = results.get("berth") or next(iter(results.values()))
    document: dict[str, Any] = {
        "round_ms_p50": headline["round_ms_p50"],
        "round_ms_p99": headline["round_ms_p99"],
        "decisions_per_s": headline["decisions_per_s"],
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "running": len(snapshot.running),
        "pending": len(snapshot.pending),
        "rounds": args.rounds,
        "policies": results,
    }
    write_json(args.out, document)
    header = ["policy", "round_ms_p50", "round_ms_p99", "decisions_per_s", "starts"]
    rows = [
        [p, r["round_ms_p50"], r["round_ms_p99"], r["decisions_per_s"], int(r["starts"])]
        for p, r in results.items()
    ]
    print(
        f"{args.nodes}x{args.gpus_per_node} GPUs, {len(snapshot.running)} running,"
        f" {len(snapshot.pending)} pending"
    )
    print(format_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
