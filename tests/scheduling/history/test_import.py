"""``manage.py history_import`` on a real database: mapping, skips, idempotence, predictor and demand."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from forecasting.selectors import demand_records_get, job_engine_request, runtime_predict
from portal.accounts.models import Membership
from scheduling.models import AuditEvent, Job
from tests.factories import ClusterFactory, GpuTypeFactory, MembershipFactory, NodeFactory, ProjectFactory

pytestmark = [pytest.mark.django_db]

HEADER = "JobID|JobName|User|Account|Partition|Submit|Start|End|Timelimit|State|ExitCode|AllocTRES"


def _sacct(now: datetime) -> str:
    """Twelve 1-hour GPU jobs of ada on account 'vis' plus twelve 1-minute jobs of grace, and noise."""
    lines = [HEADER]
    for i in range(12):
        start = now - timedelta(days=2, hours=-i)
        fmt = "%Y-%m-%dT%H:%M:%S"
        lines.append(
            f"{200 + i}|train|ada|vis|gpu|{start:{fmt}}|{start:{fmt}}|{start + timedelta(hours=1):{fmt}}|"
            f"04:00:00|COMPLETED|0:0|cpu=2,gres/gpu:tesla=2,node=1"
        )
        lines.append(
            f"{300 + i}|probe|grace|lang|gpu|{start:{fmt}}|{start:{fmt}}|"
            f"{start + timedelta(minutes=1):{fmt}}|"
            f"04:00:00|COMPLETED|0:0|cpu=1,gres/gpu:tesla=1,node=1"
        )
    lines += [
        f"400|who|nobody|vis|gpu|{now:%Y-%m-%dT%H:%M:%S}|{now:%Y-%m-%dT%H:%M:%S}|{now:%Y-%m-%dT%H:%M:%S}|"
        "01:00|COMPLETED|0:0|gres/gpu:tesla=1",
        f"401|h100|ada|vis|gpu|{now:%Y-%m-%dT%H:%M:%S}|{now:%Y-%m-%dT%H:%M:%S}|{now:%Y-%m-%dT%H:%M:%S}|"
        "01:00|COMPLETED|0:0|gres/gpu:h100=1",
        "402|later|ada|vis|gpu|2026-01-01T00:00:00|Unknown|Unknown|01:00|PENDING|0:0|",
    ]
    return "\n".join(lines) + "\n"


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("history_import", *args, stdout=out)
    return out.getvalue()


def test_sacct_import_maps_skips_is_idempotent_and_feeds_the_predictor(tmp_path: Path) -> None:
    a100 = GpuTypeFactory(name="A100")
    cluster = ClusterFactory(name="slurm")
    NodeFactory(cluster=cluster, gpu_type=a100, name="n0", gpu_count=4)
    vision = ProjectFactory(slug="vision")
    ada = MembershipFactory(project=vision, user__username="ada").user
    language = ProjectFactory(slug="language")
    MembershipFactory(project=language, user__username="grace")
    now = timezone.now().replace(microsecond=0, tzinfo=None)
    dump = tmp_path / "sacct.txt"
    dump.write_text(_sacct(now))
    args = [
        "sacct", str(dump), "--cluster", "slurm", "--tz", "UTC",
        "--map-account", "vis=vision", "--map-account", "lang=language", "--map-gpu-type", "tesla=A100",
    ]  # fmt: skip

    report = _run(*args)

    assert "imported 24 job(s) into slurm; skipped 3 of 27 row(s)" in report
    assert "unknown user: e.g. 400" in report
    assert "unknown GPU type: e.g. 401" in report
    assert "not finished (PENDING)" in report
    mine = Job.objects.filter(user=ada, cluster=cluster)
    assert mine.count() == 12
    job = mine.get(payload__import_key="sacct:200")
    assert (job.status, job.gpu_count, job.gpu_type, job.project, job.requested_s) == (
        Job.Status.COMPLETED, 2, a100, vision, 14400
    )  # fmt: skip
    assert job.started_at == now.replace(tzinfo=UTC) - timedelta(days=2)
    assert job.ended_at - job.started_at == timedelta(hours=1)
    assert AuditEvent.objects.filter(verb="history.import", entity_id=cluster.pk).count() == 1

    # Idempotent: the same dump again changes nothing.
    before = sorted(Job.objects.values_list("id", "ended_at"))
    again = _run(*args)
    assert "imported 0 job(s)" in again
    assert "already imported" in again
    assert sorted(Job.objects.values_list("id", "ended_at")) == before

    # The runtime predictor learns at once: ada's jobs ran 1 h, grace's 1 min.
    def predict(username: str, slug: str, name: str, gpus: int) -> float:
        request = job_engine_request(
            # A distinct id per call: the predictor memoizes its answer per job id.
            job_id=-gpus, username=username, project_slug=slug, name=name, gpu_count=gpus,
            submitted_at=timezone.now(), requested_s=14400, kind="batch", gpu_type="A100",
        )  # fmt: skip
        return runtime_predict(cluster_id=cluster.pk, requests=[request])[0][0]

    assert 1800 <= predict("ada", "vision", "train", 2) <= 7200
    assert predict("grace", "language", "probe", 1) < 600
    # And the demand history has them.
    records = demand_records_get(
        cluster_id=cluster.pk, start_at=timezone.now() - timedelta(days=3), end_at=timezone.now()
    )
    assert len(records.jobs) == 24
    assert set(records.jobs["gpu_type"]) == {"A100"}


def test_jobs_berth_ran_on_slurm_are_not_imported_twice(tmp_path: Path) -> None:
    cluster = ClusterFactory(name="slurm")
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project, user__username="ada").user
    Job.objects.create(
        user=user, project=project, cluster=cluster, name="x", gpu_count=1, submitted_at=timezone.now(),
        status=Job.Status.COMPLETED, backend_ref="200",
    )  # fmt: skip
    dump = tmp_path / "sacct.txt"
    dump.write_text(_sacct(timezone.now().replace(tzinfo=None)).replace("gres/gpu:tesla", "gres/gpu"))
    report = _run("sacct", str(dump), "--cluster", "slurm", "--default-project", "vision", "--create-users")
    assert "run by Berth itself" in report
    assert not Job.objects.filter(payload__import_key="sacct:200").exists()
    # --create-users: grace and nobody exist now, members of the default project.
    assert Membership.objects.filter(user__username="nobody", project=project).exists()


def test_trace_and_swf_imports(tmp_path: Path) -> None:
    ClusterFactory(name="demo")
    project = ProjectFactory(slug="vision")
    MembershipFactory(project=project, user__username="ada")
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,user,group,submit_time,start_time,end_time,num_gpus,gpu_type,status\n"
        "j1,,LS,0,10,610,1,,completed\nj2,,BE,5,,,1,,killed\n"
    )
    out = _run("trace", str(trace), "--cluster", "demo", "--epoch", "2026-11-01T00:00Z",
               "--default-user", "ada", "--default-project", "vision")  # fmt: skip
    assert "imported 1 job(s)" in out
    assert "never started" in out
    job = Job.objects.get(payload__import_key="trace:j1")
    assert job.started_at == datetime(2026, 11, 1, 0, 0, 10, tzinfo=UTC)
    swf = tmp_path / "log.swf"
    swf.write_text("; UnixStartTime: 1790000000\n1 0 10 3600 4 -1 -1 4 7200 -1 1 3 7 -1 1 -1 -1 -1\n")
    out = _run("swf", str(swf), "--cluster", "demo", "--map-user", "u3=ada", "--default-project", "vision")
    assert "imported 1 job(s)" in out
    assert Job.objects.get(payload__import_key="swf:1").gpu_count == 4


def test_bad_arguments_are_command_errors(tmp_path: Path) -> None:
    ClusterFactory(name="demo")
    with pytest.raises(CommandError, match="no cluster"):
        _run("sacct", "x", "--cluster", "nope")
    with pytest.raises(CommandError, match="no such file"):
        _run("sacct", str(tmp_path / "missing"), "--cluster", "demo")
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,user\n")
    with pytest.raises(CommandError, match="--epoch"):
        _run("trace", str(trace), "--cluster", "demo")
