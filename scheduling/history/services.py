"""Write imported history: map users, accounts and GPU types, insert new jobs, report skips.

Idempotent: every imported job carries ``payload["import_key"]`` (``<source>:<external id>``,
per cluster); a key already present is skipped ("already imported"), so a second run over
the same dump changes nothing.  A Slurm job that Berth itself ran (its ``backend_ref`` is the
Slurm job id) is skipped as well: the portal already has it.  Imported jobs are ordinary
finished ``Job`` rows, so the forecasting app's demand series sees them at once, and the
cluster's cached runtime predictor is dropped (through the prediction port,
``scheduling.ports``) so the next prediction learns from them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from portal.accounts.models import Membership, Project
from scheduling.history.parsers import HistoryRecord, Skip
from scheduling.models import AuditEvent, Cluster, GpuType, Job
from scheduling.ports import prediction_port
from scheduling.snapshot.jobs import round_predictions_forget

_STATUS = {
    "completed": Job.Status.COMPLETED,
    "failed": Job.Status.FAILED,
    "cancelled": Job.Status.CANCELLED,
}


@dataclass
class ImportReport:
    """What an import did: jobs created, and every skipped row with its reason."""

    created: int = 0
    skipped: list[Skip] = field(default_factory=list)
    users_created: list[str] = field(default_factory=list)

    def reasons(self) -> Counter[str]:
        return Counter(_family(s.reason) for s in self.skipped)


def _family(reason: str) -> str:
    """Group skip reasons that differ only in the name they quote ("unknown user 'x'")."""
    return reason.split(" '")[0] if " '" in reason else reason


def history_import(
    records: Sequence[HistoryRecord],
    *,
    cluster: Cluster,
    skips: Sequence[Skip] = (),
    user_map: Mapping[str, str] | None = None,
    account_map: Mapping[str, str] | None = None,
    gpu_type_map: Mapping[str, str] | None = None,
    default_user: str | None = None,
    default_project: str | None = None,
    create_users: bool = False,
    dry_run: bool = False,
) -> ImportReport:
    """Insert the records not yet imported into ``cluster`` as finished jobs.

    Mapping: a source user is the Django user of that name (``user_map`` renames; unknown
    users are skipped, or created without a usable password with ``create_users``; an empty
    user becomes ``default_user``).  An account is the project of that slug (``account_map``
    renames, ``default_project`` catches the rest).  A GPU type is the ``GpuType`` of that name,
    compared case-insensitively (``gpu_type_map`` renames; an empty type stays "any type").
    With ``create_users`` a created user becomes a member of the job's project.
    """
    report = ImportReport(skipped=list(skips))
    with transaction.atomic():
        # One import per cluster at a time: the existing-key check and the insert are one step.
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        keys = {f"{r.source}:{r.external_id}": r for r in records}
        existing, berth_ran = _already_known(cluster=cluster, keys=keys)
        resolver = _Resolver(
            users={u.username: u for u in get_user_model().objects.all()},
            projects={p.slug: p for p in Project.objects.all()},
            types={t.name.lower(): t for t in GpuType.objects.all()},
            user_map=dict(user_map or {}),
            account_map=dict(account_map or {}),
            type_map={k.lower(): v for k, v in (gpu_type_map or {}).items()},
            default_user=default_user,
            default_project=default_project,
            create_users=create_users,
            dry_run=dry_run,
            report=report,
        )
        jobs: list[Job] = []
        seen: set[str] = set()
        for key, record in keys.items():
            resolved: _Resolved | str
            if key in existing or key in seen:
                resolved = "already imported"
            elif record.source == "sacct" and record.external_id in berth_ran:
                resolved = "run by Berth itself (already a Berth job)"
            else:
                resolved = resolver.resolve(record)
            if isinstance(resolved, str):  # why it is skipped
                report.skipped.append(Skip(0, record.external_id, resolved))  # 0: after parsing
                continue
            seen.add(key)
            if dry_run:
                report.created += 1
                continue
            jobs.append(_imported_job(record, key=key, cluster=cluster, resolved=resolved))
        if jobs:
            _imported_jobs_save(jobs, cluster=cluster, report=report)
        if jobs and not dry_run:
            transaction.on_commit(lambda: _forget_predictor(cluster.pk))
    return report


def _already_known(*, cluster: Cluster, keys: Mapping[str, HistoryRecord]) -> tuple[set[str], set[str]]:
    """Import keys already in the cluster, and the Slurm job ids Berth itself ran there."""
    existing = set(
        Job.objects.filter(cluster=cluster, payload__import_key__in=list(keys)).values_list(
            "payload__import_key", flat=True
        )
    )
    berth_ran = set(
        Job.objects.filter(cluster=cluster, backend_ref__in=[r.external_id for r in keys.values()])
        .exclude(backend_ref="")
        .values_list("backend_ref", flat=True)
    )
    return existing, berth_ran


@dataclass
class _Resolved:
    user: Any  # None only in a dry run that would create the user
    project: Project
    gpu_type: GpuType | None


@dataclass
class _Resolver:
    """Maps a record's user, account and GPU type to the portal's rows (see `history_import`)."""

    users: dict[str, Any]
    projects: dict[str, Project]
    types: dict[str, GpuType]
    user_map: dict[str, str]
    account_map: dict[str, str]
    type_map: dict[str, str]
    default_user: str | None
    default_project: str | None
    create_users: bool
    dry_run: bool
    report: ImportReport

    def resolve(self, record: HistoryRecord) -> _Resolved | str:
        """The record's rows, or why it is skipped.  Creates a missing user with ``create_users``."""
        username = self.user_map.get(record.user, record.user) or (self.default_user or "")
        if not username:
            return "no user in the source (give --default-user)"
        slug = self.account_map.get(record.account, record.account)
        project = self.projects.get(slug) or (
            self.projects.get(self.default_project) if self.default_project else None
        )
        if project is None:
            return f"unknown account '{record.account}' (map it with --map-account or --default-project)"
        user = self.users.get(username)
        if user is None:
            if not self.create_users:
                return f"unknown user '{username}' (map it with --map-user, or --create-users)"
            if not self.dry_run:
                user = get_user_model().objects.create_user(username=username, password=None)
                Membership.objects.get_or_create(user=user, project=project)
                self.users[username] = user
            self.report.users_created.append(username)
        gpu_type = None
        if record.gpu_type:
            name = self.type_map.get(record.gpu_type.lower(), record.gpu_type)
            gpu_type = self.types.get(name.lower())
            if gpu_type is None:
                return f"unknown GPU type '{record.gpu_type}' (map it with --map-gpu-type)"
        return _Resolved(user=user, project=project, gpu_type=gpu_type)


def _imported_job(record: HistoryRecord, *, key: str, cluster: Cluster, resolved: _Resolved) -> Job:
    """An unsaved finished job for one imported record."""
    return Job(
        user=resolved.user,
        project=resolved.project,
        cluster=cluster,
        name=record.name[:200],
        kind=Job.Kind.BATCH,
        gpu_count=min(record.gpu_count, 32767),
        gpu_type=resolved.gpu_type,
        requested_s=record.requested_s,
        payload={
            "import_key": key,
            "source": f"history_import:{record.source}",
            "source_user": record.user,
            "source_account": record.account,
        },
        status=_STATUS[record.status],
        submitted_at=record.submitted_at,
        first_submitted_at=record.submitted_at,
        started_at=record.started_at,
        ended_at=record.ended_at,
        exit_code=record.exit_code,
        status_message=f"Imported from {record.source} ({record.external_id}).",
    )


def _imported_jobs_save(jobs: Sequence[Job], *, cluster: Cluster, report: ImportReport) -> None:
    """Insert the jobs and one ``history.import`` audit event for the batch."""
    Job.objects.bulk_create(jobs, batch_size=2000)
    report.created = len(jobs)
    AuditEvent.objects.create(
        actor=None,
        actor_label=AuditEvent.Actor.ADMIN,
        verb="history.import",
        entity_type="cluster",
        entity_id=cluster.pk,
        after={"jobs": len(jobs), "skipped": len(report.skipped)},
        at=timezone.now(),
    )


def _forget_predictor(cluster_id: int) -> None:
    """The cluster's predictor, and what rounds predicted with it, learn the imported history."""
    prediction_port().runtime_predictor_forget(cluster_id=cluster_id)
    round_predictions_forget(cluster_id=cluster_id)
