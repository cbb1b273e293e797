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

CLUSTER_NAME = "demo"
DEFAULT_SCALE = 0.025
DEFAULT_HISTORY_DAYS = 28
# Offered load of the history (GPU-hours asked for over GPU-hours there): a busy lab queues.
DEFAULT_LOAD = 0.8

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
    arrival_compression: float = 1.0
    forecasts_created: int = 0
    forecast_s: float = 0.0
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
    make_forecasts: bool = True,
    log: Callable[[str], None] = lambda _msg: None,
) -> DemoLabReport:
    """Create what is missing of the demo lab and report what is there.

    ``scale`` is the fraction of the *real* inventory's nodes to keep (the shipped sample
    already holds a quarter of them, which is accounted for).  ``history_days`` bounds the job
    history, which ends at ``now``; ``load`` is the offered load the history's arrivals are
    brought to (`_trace_window`; None: the log's own pace).  The history is replayed through
    the cluster's engine (`demo_history`).  Running it again creates nothing new.
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
    if make_forecasts:
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


def _trace_window(
    rows: list[TraceRow], *, now: datetime, history_days: int, load: float | None, capacity_gpus: int
) -> tuple[list[TraceRow], float, timedelta]:
    """The trace rows that fall in the history window, the time compression and the shift.

    Trace time ``s`` lands at ``KTH_EPOCH + shift + (s - end) / compression + end`` (the log's
    end stays in place, earlier arrivals move closer to it).  ``load`` (offered GPU-hours over
    the window's GPU-hours) picks the compression: the log's own pace when it already offers
    that much, faster (at most 8x, and never so fast that the log covers only part of the
    window) when it is lighter, so the demo lab queues as a busy lab
    does; None keeps the log's pace.  The shift is whole weeks (`history_shift`).
    """
    trace_end = max(r.end_s for r in rows)
    shift = history_shift(trace_end_s=trace_end, now=now)
    window_start = now - timedelta(days=history_days)
    end_at = KTH_EPOCH + shift + timedelta(seconds=trace_end)

    def pick(compression: float) -> list[TraceRow]:
        kept = []
        for r in rows:
            submit_at = end_at - timedelta(seconds=(trace_end - r.submit_s) / compression)
            if submit_at >= window_start and submit_at + timedelta(seconds=r.end_s - r.submit_s) <= now:
                kept.append(r)
        return kept

    window_s = history_days * 86_400.0
    compression = 1.0
    kept = pick(compression)
    # never squeeze the log into part of the window: the history would start days late
    most = max(1.0, min(8.0, (trace_end - min(r.submit_s for r in rows)) / window_s)) if window_s else 1.0
    if load is not None and capacity_gpus > 0 and window_s > 0:
        for _ in range(3):
            offered = sum(min(r.gpu_count, capacity_gpus) * (r.end_s - r.start_s) for r in kept)
            current = offered / (capacity_gpus * window_s)
            if current <= 0 or abs(current - load) < 0.02 * load:
                break
            compression = min(most, max(1.0, compression * load / current))
            kept = pick(compression)
    return kept, compression, shift


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
    from scheduling.management.demo_history import HistoryJob, history_replay
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
    kept, compression, shift = _trace_window(
        rows, now=now, history_days=history_days, load=load, capacity_gpus=report.gpus
    )
    trace_end = max(r.end_s for r in rows)
    origin = now - timedelta(days=history_days)

    def rel(seconds: int) -> float:
        """Trace seconds -> seconds after ``origin``."""
        landed = KTH_EPOCH + shift + timedelta(seconds=trace_end + (seconds - trace_end) / compression)
        return (landed - origin).total_seconds()

    # The busiest trace users become the first demo researchers, so each demo person has a
    # believable, distinct history; each trace group maps to one of that person's projects.
    activity: Counter[str] = Counter()
    for r in kept:
        activity[r.user] += r.gpu_count * (r.end_s - r.start_s)
    researchers = [u for u, _, _ in RESEARCHERS]
    user_of = {
        trace_user: researchers[i % len(researchers)]
        for i, (trace_user, _) in enumerate(activity.most_common())
    }
    projects_of = {
        username: [projects[p.slug] for p in PROJECTS if username in p.members] for username in researchers
    }
    gpu_types = {t.name: t for t in GpuType.objects.filter(name__in=report.gpus_by_type)}
    capacity = list(report.gpus_by_type.items())
    specs: dict[str, tuple[TraceRow, Project, str, int]] = {}
    history_jobs: list[HistoryJob] = []
    for r in kept:
        username = user_of[r.user]
        own_projects = projects_of[username]
        project = own_projects[_stable_index(f"{r.user}/{r.group}", len(own_projects))]
        # Larger jobs only go where the type has room; the pick is weighted by the type's size.
        fitting = [(name, gpus) for name, gpus in capacity if gpus >= min(r.gpu_count, 8)] or capacity
        type_name = _weighted_pick(r.job_id, fitting)
        gpu_count = min(r.gpu_count, report.gpus_by_type[type_name])
        key = f"t{r.job_id}"
        specs[key] = (r, project, type_name, gpu_count)
        history_jobs.append(
            HistoryJob(
                key=key,
                user=username,
                project=project.slug,
                submit_s=max(0.0, rel(r.submit_s)),
                runtime_s=float(max(1, r.end_s - r.start_s)),
                gpu_count=gpu_count,
                gpu_type=type_name,
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
    )
    horizon_s = (now - origin).total_seconds()

    def when(seconds: float) -> datetime:
        return origin + timedelta(seconds=seconds)

    jobs: list[Job] = []
    runs_of: list[tuple[Job, list[Any], list[Any]]] = []
    for key, runs in replayed.runs.items():
        if not runs or any(run.end_s is None for run in runs) or runs[-1].end_s > horizon_s:
            continue  # still running or waiting at "now": not part of the past
        notes = replayed.preemptions.get(key, [])
        if key in specs:
            r, project, type_name, gpu_count = specs[key]
            is_completed = r.status == "completed"
            submit_s = max(0.0, rel(r.submit_s))
            job = Job(
                user=users[user_of[r.user]],
                project=project,
                cluster=cluster,
                name=f"{project.slug}-{r.job_id}",
                kind=Job.Kind.BATCH,
                gpu_count=gpu_count,
                gpu_type=gpu_types[type_name],
                requested_s=r.requested_s,
                is_preemptible=any(run.is_preemptible for run in runs) or bool(notes),
                payload={"source": HISTORY_SOURCE, "trace_job_id": r.job_id, "trace_user": r.user},
                status=Job.Status.COMPLETED if is_completed else Job.Status.FAILED,
                exit_code=0 if is_completed else 1,
                status_message="" if is_completed else "Exited with a non-zero status (from the trace).",
            )
        elif key in replayed.sessions:
            username, slug, submit_s, _duration, gpu_count = replayed.sessions[key]
            if username not in users or slug not in projects:
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
        else:
            continue
        last = runs[-1]
        job.attempt = len(runs) - 1
        job.first_submitted_at = when(submit_s)
        # a requeued job's latest submit is its requeue (the engine's view); the first is kept above
        job.submitted_at = (
            when(runs[-2].end_s) if len(runs) > 1 and runs[-2].end_s is not None else when(submit_s)
        )
        job.started_at = when(last.start_s)
        job.ended_at = when(last.end_s)
        jobs.append(job)
        runs_of.append((job, runs, notes))

    with transaction.atomic():
        Job.objects.bulk_create(jobs, batch_size=2000)
        allocations: list[Allocation] = []
        preemptions: list[Preemption] = []
        for job, runs, notes in runs_of:
            for i, run in enumerate(runs):
                period = DateTimeTZRange(when(run.start_s), when(run.end_s), "[)")
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
                if i < len(runs) - 1:
                    note = next((n for n in notes if run.start_s <= n.signal_s <= run.end_s), None)
                    signal_s = note.signal_s if note else run.end_s
                    preemptions.append(
                        Preemption(
                            job=job,
                            signalled_at=when(signal_s),
                            kill_at=when(max(signal_s, note.kill_s if note else run.end_s)),
                            killed_at=when(run.end_s),
                            reason=(note.reason if note else "Preempted (replayed history).")[:500],
                        )
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
                "arrival_compression": round(compression, 3),
                "replay_rounds": len(rounds),
                "replay_wall_s": round(replayed.wall_s, 1),
            },
            at=now,
        )
    report.jobs_created = report.jobs_total = sum(1 for j in jobs if j.kind == Job.Kind.BATCH)
    report.sessions_created = sum(1 for j in jobs if j.kind == Job.Kind.INTERACTIVE)
    report.replay_rounds = len(rounds)
    report.replay_wall_s = replayed.wall_s
    report.arrival_compression = compression
    if jobs:
        report.history_from = min(j.first_submitted_at for j in jobs if j.first_submitted_at)
        report.history_to = max(j.ended_at for j in jobs if j.ended_at)


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
