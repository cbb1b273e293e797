"""The demo lab's past: replay the trace window through the cluster's engine and simulator
(`demo_history`) and store what happened as real rows: finished jobs, allocations,
preemptions (with the work they lost) and engine rounds; the jobs still running at "now" are
handed to the live simulator on the same GPUs.

Inserted with ``bulk_create``: a record of the past, not a state change a person or the engine
made now.  Split from `demo_lab` (house rule: files under 600 lines, functions under 80).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from portal.accounts.models import Project, Quota
from scheduling.management.demo_history import (
    HistoryJob,
    ReplayedHistory,
    Run,
    history_replay,
    lost_work_s,
    preemption_notice,
)
from scheduling.management.demo_traces import (
    HISTORY_SOURCE,
    SAMPLE_JOB_EVERY,
    SAMPLES_DIR,
    PlacedRow,
    TraceRow,
    _stable_index,
    _trace_window,
    read_trace,
)
from scheduling.models import Allocation, AuditEvent, Cluster, EngineRound, GpuType, Job, Preemption


class _People:
    """Who the trace's users and groups are in the lab: the busiest trace users (over the whole
    log) become the first demo researchers, so each demo person has a believable, distinct
    history; each trace group maps to one of that person's projects."""

    def __init__(
        self,
        rows: list[TraceRow],
        projects: dict[str, Project],
        *,
        researchers: list[str],
        members_of: dict[str, list[str]],
        gpus_by_type: dict[str, int],
    ) -> None:
        activity: Counter[str] = Counter()
        for r in rows:
            activity[r.user] += r.gpu_count * (r.end_s - r.start_s)
        self.user_of = {
            trace_user: researchers[i % len(researchers)]
            for i, (trace_user, _) in enumerate(activity.most_common())
        }
        self.projects_of = {
            username: [projects[slug] for slug in members_of[username]] for username in researchers
        }
        self.quotas = {
            (q.project_id, q.gpu_type.name): q
            for q in Quota.objects.filter(project__in=list(projects.values())).select_related("gpu_type")
        }
        self.gpus_by_type = gpus_by_type

    def project_of(self, r: TraceRow) -> Project:
        own_projects = self.projects_of[self.user_of[r.user]]
        return own_projects[_stable_index(f"{r.user}/{r.group}", len(own_projects))]

    def limits_of(self, r: TraceRow) -> dict[str, int]:
        """Per type: the most GPUs the job's project may hold there (guarantee + borrowing)."""
        project = self.project_of(r)
        out = {}
        for type_name, gpus in self.gpus_by_type.items():
            quota = self.quotas.get((project.pk, type_name))
            if quota is None or quota.borrow_limit_gpus is None:
                most = gpus
            else:
                most = quota.guaranteed_gpus + quota.borrow_limit_gpus
            out[type_name] = min(gpus, most)
        return out


@dataclass(slots=True)
class _Past:
    """The replay's outcome being turned into rows."""

    cluster: Cluster
    users: dict[str, Any]
    projects: dict[str, Project]
    people: _People
    origin: datetime
    now: datetime
    replayed: ReplayedHistory
    specs: dict[str, tuple[PlacedRow, Project]]
    gpu_types: dict[str, GpuType]
    type_of_gpu: dict[int, str]
    guarantee: dict[tuple[int, int], int]
    policy_name: str
    jobs: list[Job] = field(default_factory=list)
    name_of: dict[str, str] = field(default_factory=dict)  # replay key -> the portal's job name
    runs_of: list[tuple[Job, list[Run], list[Any]]] = field(default_factory=list)
    # Jobs the replay still runs at "now": stored running on their GPUs, handed to the live sim.
    live_runs: list[tuple[Job, Run, float]] = field(default_factory=list)

    @property
    def horizon_s(self) -> float:
        return (self.now - self.origin).total_seconds()

    def when(self, seconds: float) -> datetime:
        return self.origin + timedelta(seconds=seconds)


def history_build(
    path: Path,
    cluster: Cluster,
    users: dict[str, Any],
    projects: dict[str, Project],
    *,
    history_days: int,
    now: datetime,
    report: Any,
    load: float | None,
    researchers: list[str],
    members_of: dict[str, list[str]],
) -> None:
    """Replay the trace's arrivals through the cluster's engine and simulator and store the
    result (`demo_history`): finished jobs, allocations, preemptions and engine rounds.
    ``report`` is the build's `DemoLabReport` (filled in here)."""
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
    people = _People(
        rows, projects, researchers=researchers, members_of=members_of, gpus_by_type=report.gpus_by_type
    )
    placed, offered, target = _trace_window(
        rows,
        now=now,
        history_days=history_days,
        load=load,
        capacity=dict(report.gpus_by_type),
        limits_of=people.limits_of,
        max_uses=SAMPLE_JOB_EVERY if path.parent == SAMPLES_DIR else 1,
    )
    report.offered_load = offered
    report.target_load = target
    report.arrival_compression = len(placed) / max(1, len({p.row.job_id for p in placed}))
    past = _replay(cluster, users, projects, people, placed, origin=origin, now=now, report=report)
    for key in sorted(set(past.replayed.runs) | set(past.specs)):
        _job_from_replay(past, key)
    rounds = _store(past, path=path, history_days=history_days, offered=offered, target=target, report=report)
    _hand_over_running(cluster, past.live_runs, report=report)
    jobs = past.jobs
    report.jobs_created = report.jobs_total = sum(1 for j in jobs if j.kind == Job.Kind.BATCH)
    report.running_at_now = sum(1 for j in jobs if j.status == Job.Status.RUNNING)
    report.pending_at_now = sum(1 for j in jobs if j.status == Job.Status.PENDING)
    report.sessions_created = sum(1 for j in jobs if j.kind == Job.Kind.INTERACTIVE)
    report.replay_rounds = rounds
    report.replay_wall_s = past.replayed.wall_s
    if jobs:
        report.history_from = min(j.first_submitted_at for j in jobs if j.first_submitted_at)
        report.history_to = max(j.ended_at for j in jobs if j.ended_at)


def _replay(
    cluster: Cluster,
    users: dict[str, Any],
    projects: dict[str, Project],
    people: _People,
    placed: list[PlacedRow],
    *,
    origin: datetime,
    now: datetime,
    report: Any,
) -> _Past:
    """Run the window's jobs through the engine on the cluster's own nodes and quotas."""
    from scheduling.sim.overlays import ProjectQuota
    from scheduling.snapshots import engine_nodes_for_cluster, policy_config_for_cluster

    specs: dict[str, tuple[PlacedRow, Project]] = {}
    history_jobs: list[HistoryJob] = []
    for p in placed:
        r = p.row
        project = people.project_of(r)
        specs[p.key] = (p, project)
        history_jobs.append(
            HistoryJob(
                key=p.key,
                user=people.user_of[r.user],
                project=project.slug,
                submit_s=max(0.0, (p.submit_at - origin).total_seconds()),
                runtime_s=float(max(1, r.end_s - r.start_s)),
                gpu_count=p.gpu_count,
                gpu_type=p.gpu_type,
                requested_s=float(r.requested_s) if r.requested_s else None,
                status=r.status,
            )
        )
    types = list(GpuType.objects.filter(name__in=report.gpus_by_type).order_by("name"))
    engine_nodes = engine_nodes_for_cluster(cluster=cluster)
    policy = policy_config_for_cluster(cluster=cluster)
    replayed = history_replay(
        history_jobs,
        nodes=engine_nodes,
        gpu_types=tuple(et_gpu_type(t) for t in types),
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
                        for (project_id, type_name), quota in people.quotas.items()
                        if project_id == project.pk
                    )
                ),
            )
            for project in projects.values()
        ),
    )
    guarantee = {
        (project_id, type_id): gpus
        for project_id, type_id, gpus in Quota.objects.filter(
            project__in=list(projects.values())
        ).values_list("project_id", "gpu_type_id", "guaranteed_gpus")
    }
    return _Past(
        cluster=cluster,
        users=users,
        projects=projects,
        people=people,
        origin=origin,
        now=now,
        replayed=replayed,
        specs=specs,
        gpu_types={t.name: t for t in types},
        type_of_gpu={gpu: node.gpu_type for node in engine_nodes for gpu in node.gpu_ids},
        guarantee=guarantee,
        policy_name=policy.name,
    )


def _batch_job(past: _Past, key: str, runs: list[Run], notes: list[Any]) -> tuple[Job, float, float] | None:
    """A trace job of the window as a portal job: (job, its submit second, its work seconds)."""
    placed_row, project = past.specs[key]
    r = placed_row.row
    submit_s = max(0.0, (placed_row.submit_at - past.origin).total_seconds())
    if submit_s >= past.horizon_s:
        return None
    is_completed = r.status == "completed"
    is_checkpointable = key in past.replayed.checkpointable
    job = Job(
        user=past.users[past.people.user_of[r.user]],
        project=project,
        cluster=past.cluster,
        name=f"{project.slug}-{key[1:]}",
        kind=Job.Kind.BATCH,
        gpu_count=placed_row.gpu_count,
        gpu_type=past.gpu_types[placed_row.gpu_type],
        requested_s=r.requested_s,
        is_preemptible=any(run.is_preemptible for run in runs) or bool(notes),
        is_checkpointable=is_checkpointable,
        checkpoint_interval_s=round(past.replayed.checkpoint_interval_s) if is_checkpointable else None,
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
    return job, submit_s, float(max(1, r.end_s - r.start_s))


def _session_job(past: _Past, key: str, runs: list[Run]) -> tuple[Job, float, float] | None:
    """An on-demand session of the replay's overlay that ran: (job, submit second, work seconds)."""
    username, slug, submit_s, duration_s, gpu_count = past.replayed.sessions[key]
    if username not in past.users or slug not in past.projects or not runs:
        return None
    job = Job(
        user=past.users[username],
        project=past.projects[slug],
        cluster=past.cluster,
        name=f"session-{key}",
        kind=Job.Kind.INTERACTIVE,
        gpu_count=gpu_count,
        # a session takes any type; it is recorded on the type it got
        gpu_type=past.gpu_types.get(past.type_of_gpu.get(runs[-1].gpu_ids[0], ""))
        if runs[-1].gpu_ids
        else None,
        payload={"source": HISTORY_SOURCE, "session": key},
        status=Job.Status.COMPLETED,
        exit_code=0,
    )
    return job, submit_s, float(duration_s)


def _job_from_replay(past: _Past, key: str) -> None:
    """One replayed job (or session) as a portal job with its runs, finished or still going."""
    horizon_s = past.horizon_s
    all_runs = past.replayed.runs.get(key, [])
    runs = [run for run in all_runs if run.start_s < horizon_s]
    done = [run for run in runs if run.end_s is not None and run.end_s <= horizon_s]
    current = next((run for run in runs if run.end_s is None or run.end_s > horizon_s), None)
    is_finished = current is None and bool(done) and len(done) == len(all_runs)
    notes = [n for n in past.replayed.preemptions.get(key, []) if n.signal_s < horizon_s]
    if key in past.specs:
        made = _batch_job(past, key, runs, notes)
    elif key in past.replayed.sessions:
        if not is_finished and current is None:
            return  # a session still waiting at "now" is given up (the overlay's patience)
        made = _session_job(past, key, runs)
    else:
        return
    if made is None:
        return
    job, submit_s, work_s = made
    if key in past.replayed.predictions and job.kind == Job.Kind.BATCH:
        job.predicted_p50_s, job.predicted_p90_s = past.replayed.predictions[key]
    job.attempt = len(done)
    job.first_submitted_at = past.when(submit_s)
    # a requeued job's latest submit is its requeue (the engine's view); the first is kept above
    requeued_at = done[-1].end_s if done else None
    job.submitted_at = past.when(requeued_at if requeued_at is not None else submit_s)
    if is_finished:
        last = done[-1]
        job.attempt = len(done) - 1
        previous_end = done[-2].end_s if len(done) > 1 else None
        job.submitted_at = past.when(previous_end if previous_end is not None else submit_s)
        job.started_at = past.when(last.start_s)
        job.ended_at = past.when(last.end_s if last.end_s is not None else horizon_s)
    else:
        _leave_running_or_pending(past, job, key, done=done, current=current, work_s=work_s)
        job.ended_at = None
    past.jobs.append(job)
    past.name_of[key] = job.name
    past.runs_of.append((job, done, notes))


def _leave_running_or_pending(
    past: _Past, job: Job, key: str, *, done: list[Run], current: Run | None, work_s: float
) -> None:
    """Not over at "now": what the live simulator runs from here is the work left.

    Work above its project's guarantee runs only as preemptible (DESIGN §3.4): the portal tells
    its owner so at submit, and the lab's people follow that advice, so the live queue holds no
    job that the quotas never let start."""
    horizon_s = past.horizon_s
    above = job.gpu_count > past.guarantee.get((job.project_id, job.gpu_type_id or 0), 0)
    if job.kind == Job.Kind.BATCH and job.gpu_type is not None and above:
        job.is_preemptible = True
    done_s = sum((run.end_s or horizon_s) - run.start_s for run in done)
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
        job.started_at = past.when(current.start_s)
        past.live_runs.append((job, current, horizon_s))
    else:
        job.status = Job.Status.PENDING
        job.started_at = None


def _past_rows(past: _Past) -> tuple[list[Allocation], list[Preemption]]:
    """The ended allocations of every past run, and a preemption for every run cut short."""
    allocations: list[Allocation] = []
    preemptions: list[Preemption] = []
    for job, runs, notes in past.runs_of:
        for i, run in enumerate(runs):
            run_end_s = run.end_s if run.end_s is not None else past.horizon_s  # past runs ended
            period = DateTimeTZRange(past.when(run.start_s), past.when(run_end_s), "[)")
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
                    run_s=run_s, gpu_count=len(run.gpu_ids), checkpoint_interval_s=job.checkpoint_interval_s
                )
                reason = note.reason if note else "Preempted (replayed history)."
                preemptions.append(
                    Preemption(
                        job=job,
                        signalled_at=past.when(signal_s),
                        kill_at=past.when(max(signal_s, note.kill_s if note else run_end_s)),
                        killed_at=past.when(run_end_s),
                        lost_gpu_s=round(lost_gpu_s, 1),
                        reason=preemption_notice(reason=reason, run_s=run_s, names=past.name_of)[:500],
                    )
                )
    return allocations, preemptions


def _live_rows(past: _Past) -> list[Allocation]:
    """Active allocations of the jobs still running at "now", until their requested end."""
    allocations: list[Allocation] = []
    for job, run, _ in past.live_runs:
        upper = None
        if job.requested_s:
            upper = max(
                past.when(run.start_s) + timedelta(seconds=job.requested_s), past.now + timedelta(minutes=10)
            )
        allocations.extend(
            Allocation(
                gpu_id=gpu,
                job=job,
                period=DateTimeTZRange(past.when(run.start_s), upper, "[)"),
                is_preemptible=run.is_preemptible,
                state=Allocation.State.ACTIVE,
            )
            for gpu in run.gpu_ids
        )
    return allocations


def _round_rows(past: _Past) -> list[EngineRound]:
    """One engine round per replayed round; its counts hold until the next (``hold_s``)."""
    rounds = [r for r in past.replayed.rounds if r.at_s <= past.horizon_s]
    return [
        EngineRound(
            cluster=past.cluster,
            policy=past.policy_name,
            started_at=past.when(r.at_s),
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
                "hold_s": round((nxt.at_s if nxt else past.horizon_s) - r.at_s, 3),
            },
        )
        for r, nxt in zip(rounds, [*rounds[1:], None], strict=True)
    ]


def _store(past: _Past, *, path: Path, history_days: int, offered: float, target: float, report: Any) -> int:
    """Insert the history in one transaction; returns how many rounds were stored."""
    with transaction.atomic():
        Job.objects.bulk_create(past.jobs, batch_size=2000)
        allocations, preemptions = _past_rows(past)
        Allocation.objects.bulk_create([*allocations, *_live_rows(past)], batch_size=5000)
        Preemption.objects.bulk_create(preemptions, batch_size=2000)
        rounds = _round_rows(past)
        EngineRound.objects.bulk_create(rounds, batch_size=5000)
        AuditEvent.objects.create(
            actor=None,
            actor_label=AuditEvent.Actor.ADMIN,
            verb="demo.history_load",
            entity_type="cluster",
            entity_id=past.cluster.pk,
            after={
                "jobs": len(past.jobs),
                "source": path.name,
                "history_days": history_days,
                "offered_load": round(offered, 3),
                "target_load": round(target, 3),
                "uses_per_trace_job": round(report.arrival_compression, 3),
                "replay_rounds": len(rounds),
                "replay_wall_s": round(past.replayed.wall_s, 1),
            },
            at=past.now,
        )
    return len(rounds)


def _hand_over_running(cluster: Cluster, live_runs: list[tuple[Job, Run, float]], *, report: Any) -> None:
    """Start the jobs the replay runs at "now" on the cluster's backend, on the same GPUs, with
    the work they have left (``sim_runtime_s``), through the backend's own ``apply``: the first
    live round then finds them running.  A backend that cannot take them leaves them to the
    round, which requeues them as lost (said in the report)."""
    if not live_runs:
        return
    from scheduling.backend_registry import backend_for_cluster
    from scheduling.backends.base import BackendError
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
