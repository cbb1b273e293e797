"""Use what you booked, read what you ran: against the project's real single-host Slurm.

A job submitted through the portal prints to stdout and stderr and exits 3; rounds on the wall clock
run it on Slurm; its owner then reads the tail and the exit code through ``/api/v1/jobs/<id>/logs/``
(the backend asks slurmrestd for the job's output path and reads the file Slurm wrote), the job page
and nobody else can.  A booking starting now gets its Slurm reservation, and the ``srun`` line Berth
shows for it really runs in that reservation, as the job user.  Needs ``scripts/slurm.sh start`` and
``BERTH_SLURM=1``; skipped otherwise.
"""

from __future__ import annotations

import shlex
import subprocess
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.models import Membership
from scheduling.models import Cluster, GpuType, Job
from scheduling.services import booking_cancel, booking_create, job_submit
from tests.factories import MembershipFactory, UserFactory
from tests.integration import loop
from tests.integration.loop import make_member
from tests.scheduling.test_rounds_slurm import _reservations, _rounds_until, slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

engine_redis_url = loop.engine_redis_url

SCRIPT = """#!/bin/bash
echo "hello from $SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"
for i in $(seq 1 400); do echo "step $i"; done
echo "something went wrong" >&2
exit 3
"""


def test_a_jobs_output_and_exit_code_are_its_owners_to_read(
    slurm_cluster: tuple[Cluster, str],  # noqa: F811
    engine_redis_url: str,
) -> None:
    cluster, _prefix = slurm_cluster
    user, project = make_member()
    manager = MembershipFactory(project=project, role=Membership.Role.MANAGER).user
    job = job_submit(
        user,
        project=project,
        cluster=cluster,
        gpu_type=GpuType.objects.get(name="A100"),
        name="printer",
        gpu_count=1,
        requested_s=300,
        payload={"script": SCRIPT, "time_limit_s": 300},
    )

    def ended() -> bool:
        job.refresh_from_db()
        return job.status in (Job.Status.FAILED, Job.Status.COMPLETED)

    _rounds_until(cluster, ended, what="the printing job to end on Slurm", timeout_s=120.0)
    assert job.status == Job.Status.FAILED
    assert job.backend_ref

    owner = APIClient()
    owner.force_authenticate(user)
    response = owner.get(f"/api/v1/jobs/{job.pk}/logs/", {"tail": 50})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["exit_code"] == 3
    assert body["status"] == "failed"
    lines = body["stdout"].splitlines()
    assert len(lines) == 50
    assert lines[-1] == "something went wrong"  # Slurm writes both streams to one file by default
    assert lines[-2] == "step 400"
    assert body["is_truncated"] is True
    assert body["source"].startswith(f"Slurm job {job.backend_ref}: ")
    assert body["source"].endswith(f"berth-{job.backend_ref}.out")
    whole = owner.get(f"/api/v1/jobs/{job.pk}/logs/", {"tail": 2000}).json()
    first = whole["stdout"].splitlines()[0]
    assert first.startswith("hello from n1 ") or first.startswith("hello from n2 ")  # an A100 node
    assert whole["is_truncated"] is False

    page = Client()
    page.force_login(user)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert "step 400" in html
    assert "something went wrong" in html

    # A project manager sees the job in lists but not its output; others do not see it at all.
    for viewer in (manager, UserFactory()):
        other = APIClient()
        other.force_authenticate(viewer)
        assert other.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
        browser = Client()
        browser.force_login(viewer)
        assert browser.get(f"/jobs/{job.pk}/").status_code == 404


def test_the_srun_line_shown_for_a_started_booking_runs_in_its_reservation(
    slurm_cluster: tuple[Cluster, str],  # noqa: F811
    engine_redis_url: str,
) -> None:
    cluster, prefix = slurm_cluster
    user, project = make_member()
    start = timezone.now().replace(microsecond=0) + timedelta(seconds=5)
    booking = booking_create(
        user,
        project=project,
        gpu_type=GpuType.objects.get(name="H100"),
        gpu_count=2,
        start_at=start,
        end_at=start + timedelta(hours=1),
        cluster=cluster,
    )
    client = APIClient()
    client.force_authenticate(user)

    def reserved_and_active() -> bool:
        booking.refresh_from_db()
        access = client.get(f"/api/v1/bookings/{booking.pk}/access/").json()
        return booking.status == "active" and access["reservation"] in _reservations(prefix)

    try:
        _rounds_until(cluster, reserved_and_active, what="the booking's reservation on Slurm", timeout_s=90.0)
        access = client.get(f"/api/v1/bookings/{booking.pk}/access/").json()
        assert access["backend"] == "slurm"
        srun = access["commands"][0]
        assert srun.startswith(f"srun --reservation={access['reservation']} ")
        assert "--gres=gpu:2" in srun
        assert srun.endswith("--pty bash")
        [node] = access["nodes"]
        assert node in ("n3", "n4")
        # The line as shown, with the interactive shell swapped for a command that reports where it ran.
        argv = [*shlex.split(srun)[:-2], "bash", "-c", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"]
        done = subprocess.run(
            ["runuser", "-u", "berth", "--", *argv], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.split()) == 2, done.stdout
        ran_on, gpus = done.stdout.split()
        assert ran_on == node
        assert len(gpus.split(",")) == 2

        page = Client()
        page.force_login(user)
        html = page.get(f"/bookings/{booking.pk}/").content.decode()
        assert access["reservation"] in html
        assert "--gres=gpu:2" in html
    finally:
        booking.refresh_from_db()
        if booking.status in ("confirmed", "active"):
            booking_cancel(booking, user=user)
