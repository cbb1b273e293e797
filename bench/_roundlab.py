"""The lab of `bench.round`: a simulator cluster with running, pending and finished work, filled
into the bench database (see `bench.round`'s docstring for what it holds).  Seeded: the same
seed gives the same lab (the RNG is drawn in the same order whatever else changes)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

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
    _lab_analyze()
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


def _lab_analyze() -> None:
    """Planner statistics for the filled tables, as a database in service has them: autovacuum
    analyzes a table once a tenth of it changed, but on a busy server it may not reach a bench
    database in the minute before the rounds, and the rounds would then be planned on the
    estimates of empty tables (a few pending rows where there are 10,000)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _lab_sim_start(lab: _Lab, running_rows: list[tuple[Any, list[int]]]) -> None:
    """The simulator runs what the database says runs (through its own apply, the real interface)."""
    from scheduling.backend_registry import backend_for_cluster
    from scheduling.engine.types import Plan, StartAction
    from scheduling.models import Job

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
    results = backend.apply(Plan(starts=starts), payloads=payloads)
    refused = [r for r in results if not r.is_ok]
    if refused:
        raise SystemExit(f"the simulator refused {len(refused)} setup starts: {refused[0].message}")
    # What the round that started them recorded (`rounds.apply._record_start_results`): the
    # backend's reference of each run.  Without it the first round measured here would confirm
    # 2,048 "new" references, which no round of a live cluster does.
    from scheduling.rounds.batch import unnest_update

    unnest_update(
        Job._meta.db_table,
        columns=[("ref", "varchar")],
        rows=[(int(r.target_id), r.backend_ref) for r in results if r.action == "start" and r.backend_ref],
        assign="backend_ref = v.ref",
    )


def _group(rows: Any) -> list[list[tuple[int, int]]]:
    by_node: dict[int, list[tuple[int, int]]] = {}
    for node_id, gpu_id, index in rows:
        by_node.setdefault(node_id, []).append((gpu_id, index))
    return [by_node[k] for k in sorted(by_node)]
