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

# Re-exported: the command, the tests and `demo_load` name these from here.
__all__ = [
    "ADMIN_PASSWORD",
    "CLUSTER_NAME",
    "HISTORY_SOURCE",
    "JOBS_FILE",
    "KTH_EPOCH",
    "NODES_FILE",
    "PROJECTS",
    "QUEUED_JOBS",
    "RESEARCHERS",
    "RESEARCHER_PASSWORD",
    "SAMPLES_DIR",
    "SAMPLE_JOB_EVERY",
    "DemoLabError",
    "DemoLabReport",
    "NodeRow",
    "TraceRow",
    "demo_lab_build",
    "demo_lab_reset",
    "history_shift",
    "read_nodes",
    "read_trace",
    "scale_nodes",
    "trace_load",
]

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.accounts.models import Membership, Project, Quota
from scheduling.management.demo_store import history_build
from scheduling.management.demo_traces import (
    HISTORY_SOURCE,
    JOBS_FILE,
    KTH_EPOCH,
    NODES_FILE,
    SAMPLE_JOB_EVERY,
    SAMPLE_NODE_FRACTION,
    SAMPLES_DIR,
    NodeRow,
    TraceRow,
    _pick_file,
    history_shift,
    read_nodes,
    read_trace,
    scale_nodes,
    trace_load,
)
from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Cluster,
    Gpu,
    GpuType,
    Job,
    Node,
    Preemption,
)
from scheduling.ports import prediction_port

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
    history_build(
        jobs_path,
        cluster,
        users,
        projects,
        history_days=history_days,
        now=now,
        report=report,
        load=load,
        researchers=[u for u, _, _ in RESEARCHERS],
        members_of={u: [p.slug for p in PROJECTS if u in p.members] for u, _, _ in RESEARCHERS},
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
    # start" a watcher sees), even when the history left every pool queued, as long as one GPU
    # is free then.  At some times of week the history leaves every GPU busy at "now" (the
    # trace's own peaks); it then waits, with its reason, like the rest.
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
    hourly refresh (`PredictionPort.runtime_predictions_store`), so no job says "Not predicted
    yet" until it runs.  History jobs already carry what the predictor said when they were
    submitted (the replay)."""
    port = prediction_port()
    port.runtime_predictor_forget(cluster_id=cluster.pk)  # its finished history was just stored
    report.predictions_stored = port.runtime_predictions_store(cluster_id=cluster.pk, only_missing=True)
    log(f"runtime predictions: {report.predictions_stored} waiting jobs")


def _build_forecasts(
    cluster: Cluster, *, now: datetime, report: DemoLabReport, log: Callable[[str], None]
) -> None:
    """Fit this hour's demand forecasts from the history just stored, unless they are there:
    the availability and capacity pages show forecast bands from the first page view."""
    import time as _time

    port = prediction_port()
    if port.forecast_is_stored(cluster_id=cluster.pk, at=now):
        return
    started = _time.perf_counter()
    result = port.forecast_refresh_run_now(cluster_id=cluster.pk)
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
    port = prediction_port()
    if port.forecast_is_stored(cluster_id=cluster.pk, at=now):
        return
    port.forecast_refresh_request(cluster_id=cluster.pk)
    report.forecasts_queued = True
    log("forecasts: queued for the worker")
