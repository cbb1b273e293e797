"""Build the demo lab: a scaled-down real inventory, people, projects, quotas and job history.

The inventory comes from the real Alibaba GPU node list (``alibaba_openb_2023_nodes.csv.gz``)
scaled down per (GPU type, GPUs per node) group, so the type mix and the node sizes survive;
the job history is the real KTH SP2 log (``pwa_kth_sp2_1996.csv.gz``) shifted so that it ends
now.  When the shared traces are absent, the small samples under ``commands/demo_samples/``
stand in (see ``demo_samples_build``).

Everything is keyed by stable names (cluster ``demo``, node names from the trace, usernames,
project slugs, the trace's job ids), so building twice changes nothing; ``reset`` deletes the
demo lab first.  The history is inserted with ``bulk_create`` because it is a record of the
past, not a state change a person or the engine made; upcoming bookings go through
``booking_create`` like any other booking.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Q
from django.utils import timezone

from portal.accounts.models import Membership, Project, Quota
from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Cluster,
    EngineRound,
    Gpu,
    GpuType,
    Job,
    Node,
    Preemption,
)

SAMPLES_DIR = Path(__file__).resolve().parent / "commands" / "demo_samples"
NODES_FILE = "alibaba_openb_2023_nodes.csv.gz"
JOBS_FILE = "pwa_kth_sp2_1996.csv.gz"
# The shipped node sample keeps one node in four (demo_samples_build.NODE_SAMPLE_FRACTION).
SAMPLE_NODE_FRACTION = 0.25
# KTH log time 0 is 1996-09-30 10:38:01 UTC (traces README); used to keep its weekly rhythm.
KTH_EPOCH = datetime(1996, 9, 30, 10, 38, 1, tzinfo=UTC)
HISTORY_SOURCE = "pwa_kth_sp2_1996"
# The KTH SP2's size (the log's header: "MaxNodes: 100"); one node becomes one GPU.
KTH_MAX_NODES = 100
# The shipped job sample keeps one job in five (demo_samples_build.JOBS_SAMPLE_EVERY).
SAMPLE_JOB_EVERY = 5

CLUSTER_NAME = "demo"
DEFAULT_SCALE = 0.025
DEFAULT_HISTORY_DAYS = 28
# Offered load of the history (GPU-hours asked for over GPU-hours there); None: the log's own
# load on its own machine (`trace_load`, about 0.7 for KTH SP2), so the lab is as busy as it was.
DEFAULT_LOAD: float | None = None

# Demo logins.  The lab is for a laptop or a loopback port: the passwords are printed on purpose.
ADMIN_USERNAME = "admin"
ADMIN_PASSWORD = "berth-admin"  # noqa: S105 - printed demo login, refused in production
RESEARCHER_PASSWORD = "berth-demo"  # noqa: S105 - printed demo login, refused in production
RESEARCHERS: tuple[tuple[str, str, str], ...] = (
    ("ada", "Ada", "Lovelace"),
    ("grace", "Grace", "Hopper"),
    ("alan", "Alan", "Turing"),
    ("katherine", "Katherine", "Johnson"),
    ("edsger", "Edsger", "Dijkstra"),
    ("barbara", "Barbara", "Liskov"),
    ("donald", "Donald", "Knuth"),
    ("frances", "Frances", "Allen"),
)


@dataclass(frozen=True, slots=True)
class ProjectSpec:
    slug: str
    name: str
    description: str
    fair_share_weight: float
    manager: str
    members: tuple[str, ...]


PROJECTS: tuple[ProjectSpec, ...] = (
    ProjectSpec(
        "vision", "Vision Lab", "Image and video models.", 1.0, "ada", ("ada", "alan", "barbara", "frances")
    ),
    ProjectSpec(
        "language",
        "Language Models",
        "Pre-training and fine-tuning LLMs.",
        2.0,
        "grace",
        ("grace", "ada", "donald", "katherine"),
    ),
    ProjectSpec(
        "robotics",
        "Robotics",
        "Reinforcement learning in simulation.",
        1.0,
        "edsger",
        ("edsger", "alan", "frances"),
    ),
    ProjectSpec(
        "climate",
        "Climate Modelling",
        "Weather and climate emulators.",
        1.0,
        "katherine",
        ("katherine", "barbara", "donald"),
    ),
)


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    gpu_type: str
    gpu_count: int


@dataclass(frozen=True, slots=True)
class TraceRow:
    job_id: str
    user: str
    group: str
    submit_s: int
    start_s: int
    end_s: int
    gpu_count: int
    status: str
    requested_s: int | None


@dataclass(slots=True)
class DemoLabReport:
    """What a build did; the command prints it."""

    inventory_source: str = ""
    history_source: str = ""
    nodes: int = 0
    gpus: int = 0
    gpus_by_type: dict[str, int] = field(default_factory=dict)
    users_created: int = 0
    projects: int = 0
    jobs_created: int = 0
    jobs_total: int = 0
    history_from: datetime | None = None
    history_to: datetime | None = None
    bookings_created: int = 0
    queued_jobs_created: int = 0
    sessions_created: int = 0
    replay_rounds: int = 0
    replay_wall_s: float = 0.0
    arrival_compression: float = 1.0  # uses per trace job (a thinned sample is laid more than once)
    offered_load: float = 0.0
    predictions_stored: int = 0
    target_load: float = 0.0
    running_at_now: int = 0
    pending_at_now: int = 0
    forecasts_created: int = 0
    forecast_s: float = 0.0
    forecasts_queued: bool = False
    skipped: list[str] = field(default_factory=list)
    logins: list[tuple[str, str, str]] = field(default_factory=list)


def _pick_file(traces_dir: Path | None, name: str) -> tuple[Path, bool]:
    """The real trace when it exists, else the shipped sample; the flag says which."""
    if traces_dir is not None and (traces_dir / name).is_file():
        return traces_dir / name, False
    return SAMPLES_DIR / name, True


def read_nodes(path: Path) -> list[NodeRow]:
    """Rows of an inventory CSV (``node,gpu_type,num_gpus,...``), skipping nodes without GPUs."""
    with gzip.open(path, "rt", newline="") as fh:
        rows = [
            NodeRow(name=r["node"], gpu_type=r["gpu_type"] or "GPU", gpu_count=int(r["num_gpus"]))
            for r in csv.DictReader(fh)
        ]
    return [r for r in rows if r.gpu_count > 0]


def scale_nodes(rows: Iterable[NodeRow], *, scale: float) -> list[NodeRow]:
    """Keep about ``scale`` of the nodes of every (GPU type, GPUs per node) group.

    Each group is rounded on its own, so the node sizes and the type mix survive; a GPU type
    whose groups all round to zero keeps one node of its most common size, so no type vanishes.
    Nodes are taken evenly spaced in name order: deterministic, and spread over the list.
    """
    if not 0 < scale <= 1:
        raise ValueError("scale must be in (0, 1]")
    groups: dict[tuple[str, int], list[NodeRow]] = defaultdict(list)
    for row in rows:
        groups[(row.gpu_type, row.gpu_count)].append(row)
    picked: list[NodeRow] = []
    kept_types: set[str] = set()
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda r: r.name)
        keep = min(len(members), round(len(members) * scale))
        picked.extend(_evenly(members, keep))
        if keep:
            kept_types.add(key[0])
    for gpu_type in sorted({t for t, _ in groups} - kept_types):
        size = max((k for k in groups if k[0] == gpu_type), key=lambda k: (len(groups[k]), k[1]))
        picked.extend(_evenly(sorted(groups[size], key=lambda r: r.name), 1))
    return sorted(picked, key=lambda r: r.name)


def _evenly(items: list[NodeRow], count: int) -> list[NodeRow]:
    if count <= 0:
        return []
    step = len(items) / count
    return [items[int(i * step + step / 2)] for i in range(count)]


def read_trace(path: Path) -> list[TraceRow]:
    """Jobs of a trace CSV that really ran (start and end present, at least one GPU)."""
    out: list[TraceRow] = []
    with gzip.open(path, "rt", newline="") as fh:
        for r in csv.DictReader(fh):
            if not r["start_time"] or not r["end_time"] or not r["num_gpus"]:
                continue
            requested = r.get("requested_time") or ""
            out.append(
                TraceRow(
                    job_id=r["job_id"],
                    user=r["user"] or "anonymous",
                    group=r["group"] or "",
                    submit_s=int(float(r["submit_time"])),
                    start_s=int(float(r["start_time"])),
                    end_s=int(float(r["end_time"])),
                    gpu_count=int(float(r["num_gpus"])),
                    status=r["status"],
                    requested_s=int(float(requested)) if requested and float(requested) > 0 else None,
                )
            )
    return [r for r in out if r.gpu_count > 0 and r.end_s >= r.start_s >= r.submit_s]


def history_shift(*, trace_end_s: int, now: datetime) -> timedelta:
    """How far to move the trace so that it ends at ``now`` or just after it.

    The shift is a whole number of weeks, so the log keeps its real hour-of-day and
    day-of-week rhythm (what the demand forecasts learn); jobs that would end after ``now``
    are dropped by the caller, which trims at most the last week of the log.
    """
    gap = now - (KTH_EPOCH + timedelta(seconds=trace_end_s))
    weeks = math.ceil(gap / timedelta(weeks=1))
    return timedelta(weeks=weeks)


def _stable_index(key: str, modulo: int) -> int:
    # md5 for a stable spread across runs (Python's hash() is salted); not a security use.
    return int(hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()[:8], 16) % modulo


def _weighted_pick(key: str, choices: list[tuple[str, int]]) -> str:
    total = sum(w for _, w in choices)
    point = _stable_index(key, total)
    for name, weight in choices:
        if point < weight:
            return name
        point -= weight
    return choices[-1][0]


class DemoLabError(Exception):
    """The demo lab cannot be built with these inputs."""


def demo_lab_reset() -> None:
    """Delete the demo cluster, its work, the demo projects and the demo users.

    Work is removed first because bookings and jobs protect their cluster, project, user and
    GPUs; that includes anything the demo users did elsewhere (their accounts go too).
    """
    usernames = [ADMIN_USERNAME, *(u for u, _, _ in RESEARCHERS)]
    slugs = [p.slug for p in PROJECTS]
    with transaction.atomic():
        cluster = Cluster.objects.filter(name=CLUSTER_NAME).first()
        demo_work = Q(project__slug__in=slugs) | Q(user__username__in=usernames)
        if cluster is not None:
            demo_work |= Q(cluster=cluster)
        booking_ids = list(Booking.objects.filter(demo_work).values_list("id", flat=True))
        job_ids = list(Job.objects.filter(demo_work).values_list("id", flat=True))
        allocations = Allocation.objects.filter(Q(booking_id__in=booking_ids) | Q(job_id__in=job_ids))
        allocation_ids = list(allocations.values_list("id", flat=True))
        for entity_type, ids in (("allocation", allocation_ids), ("booking", booking_ids), ("job", job_ids)):
            AuditEvent.objects.filter(entity_type=entity_type, entity_id__in=ids).delete()
        allocations.delete()
        Preemption.objects.filter(job_id__in=job_ids).delete()
        Booking.objects.filter(id__in=booking_ids).delete()
        Job.objects.filter(id__in=job_ids).delete()
        if cluster is not None:
            AuditEvent.objects.filter(entity_type="cluster", entity_id=cluster.pk).delete()
            cluster.delete()
        Project.objects.filter(slug__in=slugs).delete()
        get_user_model().objects.filter(username__in=usernames).delete()


def demo_lab_build(
    *,
    traces_dir: Path | None,
    scale: float = DEFAULT_SCALE,
    history_days: int = DEFAULT_HISTORY_DAYS,
    now: datetime | None = None,
    make_bookings: bool = True,
    make_queue: bool = True,
    load: float | None = DEFAULT_LOAD,
    make_forecasts: bool | str = True,
    log: Callable[[str], None] = lambda _msg: None,
) -> DemoLabReport:
    """Create what is missing of the demo lab and report what is there.

    ``scale`` is the fraction of the *real* inventory's nodes to keep (the shipped sample
    already holds a quarter of them, which is accounted for).  ``history_days`` bounds the job
    history, which ends at ``now``; ``load`` is the offered load the history's arrivals are
    brought to (`_trace_window`; None: the log's own pace).  The history is replayed through
    the cluster's engine (`demo_history`).  ``make_forecasts``: True or "now" fits the demand
    forecasts here, "queue" leaves them to a Celery task (`forecast_refresh_request`, progress
    shown on the pages), False or "skip" does neither.  Running it again creates nothing new.
    """
    now = now or timezone.now()
    report = DemoLabReport()
    nodes_path, nodes_is_sample = _pick_file(traces_dir, NODES_FILE)
    jobs_path, jobs_is_sample = _pick_file(traces_dir, JOBS_FILE)
    report.inventory_source = f"{nodes_path}{' (shipped sample)' if nodes_is_sample else ''}"
    report.history_source = f"{jobs_path}{' (shipped sample)' if jobs_is_sample else ''}"
    effective_scale = min(1.0, scale / SAMPLE_NODE_FRACTION) if nodes_is_sample else scale

    with transaction.atomic():
        cluster = _build_inventory(nodes_path, scale=effective_scale, report=report)
        users = _build_people(report)
        projects = _build_projects(users, cluster, report)
    log(f"inventory: {report.nodes} nodes, {report.gpus} GPUs")
    _build_history(
        jobs_path, cluster, users, projects, history_days=history_days, now=now, report=report, load=load
    )
    log(f"history: {report.jobs_created} jobs created, {report.jobs_total} in total")
    if make_bookings:
        _build_bookings(cluster, users, projects, now=now, report=report)
    if make_queue:
        _build_queue(cluster, users, projects, now=now, report=report)
    _predict_waiting(cluster, report=report, log=log)
    if make_forecasts == "queue":
        _queue_forecasts(cluster, now=now, report=report, log=log)
    elif make_forecasts and make_forecasts != "skip":
        _build_forecasts(cluster, now=now, report=report, log=log)
    report.logins = [(ADMIN_USERNAME, ADMIN_PASSWORD, "staff: Django admin and every page")] + [
        (username, RESEARCHER_PASSWORD, ", ".join(p.name for p in PROJECTS if username in p.members))
        for username, _, _ in RESEARCHERS
    ]
    return report


def _gpu_type_spec(name: str) -> dict[str, Any]:
    """Memory, precisions and speed for a GPU type, shared with the simulator's table."""
    from scheduling.sim.inventory import gpu_type_spec  # the simulator owns the one table

    spec = gpu_type_spec(name)
    return {
        "memory_gib": spec.memory_gib,
        "precisions": sorted(spec.precisions),
        "relative_speed": spec.relative_speed,
        "value": spec.value,
    }


def _build_inventory(path: Path, *, scale: float, report: DemoLabReport) -> Cluster:
    cluster, created = Cluster.objects.get_or_create(
        name=CLUSTER_NAME,
        defaults={
            "backend": Cluster.Backend.SIMULATOR,
            "settings": {"inventory": path.name, "scale": scale},
            "status_message": "Demo lab: a scaled-down copy of a real heterogeneous GPU cluster.",
        },
    )
    if created:
        rows = scale_nodes(read_nodes(path), scale=scale)
        if not rows:
            raise DemoLabError(f"no GPU nodes in {path}")
        types: dict[str, GpuType] = {}
        for type_name in sorted({r.gpu_type for r in rows}):
            types[type_name], _ = GpuType.objects.get_or_create(
                name=type_name, defaults=_gpu_type_spec(type_name)
            )
        nodes = Node.objects.bulk_create(
            Node(
                cluster=cluster,
                name=r.name,
                gpu_type=types[r.gpu_type],
                gpu_count=r.gpu_count,
                # Nodes of one type sit together, eight GPUs per topology domain at most.
                domain=f"{r.gpu_type.lower()}-{i // max(1, 8 // r.gpu_count)}",
            )
            for i, r in enumerate(rows)
        )
        Gpu.objects.bulk_create(Gpu(node=node, index=i) for node in nodes for i in range(node.gpu_count))
    counts: Counter[str] = Counter()
    node_total = 0
    for type_name, gpu_count in Node.objects.filter(cluster=cluster).values_list(
        "gpu_type__name", "gpu_count"
    ):
        counts[type_name] += gpu_count
        node_total += 1
    report.nodes = node_total
    report.gpus = sum(counts.values())
    report.gpus_by_type = dict(sorted(counts.items()))
    return cluster


def _build_people(report: DemoLabReport) -> dict[str, Any]:
    user_model = get_user_model()
    users: dict[str, Any] = {}
    admin = user_model.objects.filter(username=ADMIN_USERNAME).first()
    created = admin is None
    if admin is None:
        admin = user_model.objects.create(
            username=ADMIN_USERNAME,
            is_staff=True,
            is_superuser=True,
            email="admin@berth.example",
            first_name="Lab",
            password=make_password(ADMIN_PASSWORD),
        )
    report.users_created += int(created)
    users[ADMIN_USERNAME] = admin
    # One hash for all researchers: they share a printed password anyway, and each PBKDF2
    # hash costs about half a second here.
    usernames = [u for u, _, _ in RESEARCHERS]
    existing = set(user_model.objects.filter(username__in=usernames).values_list("username", flat=True))
    researcher_hash = make_password(RESEARCHER_PASSWORD) if len(existing) < len(RESEARCHERS) else ""
    for username, first, last in RESEARCHERS:
        user, created = user_model.objects.get_or_create(
            username=username,
            defaults={
                "first_name": first,
                "last_name": last,
                "email": f"{username}@berth.example",
                "password": researcher_hash,
            },
        )
        report.users_created += int(created)
        users[username] = user
    return users


# Quotas that differ from the rule in `_build_projects`, as (guaranteed, borrowing limit): the
# climate project may not use the V100M32 GPUs at all (neither guaranteed nor borrowed; another
# group's partition), which makes its queued non-preemptible "era5-emulator" job the demo's
# honest never-startable example: above its guarantee it could borrow, but not past a limit of 0.
QUOTA_OVERRIDES: dict[tuple[str, str], tuple[int, int]] = {("climate", "V100M32"): (0, 0)}


def _build_projects(users: dict[str, Any], cluster: Cluster, report: DemoLabReport) -> dict[str, Project]:
    projects: dict[str, Project] = {}
    capacity = dict(report.gpus_by_type)  # GPUs per type in the demo cluster
    total_weight = sum(p.fair_share_weight for p in PROJECTS)
    gpu_types = {t.name: t for t in GpuType.objects.filter(name__in=capacity)}
    for spec in PROJECTS:
        project, _ = Project.objects.get_or_create(
            slug=spec.slug,
            defaults={
                "name": spec.name,
                "description": spec.description,
                "fair_share_weight": spec.fair_share_weight,
            },
        )
        projects[spec.slug] = project
        for username in spec.members:
            role = Membership.Role.MANAGER if username == spec.manager else Membership.Role.MEMBER
            Membership.objects.get_or_create(user=users[username], project=project, defaults={"role": role})
        for type_name, gpus in capacity.items():
            # Guarantees add up to 60% of each type by fair-share weight, leaving room to lend;
            # anyone may borrow up to half of a type on top, always preemptibly.
            guaranteed = math.floor(gpus * 0.6 * spec.fair_share_weight / total_weight)
            guaranteed, borrow = QUOTA_OVERRIDES.get((spec.slug, type_name), (guaranteed, max(1, gpus // 2)))
            Quota.objects.get_or_create(
                project=project,
                gpu_type=gpu_types[type_name],
                defaults={"guaranteed_gpus": guaranteed, "borrow_limit_gpus": borrow},
            )
    report.projects = len(projects)
    return projects


@dataclass(frozen=True, slots=True)
class PlacedRow:
    """One use of a trace job in the demo history: its key, when it arrives, where it runs."""

    row: TraceRow
    key: str
    copy: int
    submit_at: datetime
    gpu_type: str
    gpu_count: int


def trace_load(rows: list[TraceRow], *, sample_every: int, machine_nodes: int = KTH_MAX_NODES) -> float:
    """The log's own busy fraction on its own machine: node-seconds over node-seconds there.

    ``sample_every`` undoes a thinned sample (one job in N kept), so the shipped sample and the
    full log give the same answer (0.72 and 0.70 for KTH SP2: its README says "about 70 %").
    """
    if not rows:
        return 0.0
    span = max(r.end_s for r in rows) - min(r.submit_s for r in rows)
    if span <= 0:
        return 0.0
    work = sum(r.gpu_count * (r.end_s - r.start_s) for r in rows)
    return work * sample_every / (machine_nodes * span)


def _scaled_count(gpu_count: int, pool_gpus: int, limit: int) -> int:
    """A trace job's GPUs on a pool of ``pool_gpus``: the same share of it as the job took of
    its own machine (``KTH_MAX_NODES``), at least one, at most its project's ``limit`` there."""
    return max(1, min(limit, math.ceil(gpu_count * pool_gpus / KTH_MAX_NODES)))


# A pool below this many GPUs takes a smaller share of the load (capacity x size / this): one
# long job on a 1-GPU pool at the lab's ~70 % load queues everything behind it for days (the
# 1-GPU A10 pool had ~110 GPUs of demand queued), while the same load spread over
# 100 GPUs waits minutes.
SMALL_POOL_GPUS = 4


def _load_share(gpus: int) -> float:
    """The GPUs a pool counts for when load is spread over the types (`_assign_types`)."""
    return gpus * min(1.0, gpus / SMALL_POOL_GPUS)


def _assign_types(
    placed: list[PlacedRow],
    *,
    capacity: dict[str, int],
    limits_of: Callable[[TraceRow], dict[str, int]] | None,
    work_s: Callable[[PlacedRow], float],
) -> list[PlacedRow]:
    """Give each job, in arrival order, the type whose offered GPU-hours so far are the lowest
    share of its capacity (ties by a stable hash), with the share of that pool the job took of
    its own machine (`_scaled_count`: a 64-node KTH job takes 64 % of the pool), capped at its
    project's guarantee + borrowing limit there: every type gets about the same load, and the
    lab's people size their jobs to their quotas, so no history job is one the quotas never let
    start."""
    offered: dict[str, float] = defaultdict(float)
    out: list[PlacedRow] = []
    for p in sorted(placed, key=lambda p: (p.submit_at, p.key)):
        limits = limits_of(p.row) if limits_of else capacity
        work = work_s(p)
        counts = {
            name: _scaled_count(p.row.gpu_count, capacity[name], limits[name])
            for name in capacity
            if limits.get(name, 0) > 0
        }
        pressure = {
            name: (offered[name] + counts[name] * work) / _load_share(capacity[name]) for name in counts
        }
        type_name = min(pressure, key=lambda name: (pressure[name], _stable_index(f"{p.key}/{name}", 997)))
        gpu_count = counts[type_name]
        offered[type_name] += gpu_count * work
        out.append(dataclasses.replace(p, gpu_type=type_name, gpu_count=gpu_count))
    return out


def _trace_window(
    rows: list[TraceRow],
    *,
    now: datetime,
    history_days: int,
    load: float | None,
    capacity: dict[str, int],
    limits_of: Callable[[TraceRow], dict[str, int]] | None = None,
    max_uses: int = 1,
) -> tuple[list[PlacedRow], float, float]:
    """The trace jobs of the history window, where they run, the load they offer and the target.

    The log is laid over the window in whole weeks: its last ``P`` weeks (``P`` = the window
    rounded up to weeks) land on the window as they are, the ``P`` weeks before them are moved
    ``P`` weeks forward, and so on, so every job keeps its real hour of day and day of week
    (what the demand forecasts learn) and its real size and runtime.  Layers are added, most
    recent first, until the GPU-hours they ask for on the demo cluster reach ``load`` of the
    GPU-hours there (the last layer is thinned by a stable hash to land on it).  ``load`` None
    is the log's own load on its own machine (`trace_load`): the demo cluster is then as busy,
    relative to its size, as the real one was.  When the log runs out, it is laid again from
    its end, a day later each time (``copy``), at most ``max_uses`` times per job: a sample that
    kept one job in N stands for the N jobs it left out.  ``load`` 0 takes the log's last
    weeks once, at its own pace.  ``limits_of`` gives a job's per-type limits (`_assign_types`;
    default the type capacities).  Returns (placed jobs, offered load, target load).
    """
    week = timedelta(weeks=1)
    trace_end = max(r.end_s for r in rows)
    shift = history_shift(trace_end_s=trace_end, now=now)
    window = timedelta(days=history_days)
    window_start = now - window
    period = week * max(1, math.ceil(window / week))
    capacity_gpus = sum(capacity.values())
    window_gpu_s = capacity_gpus * window.total_seconds()
    target = 0.0 if load == 0 else (load if load is not None else trace_load(rows, sample_every=max_uses))
    # Each job's layer: how many periods back from "now" the log puts it.
    layered: list[tuple[int, TraceRow, datetime]] = []
    for r in rows:
        at = KTH_EPOCH + shift + timedelta(seconds=r.submit_s)
        if at >= now:
            continue
        layer = (now - at) // period
        layered.append((layer, r, at + period * layer))
    layers = 1 + max((layer for layer, _, _ in layered), default=0)
    by_layer: dict[int, list[tuple[TraceRow, datetime]]] = defaultdict(list)
    for layer, r, at in layered:
        by_layer[layer].append((r, at))

    def use(copy: int, r: TraceRow, at: datetime) -> PlacedRow | None:
        if copy:
            # a later copy lands on a different week of the window (and a day later), wrapped in it
            later = week * copy + timedelta(days=copy // max(1, period // week))
            at = window_start + (at - window_start + later) % period
        if not window_start <= at < now:
            return None
        key = f"t{r.job_id}" + (f".{copy}" if copy else "")
        # the type is picked once the window's jobs are known (`_assign_types`, about in
        # proportion to the types' sizes); until then the job counts with that mean size
        limits = limits_of(r) if limits_of else capacity
        mean = sum(
            gpus * _scaled_count(r.gpu_count, gpus, limits.get(name, 0) or 1)
            for name, gpus in capacity.items()
        )
        return PlacedRow(r, key, copy, at, "", max(1, round(mean / capacity_gpus)))

    def offered_gpu_s_per_gpu(p: PlacedRow) -> float:
        # the work it asks for inside the window (a job arriving just before now asks little)
        return min(float(p.row.end_s - p.row.start_s), (now - p.submit_at).total_seconds())

    def offered_gpu_s(p: PlacedRow) -> float:
        return p.gpu_count * offered_gpu_s_per_gpu(p)

    def lay(goal: float) -> list[PlacedRow]:
        placed: list[PlacedRow] = []
        offered = 0.0
        for index in range(layers * max(1, max_uses)):
            copy, layer = divmod(index, layers)
            candidates = [p for r, at in by_layer.get(layer, []) if (p := use(copy, r, at)) is not None]
            if not candidates:
                continue
            if index and offered >= goal:
                break
            batch = sum(offered_gpu_s(p) for p in candidates)
            if goal > 0 and offered + batch > goal and batch > 0:
                keep = (goal - offered) / batch
                candidates = [p for p in candidates if _stable_index(p.key, 10_000) < keep * 10_000]
                batch = sum(offered_gpu_s(p) for p in candidates)
            placed.extend(candidates)
            offered += batch
        return _assign_types(placed, capacity=capacity, limits_of=limits_of, work_s=offered_gpu_s_per_gpu)

    # The sizes before the type is picked are estimates: lay again with the goal corrected by
    # what the assigned sizes really offer (a few passes; each is pure arithmetic).
    goal = target * window_gpu_s
    placed = lay(goal)
    offered = sum(offered_gpu_s(p) for p in placed)
    for _ in range(4):
        if goal <= 0 or offered <= 0 or abs(offered - target * window_gpu_s) < 0.03 * target * window_gpu_s:
            break
        goal *= target * window_gpu_s / offered
        placed = lay(goal)
        offered = sum(offered_gpu_s(p) for p in placed)
    return placed, (offered / window_gpu_s if window_gpu_s else 0.0), target


def _build_history(
    path: Path,
    cluster: Cluster,
    users: dict[str, Any],
    projects: dict[str, Project],
    *,
    history_days: int,
    now: datetime,
    report: DemoLabReport,
    load: float | None = DEFAULT_LOAD,
) -> None:
    """Replay the trace's arrivals through the cluster's engine and simulator and store the
    result (`demo_history`): finished jobs, allocations, preemptions and engine rounds."""
    from scheduling.management.demo_history import (
        HistoryJob,
        history_replay,
        lost_work_s,
        preemption_notice,
    )
    from scheduling.sim.overlays import ProjectQuota
    from scheduling.snapshots import engine_nodes_for_cluster, policy_config_for_cluster

    existing = Job.objects.filter(cluster=cluster, payload__source=HISTORY_SOURCE)
    if existing.exists():
        report.jobs_total = existing.count()
        bounds = existing.order_by("submitted_at").values_list("submitted_at", flat=True)
        report.history_from = bounds.first()
        report.history_to = existing.order_by("-ended_at").values_list("ended_at", flat=True).first()
        return
    rows = read_trace(path)
    if not rows or history_days <= 0:
        return
    origin = now - timedelta(days=history_days)
    # The busiest trace users (over the whole log) become the first demo researchers, so each
    # demo person has a believable, distinct history; each trace group maps to one of that
    # person's projects.
    activity: Counter[str] = Counter()
    for r in rows:
        activity[r.user] += r.gpu_count * (r.end_s - r.start_s)
    researchers = [u for u, _, _ in RESEARCHERS]
    user_of = {
        trace_user: researchers[i % len(researchers)]
        for i, (trace_user, _) in enumerate(activity.most_common())
    }
    projects_of = {
        username: [projects[p.slug] for p in PROJECTS if username in p.members] for username in researchers
    }

    def project_of(r: TraceRow) -> Project:
        own_projects = projects_of[user_of[r.user]]
        return own_projects[_stable_index(f"{r.user}/{r.group}", len(own_projects))]

    quotas = {
        (q.project_id, q.gpu_type.name): q
        for q in Quota.objects.filter(project__in=list(projects.values())).select_related("gpu_type")
    }

    def limits_of(r: TraceRow) -> dict[str, int]:
        project = project_of(r)
        out = {}
        for type_name, gpus in report.gpus_by_type.items():
            quota = quotas.get((project.pk, type_name))
            if quota is None or quota.borrow_limit_gpus is None:
                most = gpus
            else:
                most = quota.guaranteed_gpus + quota.borrow_limit_gpus
            out[type_name] = min(gpus, most)
        return out

    placed, offered, target = _trace_window(
        rows,
        now=now,
        history_days=history_days,
        load=load,
        capacity=dict(report.gpus_by_type),
        limits_of=limits_of,
        max_uses=SAMPLE_JOB_EVERY if path.parent == SAMPLES_DIR else 1,
    )
    report.offered_load = offered
    report.target_load = target
    report.arrival_compression = len(placed) / max(1, len({p.row.job_id for p in placed}))
    gpu_types = {t.name: t for t in GpuType.objects.filter(name__in=report.gpus_by_type)}
    specs: dict[str, tuple[PlacedRow, Project]] = {}
    history_jobs: list[HistoryJob] = []
    for p in placed:
        r = p.row
        username = user_of[r.user]
        project = project_of(r)
        specs[p.key] = (p, project)
        history_jobs.append(
            HistoryJob(
                key=p.key,
                user=username,
                project=project.slug,
                submit_s=max(0.0, (p.submit_at - origin).total_seconds()),
                runtime_s=float(max(1, r.end_s - r.start_s)),
                gpu_count=p.gpu_count,
                gpu_type=p.gpu_type,
                requested_s=float(r.requested_s) if r.requested_s else None,
                status=r.status,
            )
        )
    engine_types = tuple(
        et_gpu_type(t) for t in GpuType.objects.filter(name__in=report.gpus_by_type).order_by("name")
    )
    policy = policy_config_for_cluster(cluster=cluster)
    engine_nodes = engine_nodes_for_cluster(cluster=cluster)
    type_of_gpu = {gpu: node.gpu_type for node in engine_nodes for gpu in node.gpu_ids}
    replayed = history_replay(
        history_jobs,
        nodes=engine_nodes,
        gpu_types=engine_types,
        policy=policy,
        origin=origin,
        stop_at_s=(now - origin).total_seconds(),
        # the portal's own projects: fair-share weights and guarantees (the live engine's too)
        projects=tuple(
            ProjectQuota(
                name=project.slug,
                weight=project.fair_share_weight,
                guaranteed=tuple(
                    sorted(
                        (type_name, quota.guaranteed_gpus)
                        for (project_id, type_name), quota in quotas.items()
                        if project_id == project.pk
                    )
                ),
            )
            for project in projects.values()
        ),
    )
    horizon_s = (now - origin).total_seconds()

    def when(seconds: float) -> datetime:
        return origin + timedelta(seconds=seconds)

    jobs: list[Job] = []
    name_of: dict[str, str] = {}  # replay key -> the portal's job name (for the notices)
    runs_of: list[tuple[Job, list[Any], list[Any]]] = []
    # Jobs the replay still runs (or still queues) at "now" are part of the present: they are
    # stored running on their GPUs (and handed to the live simulator) or pending, so demand does
    # not fall to zero in the last hours before now and the live demo starts with a busy cluster.
    live_runs: list[tuple[Job, Any, float]] = []
    guarantee = {
        (project_id, type_id): gpus
        for project_id, type_id, gpus in Quota.objects.filter(
            project__in=list(projects.values())
        ).values_list("project_id", "gpu_type_id", "guaranteed_gpus")
    }
    for key in sorted(set(replayed.runs) | set(specs)):
        runs = [run for run in replayed.runs.get(key, []) if run.start_s < horizon_s]
        past = [run for run in runs if run.end_s is not None and run.end_s <= horizon_s]
        current = next((run for run in runs if run.end_s is None or run.end_s > horizon_s), None)
        is_finished = current is None and bool(past) and len(past) == len(replayed.runs.get(key, []))
        notes = [n for n in replayed.preemptions.get(key, []) if n.signal_s < horizon_s]
        if key in specs:
            placed_row, project = specs[key]
            r, type_name, gpu_count = placed_row.row, placed_row.gpu_type, placed_row.gpu_count
            submit_s = max(0.0, (placed_row.submit_at - origin).total_seconds())
            if submit_s >= horizon_s:
                continue
            is_completed = r.status == "completed"
            job = Job(
                user=users[user_of[r.user]],
                project=project,
                cluster=cluster,
                name=f"{project.slug}-{key[1:]}",
                kind=Job.Kind.BATCH,
                gpu_count=gpu_count,
                gpu_type=gpu_types[type_name],
                requested_s=r.requested_s,
                is_preemptible=any(run.is_preemptible for run in runs) or bool(notes),
                is_checkpointable=key in replayed.checkpointable,
                checkpoint_interval_s=(
                    round(replayed.checkpoint_interval_s) if key in replayed.checkpointable else None
                ),
                payload={
                    "source": HISTORY_SOURCE,
                    "trace_job_id": r.job_id,
                    "trace_user": r.user,
                    **({"trace_copy": placed_row.copy} if placed_row.copy else {}),
                },
                status=Job.Status.COMPLETED if is_completed else Job.Status.FAILED,
                exit_code=0 if is_completed else 1,
                status_message="" if is_completed else "Exited with a non-zero status (from the trace).",
            )
            work_s = float(max(1, r.end_s - r.start_s))
        elif key in replayed.sessions:
            if not is_finished and current is None:
                continue  # a session still waiting at "now" is given up (the overlay's patience)
            username, slug, submit_s, duration_s, gpu_count = replayed.sessions[key]
            if username not in users or slug not in projects or not runs:
                continue
            job = Job(
                user=users[username],
                project=projects[slug],
                cluster=cluster,
                name=f"session-{key}",
                kind=Job.Kind.INTERACTIVE,
                gpu_count=gpu_count,
                # a session takes any type; it is recorded on the type it got
                gpu_type=gpu_types.get(type_of_gpu.get(runs[-1].gpu_ids[0], ""))
                if runs[-1].gpu_ids
                else None,
                payload={"source": HISTORY_SOURCE, "session": key},
                status=Job.Status.COMPLETED,
                exit_code=0,
            )
            work_s = float(duration_s)
        else:
            continue
        if key in replayed.predictions and job.kind == Job.Kind.BATCH:
            job.predicted_p50_s, job.predicted_p90_s = replayed.predictions[key]
        job.attempt = len(past)
        job.first_submitted_at = when(submit_s)
        # a requeued job's latest submit is its requeue (the engine's view); the first is kept above
        job.submitted_at = when(past[-1].end_s) if past and past[-1].end_s is not None else when(submit_s)
        if is_finished:
            last = past[-1]
            job.attempt = len(past) - 1
            previous_end = past[-2].end_s if len(past) > 1 else None
            job.submitted_at = when(previous_end) if previous_end is not None else when(submit_s)
            job.started_at = when(last.start_s)
            job.ended_at = when(last.end_s if last.end_s is not None else horizon_s)
        else:
            # Not over at "now": what the live simulator runs from here is the work left.
            # Work above its project's guarantee runs only as preemptible (DESIGN §3.4): the
            # portal tells its owner so at submit, and the lab's people follow that advice, so
            # the live queue holds no job that the quotas never let start.
            above = job.gpu_count > guarantee.get((job.project_id, job.gpu_type_id or 0), 0)
            if job.kind == Job.Kind.BATCH and job.gpu_type is not None and above:
                job.is_preemptible = True
            done_s = sum((run.end_s or horizon_s) - run.start_s for run in past)
            job.payload = {
                **job.payload,
                "command": f"python run.py --trace-job {key}",
                "sim_runtime_s": round(
                    max(60.0, work_s - done_s - (horizon_s - current.start_s if current else 0)), 1
                ),
            }
            job.exit_code = None
            job.status_message = ""
            if current is not None:
                job.status = Job.Status.RUNNING
                job.started_at = when(current.start_s)
                live_runs.append((job, current, horizon_s))
            else:
                job.status = Job.Status.PENDING
                job.started_at = None
        job.ended_at = job.ended_at if is_finished else None
        jobs.append(job)
        name_of[key] = job.name
        runs_of.append((job, past, notes))

    with transaction.atomic():
        Job.objects.bulk_create(jobs, batch_size=2000)
        allocations: list[Allocation] = []
        preemptions: list[Preemption] = []
        for job, runs, notes in runs_of:
            for i, run in enumerate(runs):
                run_end_s = run.end_s if run.end_s is not None else horizon_s  # past runs have ended
                period = DateTimeTZRange(when(run.start_s), when(run_end_s), "[)")
                allocations.extend(
                    Allocation(
                        gpu_id=gpu,
                        job=job,
                        period=period,
                        is_preemptible=run.is_preemptible,
                        state=Allocation.State.ENDED,
                    )
                    for gpu in run.gpu_ids
                )
                if i < len(runs) - 1 or job.ended_at is None:  # a later run followed: preempted
                    note = next((n for n in notes if run.start_s <= n.signal_s <= run_end_s), None)
                    signal_s = note.signal_s if note else run_end_s
                    run_s = run_end_s - run.start_s
                    lost_gpu_s = lost_work_s(
                        run_s=run_s,
                        gpu_count=len(run.gpu_ids),
                        checkpoint_interval_s=job.checkpoint_interval_s,
                    )
                    reason = note.reason if note else "Preempted (replayed history)."
                    preemptions.append(
                        Preemption(
                            job=job,
                            signalled_at=when(signal_s),
                            kill_at=when(max(signal_s, note.kill_s if note else run_end_s)),
                            killed_at=when(run_end_s),
                            lost_gpu_s=round(lost_gpu_s, 1),
                            reason=preemption_notice(reason=reason, run_s=run_s, names=name_of)[:500],
                        )
                    )
        for job, run, _ in live_runs:
            upper = None
            if job.requested_s:
                upper = max(
                    when(run.start_s) + timedelta(seconds=job.requested_s), now + timedelta(minutes=10)
                )
            allocations.extend(
                Allocation(
                    gpu_id=gpu,
                    job=job,
                    period=DateTimeTZRange(when(run.start_s), upper, "[)"),
                    is_preemptible=run.is_preemptible,
                    state=Allocation.State.ACTIVE,
                )
                for gpu in run.gpu_ids
            )
        Allocation.objects.bulk_create(allocations, batch_size=5000)
        Preemption.objects.bulk_create(preemptions, batch_size=2000)
        rounds = [r for r in replayed.rounds if r.at_s <= horizon_s]
        EngineRound.objects.bulk_create(
            (
                EngineRound(
                    cluster=cluster,
                    policy=policy.name,
                    started_at=when(r.at_s),
                    duration_ms=r.plan_ms,
                    decisions={
                        "starts": r.starts,
                        "preemptions": r.preemptions,
                        "pending": r.pending,
                        "running": r.running,
                        "idle": r.idle,
                        **({"idle_nodes": r.idle_nodes} if r.idle_nodes else {}),
                        "plan_ms": round(r.plan_ms, 3),
                        "replayed": True,
                        # nothing happens between replayed rounds: the state holds until the next
                        "hold_s": round((nxt.at_s if nxt else horizon_s) - r.at_s, 3),
                    },
                )
                for r, nxt in zip(rounds, [*rounds[1:], None], strict=True)
            ),
            batch_size=5000,
        )
        AuditEvent.objects.create(
            actor=None,
            actor_label=AuditEvent.Actor.ADMIN,
            verb="demo.history_load",
            entity_type="cluster",
            entity_id=cluster.pk,
            after={
                "jobs": len(jobs),
                "source": path.name,
                "history_days": history_days,
                "offered_load": round(offered, 3),
                "target_load": round(target, 3),
                "uses_per_trace_job": round(report.arrival_compression, 3),
                "replay_rounds": len(rounds),
                "replay_wall_s": round(replayed.wall_s, 1),
            },
            at=now,
        )
    _hand_over_running(cluster, live_runs, report=report)
    report.jobs_created = report.jobs_total = sum(1 for j in jobs if j.kind == Job.Kind.BATCH)
    report.running_at_now = sum(1 for j in jobs if j.status == Job.Status.RUNNING)
    report.pending_at_now = sum(1 for j in jobs if j.status == Job.Status.PENDING)
    report.sessions_created = sum(1 for j in jobs if j.kind == Job.Kind.INTERACTIVE)
    report.replay_rounds = len(rounds)
    report.replay_wall_s = replayed.wall_s
    if jobs:
        report.history_from = min(j.first_submitted_at for j in jobs if j.first_submitted_at)
        report.history_to = max(j.ended_at for j in jobs if j.ended_at)


def _hand_over_running(
    cluster: Cluster, live_runs: list[tuple[Job, Any, float]], *, report: DemoLabReport
) -> None:
    """Start the jobs the replay runs at "now" on the cluster's backend, on the same GPUs, with
    the work they have left (``sim_runtime_s``), through the backend's own ``apply``: the first
    live round then finds them running.  A backend that cannot take them leaves them to the
    round, which requeues them as lost (said in the report)."""
    if not live_runs:
        return
    from scheduling.backends.base import BackendError
    from scheduling.backends.registry import backend_for_cluster
    from scheduling.engine.types import Plan, StartAction

    plan = Plan(
        starts=tuple(
            StartAction(
                job_id=str(job.pk),
                gpu_ids=tuple(run.gpu_ids),
                node_ids=(),
                is_preemptible=run.is_preemptible,
                expected_end_at=float("inf"),
            )
            for job, run, _ in live_runs
        )
    )
    payloads = {
        str(job.pk): {
            **job.payload,
            "requested_s": job.requested_s,
            "is_preemptible": job.is_preemptible,
            "is_checkpointable": job.is_checkpointable,
            "checkpoint_interval_s": job.checkpoint_interval_s,
        }
        for job, _, _ in live_runs
    }
    try:
        backend = backend_for_cluster(cluster)
        results = backend.apply(plan, payloads=payloads)
    except BackendError as exc:
        report.skipped.append(
            f"running jobs not handed to the backend ({exc}); the first round requeues them"
        )
        return
    refused = [r for r in results if r.action == "start" and not r.is_ok]
    if refused:
        report.skipped.append(f"{len(refused)} running job(s) refused by the backend: {refused[0].message}")


def et_gpu_type(gpu_type: GpuType) -> Any:
    """The engine's view of a GPU type row."""
    from scheduling.engine.types import GpuType as EngineGpuType

    return EngineGpuType(
        name=gpu_type.name,
        memory_gib=gpu_type.memory_gib,
        precisions=frozenset(gpu_type.precisions),
        relative_speed=gpu_type.relative_speed,
        value=gpu_type.value,
    )


# A few windows ahead, for a lived-in "My bookings" page: (who, project, hours from now, hours, GPUs).
UPCOMING_BOOKINGS: tuple[tuple[str, str, int, int, int], ...] = (
    ("ada", "vision", 2, 3, 1),
    ("grace", "language", 5, 4, 2),
    ("alan", "robotics", 26, 2, 1),
    ("katherine", "climate", 50, 6, 2),
)


def _build_bookings(
    cluster: Cluster,
    users: dict[str, Any],
    projects: dict[str, Project],
    *,
    now: datetime,
    report: DemoLabReport,
) -> None:
    # Imported here: the services import the selectors, which only the booking step needs.
    from scheduling.services import BookingConflictError, booking_create

    # The most plentiful type: upcoming windows should not collide with each other.
    type_name = max(report.gpus_by_type, key=lambda t: report.gpus_by_type[t])
    gpu_type = GpuType.objects.get(name=type_name)
    start_of_hour = now.replace(minute=0, second=0, microsecond=0)
    for username, slug, in_h, hours, gpus in UPCOMING_BOOKINGS:
        note = f"demo: {slug} window"
        if Booking.objects.filter(cluster=cluster, user=users[username], note=note).exists():
            continue
        start_at = start_of_hour + timedelta(hours=in_h)
        try:
            booking_create(
                users[username],
                project=projects[slug],
                cluster=cluster,
                gpu_type=gpu_type,
                gpu_count=gpus,
                start_at=start_at,
                end_at=start_at + timedelta(hours=hours),
                note=note,
                actor_label=AuditEvent.Actor.ADMIN,
                now=now,
            )
        except ValidationError as exc:
            report.skipped.append(f"{username}: {'; '.join(exc.messages)}")
            continue
        except (BookingConflictError, PermissionDenied) as exc:
            report.skipped.append(f"{username}: {exc}")
            continue
        report.bookings_created += 1


# Work waiting for the engine when the demo starts, so "My jobs" shows jobs being placed:
# (who, project, name, GPUs, GPU type or None for "any with enough memory", hours requested,
#  preemptible, checkpointable).
QUEUED_JOBS: tuple[tuple[str, str, str, int, str | None, float, bool, bool], ...] = (
    ("ada", "vision", "vit-b16-finetune", 4, "G2", 2, True, False),
    ("grace", "language", "llm-7b-sft", 8, "G2", 6, True, True),
    ("alan", "robotics", "ppo-sweep-3", 1, "T4", 0.5, False, False),
    ("katherine", "climate", "era5-emulator", 2, "V100M32", 4, False, True),
    ("donald", "language", "eval-harness", 1, None, 1, False, False),
    ("frances", "robotics", "sim2real-batch", 2, "G2", 1, True, False),
    # Short, preemptible and any type: it backfills a free GPU in the first round (the "fast
    # start" a watcher sees), even when the history left every pool queued.
    ("alan", "vision", "smoke-test-notebook", 1, None, 0.25, True, False),
)


def _build_queue(
    cluster: Cluster,
    users: dict[str, Any],
    projects: dict[str, Project],
    *,
    now: datetime,
    report: DemoLabReport,
) -> None:
    from scheduling.services import job_submit

    types = {t.name: t for t in GpuType.objects.filter(nodes__cluster=cluster).distinct()}
    for username, slug, name, gpus, type_name, hours, is_preemptible, is_checkpointable in QUEUED_JOBS:
        if Job.objects.filter(cluster=cluster, user=users[username], name=name).exists():
            continue
        gpu_type = types.get(type_name) if type_name else None
        if type_name and gpu_type is None:
            continue  # a scaled-down inventory without this type
        try:
            job_submit(
                users[username],
                project=projects[slug],
                name=name,
                gpu_count=gpus,
                cluster=cluster,
                gpu_type=gpu_type,
                min_memory_gib=0.0 if gpu_type else 16.0,
                requested_s=int(hours * 3600),
                is_preemptible=is_preemptible,
                is_checkpointable=is_checkpointable,
                checkpoint_interval_s=900 if is_checkpointable else None,
                payload={"command": f"python train.py --run {name}", "source": "demo"},
                actor_label=AuditEvent.Actor.ADMIN,
                now=now,
            )
        except (ValidationError, PermissionDenied) as exc:
            report.skipped.append(f"job {name}: {exc}")
            continue
        report.queued_jobs_created += 1


def _predict_waiting(cluster: Cluster, *, report: DemoLabReport, log: Callable[[str], None]) -> None:
    """Store runtime predictions for the waiting jobs that have none yet, with the portal's own
    hourly refresh (`jobs_runtime_predict`), so no job says "Not predicted yet" until it runs.
    History jobs already carry what the predictor said when they were submitted (the replay)."""
    from forecasting.selectors import runtime_predictor_forget
    from forecasting.services import jobs_runtime_predict

    runtime_predictor_forget(cluster_id=cluster.pk)  # its finished history was just stored
    report.predictions_stored = jobs_runtime_predict(cluster_id=cluster.pk, only_missing=True)
    log(f"runtime predictions: {report.predictions_stored} waiting jobs")


def _build_forecasts(
    cluster: Cluster, *, now: datetime, report: DemoLabReport, log: Callable[[str], None]
) -> None:
    """Fit this hour's demand forecasts from the history just stored, unless they are there:
    the availability and capacity pages show forecast bands from the first page view."""
    import time as _time

    from forecasting.models import ForecastRun
    from forecasting.selectors import hour_floor
    from forecasting.services import forecast_refresh_run_now

    if ForecastRun.objects.filter(cluster=cluster, issued_at=hour_floor(now)).exists():
        return
    started = _time.perf_counter()
    result = forecast_refresh_run_now(cluster_id=cluster.pk, replace=False)
    report.forecasts_created = result.created
    report.forecast_s = _time.perf_counter() - started
    if result.failed:
        report.skipped.append(f"forecasts: {result.failed} series failed to fit (see the log)")
    log(f"forecasts: {result.created} stored in {report.forecast_s:.1f} s")


def _queue_forecasts(
    cluster: Cluster, *, now: datetime, report: DemoLabReport, log: Callable[[str], None]
) -> None:
    """Queue this hour's forecast fit for the Celery worker (what `make demo` does at start-up:
    the web server answers at once and the pages say "fitting" until the worker is done)."""
    from forecasting.models import ForecastRun
    from forecasting.selectors import hour_floor
    from forecasting.services import forecast_refresh_request

    if ForecastRun.objects.filter(cluster=cluster, issued_at=hour_floor(now)).exists():
        return
    forecast_refresh_request(cluster_id=cluster.pk)
    report.forecasts_queued = True
    log("forecasts: queued for the worker")
