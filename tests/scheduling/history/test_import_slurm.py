"""History import from the project's real Slurm (``scripts/slurm.sh``): GRES jobs run there come back.

By default this Slurm has no slurmdbd (``AccountingStorageType=accounting_storage/none``), so
``sacct`` can only read the job-completion log (``sacct -c``), whose records carry neither GPUs
nor accounts; the dump is taken with ``scontrol show job -o`` instead (finished jobs stay for
``MinJobAge``), and ``sacct -c`` is checked to be the gap the docs describe.  With
``BERTH_SLURM_ACCOUNTING=1`` (slurmdbd on MariaDB, started by ``scripts/slurm.sh``) a real
``sacct --parsable2`` dump is imported too, and the same jobs are read straight from slurmrestd's
accounting API (``history_import slurmrestd``, ``/slurmdb/v0.0.38/jobs``).  Skipped unless
``BERTH_SLURM=1``.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from forecasting.selectors import job_engine_request, runtime_predict
from scheduling.history.parsers import parse_sacct, slurm_duration_s
from scheduling.models import Job
from tests.factories import ClusterFactory, GpuTypeFactory, MembershipFactory, NodeFactory, ProjectFactory

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

JOB_USER = os.environ.get("BERTH_SLURM_USER", "berth")


@pytest.fixture(autouse=True)
def _needs_slurm() -> None:
    if not os.environ.get("BERTH_SLURM"):
        pytest.skip("needs the local Slurm: run `scripts/slurm.sh start` and set BERTH_SLURM=1")


def _sbatch(*args: str) -> str:
    done = subprocess.run(
        ["su", JOB_USER, "-s", "/bin/sh", "-c", " ".join(["cd /tmp && sbatch --parsable", *args])],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def _finished(job_ids: list[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        out = "".join(
            subprocess.run(
                ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True
            ).stdout
            for job_id in job_ids
        )
        lines = [line for line in out.splitlines() if line.strip()]
        if all(" JobState=COMPLETED " in ln or " JobState=FAILED " in ln for ln in lines) and len(
            lines
        ) == len(job_ids):
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs did not finish: {out}")
        time.sleep(0.5)


def test_gres_jobs_run_on_slurm_are_imported_as_the_same_jobs(tmp_path: Path) -> None:
    a100, h100 = GpuTypeFactory(name="A100"), GpuTypeFactory(name="H100")
    cluster = ClusterFactory(name="slurm-import")
    NodeFactory(cluster=cluster, gpu_type=a100, name="n1", gpu_count=4)
    NodeFactory(cluster=cluster, gpu_type=h100, name="n3", gpu_count=8)
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project, user__username=JOB_USER).user
    runs = [
        _sbatch("-J", "hist-a100", "--gres=gpu:a100:2", "-t", "10", "--wrap", "'sleep 2'"),
        _sbatch("-J", "hist-a100", "--gres=gpu:a100:2", "-t", "10", "--wrap", "'sleep 3'"),
        _sbatch(
            "-J", "hist-h100", "-p", "h100", "--gres=gpu:h100:4", "-t", "5", "--wrap", "'sleep 1; exit 3'"
        ),
        _sbatch("-J", "hist-cpu", "-t", "5", "--wrap", "'sleep 1'"),
    ]
    dump = _finished(runs)
    path = tmp_path / "scontrol.txt"
    path.write_text(dump)

    out = io.StringIO()
    call_command(
        "history_import", "scontrol", str(path), "--cluster", cluster.name, "--default-project", "vision",
        "--tz", "UTC", stdout=out,
    )  # fmt: skip

    report = out.getvalue()
    assert "imported 3 job(s)" in report
    assert "no GPUs (CPU-only job)" in report
    jobs = {j.payload["import_key"]: j for j in Job.objects.filter(cluster=cluster)}
    assert sorted(jobs) == sorted(f"sacct:{i}" for i in runs[:3])
    # The same jobs as Slurm reports them: user, GPUs of the right type, state, exit code, runtime.
    for job_id, expected_type, gpus, status, exit_code in (
        (runs[0], a100, 2, Job.Status.COMPLETED, 0),
        (runs[1], a100, 2, Job.Status.COMPLETED, 0),
        (runs[2], h100, 4, Job.Status.FAILED, 3),
    ):
        job = jobs[f"sacct:{job_id}"]
        assert (job.user, job.gpu_type, job.gpu_count, job.status, job.exit_code) == (
            user, expected_type, gpus, status, exit_code
        )  # fmt: skip
        assert job.ended_at >= job.started_at
    # The runtime predictor now predicts for that user from these runs (seconds, not the 10 min limit).
    request = job_engine_request(
        job_id=-1, username=JOB_USER, project_slug="vision", name="hist-a100", gpu_count=2,
        submitted_at=timezone.now(), requested_s=600, kind="batch", gpu_type="A100",
    )  # fmt: skip
    p50, _ = runtime_predict(cluster_id=cluster.pk, requests=[request])[0]
    assert p50 < 60

    # Re-import: nothing changes.
    again = io.StringIO()
    call_command("history_import", "scontrol", str(path), "--cluster", cluster.name,
                 "--default-project", "vision", stdout=again)  # fmt: skip
    assert "imported 0 job(s)" in again.getvalue()
    assert Job.objects.filter(cluster=cluster).count() == 3

    # The gap: without slurmdbd, sacct reads only the completion log, which has no GPUs.  (With
    # slurmdbd, 22.05's `sacct -c` crashes; the accounting path is the next test.)
    if os.environ.get("BERTH_SLURM_ACCOUNTING") == "1":
        return
    sacct = subprocess.run(
        ["sacct", "-c", "--parsable2", "-j", ",".join(runs),
         "-o", "JobID,JobName,User,Account,Partition,Submit,Start,End,Timelimit,State,ExitCode,AllocTRES"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    parsed = parse_sacct(sacct)
    assert parsed.records == ()
    assert {s.reason for s in parsed.skips} == {"no GPUs (CPU-only job)"}


def _accounted(job_ids: list[str], timeout_s: float = 60) -> str:
    """``sacct --parsable2`` of ``job_ids`` once slurmdbd holds every one of them finished."""
    fields = (
        "JobID,JobName,User,Account,Partition,Submit,Start,End,Timelimit,State,ExitCode,AllocTRES,ReqTRES"
    )
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["sacct", "-a", "-X", "--parsable2", "-j", ",".join(job_ids), f"--format={fields}"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        rows = [line.split("|") for line in out.splitlines()[1:] if line.strip()]
        if len(rows) == len(job_ids) and all(
            r[9] in ("COMPLETED", "FAILED") and r[7] != "Unknown" and slurm_duration_s(r[8]) is not None
            for r in rows
        ):
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"slurmdbd did not account for the jobs: {out}")
        time.sleep(0.5)


@pytest.mark.skipif(
    os.environ.get("BERTH_SLURM_ACCOUNTING") != "1",
    reason="needs slurmdbd: BERTH_SLURM_ACCOUNTING=1 scripts/slurm.sh start (apt: slurmdbd mariadb-server)",
)
def test_a_sacct_dump_of_the_real_slurmdbd_imports_the_same_jobs(tmp_path: Path) -> None:
    """The accounting path: slurmdbd on MariaDB records the GRES jobs (AllocTRES ``gres/gpu:a100=2``);
    ``sacct --parsable2`` of them imports the same jobs, and the runtime predictor predicts for the user."""
    a100, h100 = GpuTypeFactory(name="A100"), GpuTypeFactory(name="H100")
    cluster = ClusterFactory(name="slurm-sacct")
    NodeFactory(cluster=cluster, gpu_type=a100, name="n1", gpu_count=4)
    NodeFactory(cluster=cluster, gpu_type=h100, name="n3", gpu_count=8)
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project, user__username=JOB_USER).user
    runs = [
        _sbatch("-J", "acct-a100", "--gres=gpu:a100:2", "-t", "10", "--wrap", "'sleep 2'"),
        _sbatch("-J", "acct-a100", "--gres=gpu:a100:2", "-t", "10", "--wrap", "'sleep 3'"),
        _sbatch(
            "-J", "acct-h100", "-p", "h100", "--gres=gpu:h100:4", "-t", "5", "--wrap", "'sleep 1; exit 3'"
        ),
        _sbatch("-J", "acct-cpu", "-t", "5", "--wrap", "'sleep 1'"),
    ]
    dump = _accounted(runs)
    assert "gres/gpu:a100=2" in dump  # GPUs are in the accounting, unlike sacct -c
    path = tmp_path / "sacct.txt"
    path.write_text(dump)

    out = io.StringIO()
    call_command(
        "history_import", "sacct", str(path), "--cluster", cluster.name, "--default-project", "vision",
        "--tz", "UTC", stdout=out,
    )  # fmt: skip

    report = out.getvalue()
    assert "imported 3 job(s)" in report
    assert "no GPUs (CPU-only job)" in report
    jobs = {j.payload["import_key"]: j for j in Job.objects.filter(cluster=cluster)}
    assert sorted(jobs) == sorted(f"sacct:{i}" for i in runs[:3])
    for job_id, expected_type, gpus, status, exit_code, limit_s in (
        (runs[0], a100, 2, Job.Status.COMPLETED, 0, 600),
        (runs[1], a100, 2, Job.Status.COMPLETED, 0, 600),
        (runs[2], h100, 4, Job.Status.FAILED, 3, 300),
    ):
        job = jobs[f"sacct:{job_id}"]
        assert (job.user, job.gpu_type, job.gpu_count, job.status, job.exit_code, job.requested_s) == (
            user, expected_type, gpus, status, exit_code, limit_s
        )  # fmt: skip
        assert job.ended_at >= job.started_at
    request = job_engine_request(
        job_id=-1, username=JOB_USER, project_slug="vision", name="acct-a100", gpu_count=2,
        submitted_at=timezone.now(), requested_s=600, kind="batch", gpu_type="A100",
    )  # fmt: skip
    p50, _ = runtime_predict(cluster_id=cluster.pk, requests=[request])[0]
    assert p50 < 60

    again = io.StringIO()
    call_command("history_import", "sacct", str(path), "--cluster", cluster.name,
                 "--default-project", "vision", "--tz", "UTC", stdout=again)  # fmt: skip
    assert "imported 0 job(s)" in again.getvalue()
    assert Job.objects.filter(cluster=cluster).count() == 3


_NEEDS_SLURMDBD = pytest.mark.skipif(
    os.environ.get("BERTH_SLURM_ACCOUNTING") != "1",
    reason="needs slurmdbd: BERTH_SLURM_ACCOUNTING=1 scripts/slurm.sh start (apt: slurmdbd mariadb-server)",
)
REST_URL = os.environ.get("BERTH_SLURMRESTD_URL", "http://127.0.0.1:46820")


def _association(account: str) -> None:
    """The job user gets an association with ``account`` (as on a real cluster; idempotent): without
    one slurmdbd stores the job with no user name and no account, which the accounting API then
    reports as null (``sacct`` looks the uid up itself)."""
    for args in (["add", "account", account], ["add", "user", JOB_USER, f"account={account}"]):
        subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=30, check=False)
    shown = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", f"account={account}", "format=user"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    assert JOB_USER in shown, f"sacctmgr did not create the association: {shown}"
    # slurmdbd pushes a new association to slurmctld asynchronously; a job submitted before the
    # controller has it is stored without one (user and account null in the accounting API).
    deadline = time.monotonic() + 30
    while True:
        cached = subprocess.run(
            ["scontrol", "show", "assoc_mgr", f"users={JOB_USER}", f"accounts={account}", "flags=assoc"],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout  # fmt: skip
        if f"UserName={JOB_USER}" in cached:
            return
        assert time.monotonic() < deadline, f"slurmctld never got the association: {cached}"
        time.sleep(0.2)


@_NEEDS_SLURMDBD
def test_slurmrestd_accounting_imports_the_same_jobs_as_sacct(tmp_path: Path) -> None:
    """``history_import slurmrestd``: GRES jobs run on the real Slurm are read from slurmdbd through
    slurmrestd's accounting API with JWT and come back with the same fields as the ``sacct`` path
    (user, account -> project, GPU type and count, state, exit code, limit, times); a re-import (from
    either source: one key space) changes nothing; the runtime predictor then predicts for the user."""
    _association("histlab")
    a100, h100 = GpuTypeFactory(name="A100"), GpuTypeFactory(name="H100")
    cluster = ClusterFactory(name="slurm-rest")
    NodeFactory(cluster=cluster, gpu_type=a100, name="n1", gpu_count=4)
    NodeFactory(cluster=cluster, gpu_type=h100, name="n3", gpu_count=8)
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project, user__username=JOB_USER).user
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    runs = [
        _sbatch("-J", "rest-a100", "-A", "histlab", "--gres=gpu:a100:2", "-t", "10", "--wrap", "'sleep 2'"),
        _sbatch("-J", "rest-a100", "-A", "histlab", "--gres=gpu:a100:2", "-t", "10", "--wrap", "'sleep 3'"),
        _sbatch(
            "-J",
            "rest-h100",
            "-A",
            "histlab",
            "-p",
            "h100",
            "--gres=gpu:h100:4",
            "-t",
            "5",
            "--wrap",
            "'sleep 1; exit 3'",
        ),
        _sbatch("-J", "rest-cpu", "-A", "histlab", "-t", "5", "--wrap", "'sleep 1'"),
    ]
    dump = _accounted(runs)
    assert "|histlab|" in dump

    # The whole accounting (no window): other tests' jobs come too, and are told apart by id.
    args = [
        "history_import", "slurmrestd", "--cluster", cluster.name, "--url", REST_URL,
        "--map-account", "histlab=vision",
    ]  # fmt: skip
    out = io.StringIO()
    call_command(*args, stdout=out)

    report = out.getvalue()
    jobs = {j.payload["import_key"]: j for j in Job.objects.filter(cluster=cluster)}
    assert {f"sacct:{i}" for i in runs[:3]} <= set(jobs), report
    assert f"sacct:{runs[3]}" not in jobs
    assert "no GPUs (CPU-only job)" in report
    # The same records as the sacct path gives for these jobs, field by field.
    from_sacct = {r.external_id: r for r in parse_sacct(dump).records}
    assert sorted(from_sacct) == sorted(runs[:3])
    for job_id, record in from_sacct.items():
        job = jobs[f"sacct:{job_id}"]
        assert job.user.username == record.user == JOB_USER
        assert (job.payload["source_user"], job.payload["source_account"]) == (record.user, record.account)
        assert job.project == project  # account histlab -> project vision
        assert (job.name, job.gpu_count, job.gpu_type.name.lower(), job.status.lower(), job.exit_code) == (
            record.name, record.gpu_count, record.gpu_type, record.status, record.exit_code,
        )  # fmt: skip
        assert (job.requested_s, job.submitted_at, job.started_at, job.ended_at) == (
            record.requested_s, record.submitted_at, record.started_at, record.ended_at,
        )  # fmt: skip
    assert jobs[f"sacct:{runs[2]}"].exit_code == 3  # from slurmctld: 22.05's accounting API says 0
    assert (jobs[f"sacct:{runs[0]}"].gpu_type, jobs[f"sacct:{runs[2]}"].gpu_type) == (a100, h100)
    assert jobs[f"sacct:{runs[0]}"].user == user

    request = job_engine_request(
        job_id=-1, username=JOB_USER, project_slug="vision", name="rest-a100", gpu_count=2,
        submitted_at=timezone.now(), requested_s=600, kind="batch", gpu_type="A100",
    )  # fmt: skip
    p50, _ = runtime_predict(cluster_id=cluster.pk, requests=[request])[0]
    assert p50 < 60

    count = Job.objects.filter(cluster=cluster).count()
    # The re-import gives --since as a wall time in a zone 14 h ahead of this (UTC) host, with --tz:
    # the window is sent relative to slurmrestd's own clock, so its zone does not matter.
    ahead = ZoneInfo("Pacific/Kiritimati")
    local_since = since.astimezone(ahead).replace(tzinfo=None).isoformat()
    again = io.StringIO()
    call_command(*args, "--since", local_since, "--tz", str(ahead), stdout=again)
    assert "imported 0 job(s)" in again.getvalue()
    assert "already imported" in again.getvalue()
    path = tmp_path / "sacct.txt"
    path.write_text(dump)
    via_sacct = io.StringIO()
    call_command("history_import", "sacct", str(path), "--cluster", cluster.name,
                 "--map-account", "histlab=vision", stdout=via_sacct)  # fmt: skip
    assert "imported 0 job(s)" in via_sacct.getvalue()
    assert Job.objects.filter(cluster=cluster).count() == count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_slurmrestd_unreachable_or_without_the_accounting_api_is_a_clear_error() -> None:
    """No traceback: a CommandError that names the URL, and for a slurmrestd without the dbv0.0.38
    plugin (a real one, started here without it) what to turn on."""
    cluster = ClusterFactory(name="slurm-rest-errors")
    with pytest.raises(
        CommandError,
        match=r"cannot read Slurm accounting from slurmrestd at http://127\.0\.0\.1:\d+: .*unreachable",
    ):
        call_command("history_import", "slurmrestd", "--cluster", cluster.name,
                     "--url", f"http://127.0.0.1:{_free_port()}")  # fmt: skip

    port = _free_port()
    env = {**os.environ, "SLURM_JWT": "daemon"}
    rest = subprocess.Popen(
        ["slurmrestd", "-u", "slurmrest", "-g", "slurmrest", "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38",
         f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "slurmrestd without dbv0.0.38 did not start"
                time.sleep(0.1)
        with pytest.raises(CommandError) as info:
            call_command("history_import", "slurmrestd", "--cluster", cluster.name,
                         "--url", f"http://127.0.0.1:{port}")  # fmt: skip
        message = str(info.value)
        assert (
            f"slurmrestd at http://127.0.0.1:{port} does not serve /slurmdb/v0.0.38/jobs (HTTP 404)"
            in message
        )
        assert "openapi/dbv0.0.38" in message
    finally:
        rest.terminate()
        rest.wait(timeout=10)
    with pytest.raises(CommandError, match="not a file"):
        call_command("history_import", "slurmrestd", "dump.txt", "--cluster", cluster.name)
    with pytest.raises(CommandError, match="--since 'yesterday'"):
        call_command("history_import", "slurmrestd", "--cluster", cluster.name, "--since", "yesterday")
