"""Rounds against the project's real single-host Slurm while its controller is stopped and restarted.

Issue requirement: "Slurm controller stopped for a while: bookings and submissions keep working, the
cluster shows as degraded, everything reconciles when it returns, no job is lost."

A `Cluster` row with backend ``slurm`` points at ``scripts/slurm.sh``'s Slurm (n1-n2: 4x a100, n3-n4:
8x h100; slurmrestd on 127.0.0.1:46820, tokens minted with ``scontrol token``).  Rounds run on the wall
clock through `engine_round_run`, as the worker runs them; Slurm's side is read back with ``scontrol`` and
``squeue``, independently of the backend.  The run uses its own job/reservation name prefix and always
restarts the controller and cancels what it made, even when it fails.  Needs ``scripts/slurm.sh start``
and ``BERTH_SLURM=1``; skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from scheduling.backend_registry import backend_for_cluster
from scheduling.backends.base import BackendError
from scheduling.models import AuditEvent, Booking, Cluster, EngineRound, GpuType, Job
from scheduling.rounds import RoundResult, engine_round_run
from scheduling.services import booking_cancel, booking_create, job_cancel, job_submit
from tests.factories import ClusterFactory, GpuTypeFactory, NodeFactory
from tests.integration import loop
from tests.integration.loop import make_member

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True)]

SLURM_SH = Path(__file__).resolve().parents[2] / "scripts" / "slurm.sh"

# Shared fixture (assigned, not imported, so that the test argument does not shadow an import): the
# services' round trigger becomes a no-op, metrics go to a private Redis db.
engine_redis_url = loop.engine_redis_url


@pytest.fixture(autouse=True)
def _skip_without_slurm() -> None:
    if not os.environ.get("BERTH_SLURM"):
        pytest.skip(
            "needs the local Slurm: run `scripts/slurm.sh start` and set BERTH_SLURM=1 (make test does)"
        )


def _run(*argv: str, timeout_s: float = 60.0, check: bool = False) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=check).stdout


def _controller(action: str) -> None:
    subprocess.run([str(SLURM_SH), action], capture_output=True, timeout=60, check=True)


def _live_slurm_jobs(prefix: str) -> dict[str, str]:
    """Slurm job id -> name of this run's pending/running jobs (``squeue``)."""
    out = _run("squeue", "-h", "-o", "%i %j", timeout_s=30)
    return {
        parts[0]: parts[1]
        for parts in (line.split() for line in out.splitlines())
        if len(parts) == 2 and parts[1].startswith(prefix)
    }


def _reservations(prefix: str) -> list[str]:
    out = _run("scontrol", "-o", "show", "reservation", timeout_s=30)
    names = [line.split()[0].removeprefix("ReservationName=") for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def _slurm_job(ref: str) -> dict[str, str]:
    """``scontrol -o show job`` as key=value pairs."""
    out = _run("scontrol", "-o", "show", "job", ref, timeout_s=30, check=True)
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


@pytest.fixture
def slurm_cluster() -> Iterator[tuple[Cluster, str]]:
    """A Slurm cluster row mirroring slurm.sh's nodes, with this run's own name prefix; cleans up after."""
    prefix = f"berth-r{uuid.uuid4().hex[:6]}-"
    a100 = GpuTypeFactory(name="A100", memory_gib=80.0, precisions=["fp64", "tf32", "bf16", "fp16"])
    h100 = GpuTypeFactory(name="H100", memory_gib=80.0, precisions=["fp64", "tf32", "bf16", "fp16"])
    cluster = ClusterFactory(
        backend=Cluster.Backend.SLURM,
        settings={
            "job_name_prefix": prefix,
            "reservation_prefix": prefix,
            "timeout_s": 20.0,
            "policy": {"name": "berth", "grace_s": 30.0, "min_runtime_s": 60.0},
        },
    )
    for name, gpu_type, count in (("n1", a100, 4), ("n2", a100, 4), ("n3", h100, 8), ("n4", h100, 8)):
        NodeFactory(cluster=cluster, gpu_type=gpu_type, name=name, gpu_count=count)
    try:
        yield cluster, prefix
    finally:  # best effort and bounded: the controller may still be stopped by a failing test
        subprocess.run([str(SLURM_SH), "start-controller"], capture_output=True, timeout=60, check=False)
        ids = list(_live_slurm_jobs(prefix))
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
        for name in _reservations(prefix):
            subprocess.run(
                ["scontrol", "delete", f"ReservationName={name}"],
                capture_output=True,
                timeout=30,
                check=False,
            )


def _rounds_until(
    cluster: Cluster, done: Callable[[], bool], *, what: str, timeout_s: float = 90.0
) -> list[RoundResult]:
    """Run rounds (wall clock) until ``done()``; the results, for assertions."""
    results: list[RoundResult] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        results.append(engine_round_run(cluster_id=cluster.pk))
        if done():
            return results
        time.sleep(1.0)
    statuses = [(r.status, r.message[:120]) for r in results[-3:]]
    applied = [
        (r.pk, r.error[:200], (r.decisions or {}).get("apply"))
        for r in EngineRound.objects.filter(cluster=cluster).order_by("pk")
        if r.error or (r.decisions or {}).get("apply", {}).get("failed") or (r.decisions or {}).get("starts")
    ]
    last = EngineRound.objects.filter(cluster=cluster).order_by("-pk").first()
    jobs = list(
        Job.objects.filter(cluster=cluster).values_list(
            "pk", "status", "backend_ref", "pending_sentence", "status_message"
        )
    )
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}; last rounds: {statuses}; "
        f"last decisions: {last.decisions if last else None}; jobs: {jobs}; rounds with errors, "
        f"failures or starts: {applied}"
    )


def _running_everywhere(job: Job) -> bool:
    job.refresh_from_db()
    return (
        job.status == Job.Status.RUNNING
        and bool(job.backend_ref)
        and _slurm_job(job.backend_ref).get("JobState") == "RUNNING"
    )


def _wait_controller_answers(cluster: Cluster, *, timeout_s: float = 90.0) -> None:
    """slurmrestd answers through the restarted controller (a snapshot succeeds).

    Deliberately not waiting for the nodes to respond again: the first rounds then submit while
    slurmctld may still count the nodes as not responding, so Slurm queues the job but answers
    "Required node not available".  Reconcile must keep that queued Slurm job (the job submitted
    during the outage was once cancelled here); the assertions below prove it is not lost.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            backend_for_cluster(cluster).snapshot()
            return
        except BackendError as exc:
            last = str(exc)
        time.sleep(1.0)
    raise AssertionError(f"Slurm did not answer within {timeout_s} s after start-controller: {last}")


def _payload() -> dict[str, object]:
    # Sleeps in short steps so a cancel ends it at once; a finite limit in case cleanup never runs.
    return {"command": "for i in $(seq 3000); do sleep 0.2; done", "time_limit_s": 900}


def test_controller_outage_degrades_keeps_services_working_and_reconciles_without_losing_jobs(
    slurm_cluster: tuple[Cluster, str], engine_redis_url: str
) -> None:
    cluster, prefix = slurm_cluster
    user, project = make_member()
    a100 = GpuType.objects.get(name="A100")
    h100 = GpuType.objects.get(name="H100")

    first = job_submit(
        user,
        project=project,
        cluster=cluster,
        gpu_type=a100,
        name="before-outage",
        gpu_count=2,
        requested_s=600,
        payload=_payload(),
    )
    _rounds_until(
        cluster, lambda: _running_everywhere(first), what="the first job running in Berth and Slurm"
    )
    ref = first.backend_ref
    assert _slurm_job(ref)["JobName"] == f"{prefix}{first.pk}"

    stopped = False
    try:
        _controller("stop-controller")
        stopped = True

        down = engine_round_run(cluster_id=cluster.pk)

        cluster.refresh_from_db()
        first.refresh_from_db()
        assert down.status == "backend_error", down.message
        assert cluster.is_degraded
        assert cluster.status_message.startswith("backend unreachable:")
        assert EngineRound.objects.get(pk=down.round_id).error.startswith("backend unreachable:")
        # Nothing is concluded from a Slurm that cannot be read.
        assert first.status == Job.Status.RUNNING
        assert first.backend_ref == ref

        # Bookings and submissions keep working while the cluster is degraded.
        start_at = (timezone.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
        booking = booking_create(
            user,
            project=project,
            gpu_type=h100,
            gpu_count=2,
            start_at=start_at,
            end_at=start_at + timedelta(hours=1),
            cluster=cluster,
        )
        second = job_submit(
            user,
            project=project,
            cluster=cluster,
            gpu_type=a100,
            name="during-outage",
            gpu_count=1,
            requested_s=600,
            payload=_payload(),
        )
        assert booking.status == Booking.Status.CONFIRMED
        assert second.status == Job.Status.PENDING

        _controller("start-controller")
        stopped = False
        _wait_controller_answers(cluster)

        _rounds_until(
            cluster, lambda: _running_everywhere(second), what="the job submitted during the outage to start"
        )
    finally:
        if stopped:
            subprocess.run([str(SLURM_SH), "start-controller"], capture_output=True, timeout=60, check=False)

    cluster.refresh_from_db()
    first.refresh_from_db()
    second.refresh_from_db()
    booking.refresh_from_db()
    assert not cluster.is_degraded
    assert cluster.status_message == ""
    verbs = sorted(AuditEvent.objects.filter(entity_type="cluster").values_list("verb", flat=True))
    assert verbs == ["cluster.degraded", "cluster.recovered"]
    # No job lost: the first job kept running through the outage, as the same Slurm job.
    assert first.status == Job.Status.RUNNING
    assert first.backend_ref == ref
    assert first.attempt == 0
    assert _slurm_job(ref)["JobState"] == "RUNNING"
    assert not AuditEvent.objects.filter(entity_type="job", verb="job.lost").exists()
    assert second.backend_ref
    assert second.backend_ref != ref
    assert booking.status == Booking.Status.CONFIRMED
    assert set(_live_slurm_jobs(prefix)) == {ref, second.backend_ref}

    # Cancel everything through the services; the next rounds leave Slurm clean.
    job_cancel(first, user=user)
    job_cancel(second, user=user)
    booking_cancel(booking, user=user)
    _rounds_until(
        cluster,
        lambda: not _live_slurm_jobs(prefix) and not _reservations(prefix),
        what="Berth to cancel this run's jobs and release the booking's reservation on Slurm",
        timeout_s=60.0,
    )
    for ref_ in (ref, second.backend_ref):
        assert _slurm_job(ref_)["JobState"] == "CANCELLED"
