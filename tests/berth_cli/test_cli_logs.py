"""``berth logs`` and ``berth booking`` against a live test server (real HTTP, real PostgreSQL).

The job runs on the simulator backend, whose output is synthetic (it runs nothing and prints what
it pretends happened); the Slurm path of the same API is tested against the real Slurm in
tests/scheduling/test_use_and_output_slurm.py."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from portal.accounts.models import Project
from scheduling.models import Cluster, Job
from scheduling.rounds import engine_round_run
from scheduling.services import booking_create
from tests.berth_cli.conftest import Berth
from tests.integration.loop import submit

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_logs_prints_the_output_tail_and_the_exit_code_note_on_stderr(
    berth: Berth, berth_as, manager: User, sim_cluster: Cluster
) -> None:
    job = json.loads(berth("submit", "-n", "2", "--json", "--", "python", "train.py").output)
    engine_round_run(cluster_id=sim_cluster.pk, now=timezone.now())
    assert Job.objects.get(pk=job["id"]).status == Job.Status.RUNNING

    result = berth("logs", str(job["id"]))
    assert result.exit_code == 0, result.output
    assert f"[berth-sim] job {job['id']}" in result.stdout
    assert "CUDA_VISIBLE_DEVICES=0,1" in result.stdout
    assert result.stderr.strip() == f"[job {job['id']} running; simulator (synthetic)]"

    as_json = json.loads(berth("logs", str(job["id"]), "--json", "--tail", "1").output)
    assert as_json["job"] == job["id"]
    assert as_json["stdout"].count("\n") == 1
    assert as_json["is_truncated"] is True
    assert berth("logs", str(job["id"]), "--tail", "0").exit_code == 2  # click refuses it

    # A project manager sees the job in the queue but not its output: exit 4, like a missing job.
    other = berth_as(manager)("logs", str(job["id"]))
    assert other.exit_code == 4
    assert "Not found" in other.output
    assert berth("logs", "999999").exit_code == 4


def test_logs_of_a_finished_job_give_its_exit_code(
    berth: Berth, member: User, project: Project, sim_cluster: Cluster
) -> None:
    now = timezone.now().replace(microsecond=0)
    job = submit(member, project, sim_cluster, gpus=1, runtime_s=60, now=now, name="quick")
    engine_round_run(cluster_id=sim_cluster.pk, now=now)
    engine_round_run(cluster_id=sim_cluster.pk, now=now + timedelta(seconds=120))
    assert Job.objects.get(pk=job.pk).status == Job.Status.COMPLETED

    result = berth("logs", str(job.pk))
    assert result.exit_code == 0, result.output
    assert "[berth-sim] done" in result.stdout
    assert result.stderr.strip() == f"[job {job.pk} completed, exit code 0; simulator (synthetic)]"
    only_err = berth("logs", str(job.pk), "--stderr")
    assert only_err.stdout == ""


def test_booking_shows_how_to_get_on_its_gpus(
    berth: Berth, member: User, project: Project, sim_cluster: Cluster
) -> None:
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=1)
    booking = booking_create(
        member,
        project=project,
        gpu_type=sim_cluster.nodes.first().gpu_type,
        gpu_count=2,
        start_at=start,
        end_at=start + timedelta(hours=1),
        cluster=sim_cluster,
    )
    engine_round_run(cluster_id=sim_cluster.pk, now=timezone.now())

    shown = berth("booking", str(booking.pk))
    assert shown.exit_code == 0, shown.output
    assert f"Booking {booking.pk} active" in shown.output
    assert "there are no real GPUs" in shown.output
    assert "pretend: ssh" in shown.output
    data = json.loads(berth("booking", str(booking.pk), "--json").output)
    assert data["id"] == booking.pk
    assert data["access"]["backend"] == "simulator"
    assert sum(len(v) for v in data["access"]["nodes"].values()) == 2
    assert berth("booking", "999999").exit_code == 4
