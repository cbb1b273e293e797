"""The Slurm backend against the project's real single-host Slurm (``scripts/slurm.sh``).

4 fake nodes: n1-n2 with 4x a100, n3-n4 with 8x h100 (GRES backed by /dev/null symlinks).  Nothing is
mocked: jobs really run as the ``berth`` user and leave evidence (node name, CUDA_VISIBLE_DEVICES, the
signals they caught) in a shared directory; state is also read back with ``scontrol``, independently of
the backend.  Each test polls with a deadline; job scripts sleep in short steps.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scheduling.backends.base import BackendError, ObservedJob, ObservedState
from scheduling.backends.slurm import SlurmBackend, SlurmConfig, run_command
from scheduling.engine import plan_round
from scheduling.engine.types import (
    ClusterSnapshot,
    GpuType,
    JobRequest,
    NodeStatus,
    Plan,
    PolicyConfig,
    PreemptAction,
    ReleaseAction,
    ReserveAction,
    RunningJob,
    StartAction,
)

from .conftest import SLURM_SH

pytestmark = pytest.mark.slurm


def wait_for(
    check: Callable[[], ObservedJob | None], *, timeout_s: float = 20.0, what: str = "condition"
) -> ObservedJob:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def job_in(backend: SlurmBackend, job_id: str, *states: ObservedState) -> Callable[[], ObservedJob | None]:
    def check() -> ObservedJob | None:
        job = next((j for j in backend.snapshot().jobs if j.job_id == job_id), None)
        return job if job is not None and job.state in states else None

    return check


def scontrol_job(ref: str) -> dict[str, str]:
    """``scontrol -d -o show job`` as key=value pairs (read independently of the backend)."""
    out = subprocess.run(
        ["scontrol", "-d", "-o", "show", "job", ref], capture_output=True, text=True, timeout=20, check=True
    ).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def evidence_script(job_dir: Path, *, seconds: int = 60) -> str:
    """A job that records where it runs and which signals it gets, then sleeps in short steps."""
    return f"""#!/bin/bash
out={job_dir}/$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}
echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES" > "$out"
trap 'echo TERM >> "$out"' TERM
for i in $(seq {seconds * 5}); do sleep 0.2; done
"""


def node_gpus(backend: SlurmBackend, node: str) -> tuple[int, ...]:
    return next(n.gpu_ids for n in backend.snapshot().nodes if n.id == node)


def start(job_id: str, gpu_ids: tuple[int, ...], node: str) -> StartAction:
    return StartAction(job_id, gpu_ids, (node,), is_preemptible=True, expected_end_at=time.time() + 60)


def test_snapshot_shows_the_four_nodes_with_their_gpus(slurm_backend: SlurmBackend) -> None:
    snap = slurm_backend.snapshot()
    assert {n.id: (n.gpu_type, len(n.gpu_ids)) for n in snap.nodes} == {
        "n1": ("a100", 4),
        "n2": ("a100", 4),
        "n3": ("h100", 8),
        "n4": ("h100", 8),
    }
    assert all(n.status is NodeStatus.UP for n in snap.nodes)
    ids = [g for n in snap.nodes for g in n.gpu_ids]
    assert len(set(ids)) == 24
    assert snap.jobs == ()  # this run's prefix: nothing of ours yet


def test_pinned_start_runs_on_the_planned_node_with_its_gres(
    slurm_backend: SlurmBackend, job_dir: Path
) -> None:
    gpus = node_gpus(slurm_backend, "n4")[:2]
    plan = Plan(starts=(start("pin", gpus, "n4"),))
    payloads = {"pin": {"script": evidence_script(job_dir), "time_limit_s": 300}}
    [result] = slurm_backend.apply(plan, payloads=payloads)
    assert result.is_ok, result.message
    job = wait_for(job_in(slurm_backend, "pin", ObservedState.RUNNING), what="pin running")
    assert job.backend_ref == result.backend_ref
    # Slurm picked 2 GPUs of n4; the snapshot reports those, as Berth ids of n4.
    assert len(job.gpu_ids) == 2
    assert set(job.gpu_ids) <= set(node_gpus(slurm_backend, "n4"))
    shown = scontrol_job(job.backend_ref)
    assert shown["NodeList"] == "n4"
    assert shown["TresPerNode"] == "gres:gpu:h100:2"
    evidence = Path(job_dir / f"{job.backend_ref}.0")
    wait_for(lambda: job if evidence.exists() and evidence.read_text().strip() else None, what="job evidence")
    node, visible = evidence.read_text().split()[:2]
    assert node == "n4"
    base = node_gpus(slurm_backend, "n4")
    assert tuple(sorted(base[int(i)] for i in visible.split(","))) == job.gpu_ids
    # Applying the same plan again is success and submits nothing new.
    [again] = slurm_backend.apply(plan, payloads=payloads)
    assert again.is_ok
    assert again.backend_ref == result.backend_ref
    assert "already" in again.message
    assert slurm_backend.cancel("pin").is_ok


def test_preempt_signals_then_requeues_and_a_new_start_releases_it(
    slurm_backend: SlurmBackend, job_dir: Path
) -> None:
    payloads = {"pre": {"script": evidence_script(job_dir), "time_limit_s": 300}}
    [started] = slurm_backend.apply(
        Plan(starts=(start("pre", node_gpus(slurm_backend, "n1")[:2], "n1"),)), payloads=payloads
    )
    assert started.is_ok, started.message
    ref = started.backend_ref
    wait_for(job_in(slurm_backend, "pre", ObservedState.RUNNING), what="pre running")
    evidence = job_dir / f"{ref}.0"
    wait_for(
        lambda: ObservedJob("pre", ObservedState.RUNNING) if evidence.exists() else None, what="evidence"
    )

    now = time.time()
    later = Plan(preemptions=(PreemptAction("pre", now + 600, now + 900, "booking"),))
    [early] = slurm_backend.apply(later)
    assert early.is_ok
    assert "due" in early.message
    assert "TERM" not in evidence.read_text()

    plan = Plan(preemptions=(PreemptAction("pre", now, now + 3.0, "booking", for_id="bk"),))
    [signalled] = slurm_backend.apply(plan)
    assert signalled.is_ok, signalled.message
    assert "SIGTERM" in signalled.message
    wait_for(lambda: ObservedJob("pre", ObservedState.RUNNING) if "TERM" in evidence.read_text() else None)
    [repeat] = slurm_backend.apply(plan)  # the next round, still inside the grace
    assert "already signalled" in repeat.message
    assert evidence.read_text().count("TERM") == 1  # signalled once, not every round
    assert next(j for j in slurm_backend.snapshot().jobs if j.job_id == "pre").state is ObservedState.RUNNING

    time.sleep(max(0.0, now + 3.0 - time.time()))
    [requeued] = slurm_backend.apply(plan)  # the round at kill_at
    assert requeued.is_ok, requeued.message
    assert "requeued" in requeued.message
    stopping = job_in(slurm_backend, "pre", ObservedState.PREEMPTED)()
    if stopping is not None and stopping.message.startswith("COMPLETING"):
        # Slurm is still killing it (KillWait): placing it now is refused, to be retried next round.
        [early_start] = slurm_backend.apply(
            Plan(starts=(start("pre", node_gpus(slurm_backend, "n3")[:1], "n3"),))
        )
        assert not early_start.is_ok
        assert "still stopping" in early_start.message

    def stopped_and_held() -> ObservedJob | None:
        job = job_in(slurm_backend, "pre", ObservedState.PREEMPTED)()
        return job if job is not None and job.message.startswith("PENDING") else None

    held = wait_for(stopped_and_held, what="pre requeued, stopped and held")
    assert held.backend_ref == ref
    assert held.gpu_ids == ()
    assert scontrol_job(ref)["Restarts"] == "1"
    [again] = slurm_backend.apply(plan)
    assert again.is_ok
    assert "already requeued" in again.message
    # Held (priority 0), not merely waiting for BeginTime: Slurm will not restart it by itself, ever.
    shown = scontrol_job(ref)
    assert shown["JobState"] == "PENDING"
    assert shown["Reason"] in {"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state"}
    assert shown["Priority"] == "0"

    # Berth places it again, elsewhere: the same Slurm job runs on n2, without the 2-minute BeginTime wait.
    [placed] = slurm_backend.apply(Plan(starts=(start("pre", node_gpus(slurm_backend, "n2")[:1], "n2"),)))
    assert placed.is_ok, placed.message
    assert placed.backend_ref == ref
    rerun = wait_for(job_in(slurm_backend, "pre", ObservedState.RUNNING), what="pre rerun")
    assert len(rerun.gpu_ids) == 1
    assert set(rerun.gpu_ids) <= set(node_gpus(slurm_backend, "n2"))
    second = job_dir / f"{ref}.1"
    wait_for(lambda: rerun if second.exists() and second.read_text().strip() else None, what="rerun evidence")
    assert second.read_text().split()[0] == "n2"

    # Preempted again (no grace left: signal and requeue in one round), then placed on another GPU
    # type: Slurm 22.05 cannot retype a pending job, so it is resubmitted under the same Berth id.
    now = time.time()
    [again_pre] = slurm_backend.apply(Plan(preemptions=(PreemptAction("pre", now, now, "reclaim"),)))
    assert "requeued" in again_pre.message
    wait_for(stopped_and_held, what="pre held again")
    [moved] = slurm_backend.apply(
        Plan(starts=(start("pre", node_gpus(slurm_backend, "n3")[:2], "n3"),)), payloads=payloads
    )
    assert moved.is_ok, moved.message
    assert moved.backend_ref != ref
    assert f"replacing requeued Slurm job {ref}" in moved.message
    on_h100 = wait_for(job_in(slurm_backend, "pre", ObservedState.RUNNING), what="pre on n3")
    assert on_h100.backend_ref == moved.backend_ref
    assert set(on_h100.gpu_ids) <= set(node_gpus(slurm_backend, "n3"))
    assert scontrol_job(ref)["JobState"] == "CANCELLED"
    assert slurm_backend.cancel("pre").is_ok


def test_cancel(slurm_backend: SlurmBackend, job_dir: Path) -> None:
    payloads = {"can": {"script": evidence_script(job_dir), "time_limit_s": 300}}
    [started] = slurm_backend.apply(
        Plan(starts=(start("can", node_gpus(slurm_backend, "n2")[:1], "n2"),)), payloads=payloads
    )
    assert started.is_ok, started.message
    wait_for(job_in(slurm_backend, "can", ObservedState.RUNNING), what="can running")
    result = slurm_backend.cancel("can")
    assert result.is_ok
    assert result.backend_ref == started.backend_ref
    job = wait_for(job_in(slurm_backend, "can", ObservedState.CANCELLED), what="can cancelled")
    assert job.ended_at is not None
    assert slurm_backend.cancel("can").is_ok  # cancelling twice is fine
    assert slurm_backend.cancel("never-submitted").is_ok


def test_preempting_a_job_that_has_not_started_holds_it(slurm_backend: SlurmBackend) -> None:
    n1 = node_gpus(slurm_backend, "n1")
    payloads = {j: {"command": "sleep 60", "time_limit_s": 300} for j in ("blocker", "waiter")}
    assert slurm_backend.apply(Plan(starts=(start("blocker", n1[:1], "n1"),)), payloads=payloads)[0].is_ok
    wait_for(job_in(slurm_backend, "blocker", ObservedState.RUNNING), what="blocker running")
    # All 4 GPUs of n1 while one is taken: Slurm keeps it pending (a plan from stale information).
    assert slurm_backend.apply(Plan(starts=(start("waiter", n1, "n1"),)), payloads=payloads)[0].is_ok
    wait_for(job_in(slurm_backend, "waiter", ObservedState.PENDING), what="waiter pending")
    now = time.time()
    [held] = slurm_backend.apply(Plan(preemptions=(PreemptAction("waiter", now, now + 30, "booking"),)))
    assert held.is_ok, held.message
    assert "held before it started" in held.message
    wait_for(job_in(slurm_backend, "waiter", ObservedState.PREEMPTED), what="waiter held")
    assert scontrol_job(held.backend_ref)["Priority"] == "0"
    slurm_backend.cancel("blocker")
    wait_for(job_in(slurm_backend, "blocker", ObservedState.CANCELLED), what="blocker gone")
    time.sleep(1.5)  # n1 is free now (Slurm schedules within a second here), and the held job stays put
    assert scontrol_job(held.backend_ref)["JobState"] == "PENDING"
    assert slurm_backend.cancel("waiter").is_ok


def test_booking_reservation_appears_lends_and_goes(
    slurm_backend: SlurmBackend, slurm_config: SlurmConfig, job_dir: Path
) -> None:
    n2 = node_gpus(slurm_backend, "n2")
    now = time.time()
    reserve = Plan(reservations=(ReserveAction("bk1", n2[:2], now + 3600, now + 7200),))
    [made] = slurm_backend.apply(reserve)
    assert made.is_ok, made.message
    name = made.backend_ref
    resv = slurm_backend.reservations()[name]
    assert resv["node_list"] == "n2"
    assert {"FLEX", "IGNORE_JOBS", "OVERLAP"} <= set(resv["flags"])
    assert abs(resv["start_time"] - (now + 3600)) < 2
    assert "already reserved" in slurm_backend.apply(reserve)[0].message
    # The booking grows onto n1 and ends later: the same reservation is updated.
    n1 = node_gpus(slurm_backend, "n1")
    grown = Plan(reservations=(ReserveAction("bk1", (*n2[:2], n1[0]), now + 3600, now + 9000),))
    [updated] = slurm_backend.apply(grown)
    assert updated.is_ok, updated.message
    assert "updated" in updated.message
    resv = slurm_backend.reservations()[name]
    assert resv["node_list"] == "n[1-2]"
    assert abs(resv["end_time"] - (now + 9000)) < 2

    # Berth lends the booked node until the booking: the job goes into the reservation and starts now.
    payloads = {"lend": {"script": evidence_script(job_dir), "time_limit_s": 600}}
    [lent] = slurm_backend.apply(Plan(starts=(start("lend", n2[2:3], "n2"),)), payloads=payloads)
    assert lent.is_ok, lent.message
    assert name in lent.message
    wait_for(job_in(slurm_backend, "lend", ObservedState.RUNNING), what="lent job running")
    assert scontrol_job(lent.backend_ref)["Reservation"] == name
    slurm_backend.cancel("lend")

    # Without the reservation Slurm would keep other users' jobs off n2: check that it does.
    other = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-w",
            "n2",
            "-t",
            "120",
            "--gres=gpu:a100:1",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout.strip()
    try:
        time.sleep(1.5)
        assert scontrol_job(other)["JobState"] == "PENDING"
    finally:
        subprocess.run(["scancel", other], timeout=20, check=False)

    [released] = slurm_backend.apply(Plan(releases=(ReleaseAction("bk1", n2[:2], "booking ended"),)))
    assert released.is_ok, released.message
    assert name not in slurm_backend.reservations()
    assert slurm_backend.apply(Plan(releases=(ReleaseAction("bk1", n2[:2], "again"),)))[0].is_ok


def test_drain_is_reported_as_draining(slurm_backend: SlurmBackend) -> None:
    subprocess.run(
        ["scontrol", "update", "nodename=n1", "state=drain", "reason=berth-test"], timeout=20, check=True
    )
    try:
        statuses = {n.id: n.status for n in slurm_backend.snapshot().nodes}
        assert statuses["n1"] is NodeStatus.DRAINING
        assert statuses["n2"] is NodeStatus.UP
    finally:
        subprocess.run(["scontrol", "update", "nodename=n1", "state=resume"], timeout=20, check=True)
    # Right after a resume slurmctld may briefly list the node as not responding until it pings it.
    deadline = time.monotonic() + 15
    while {n.id: n.status for n in slurm_backend.snapshot().nodes}["n1"] is not NodeStatus.UP:
        assert time.monotonic() < deadline, "n1 did not come back up after resume"
        time.sleep(0.3)


def test_dry_run_writes_nothing(slurm_config: SlurmConfig) -> None:
    dry = SlurmBackend(
        SlurmConfig(
            url=slurm_config.url,
            user=slurm_config.user,
            job_name_prefix=slurm_config.job_name_prefix,
            reservation_prefix=slurm_config.reservation_prefix,
            dry_run=True,
        )
    )
    gpus = node_gpus(dry, "n3")[:1]
    now = time.time()
    plan = Plan(
        starts=(start("dry", gpus, "n3"),),
        reservations=(ReserveAction("drybk", gpus, now + 600, now + 1200),),
    )
    results = dry.apply(plan, payloads={"dry": {"command": "true"}})
    assert [r.is_ok for r in results] == [True, True]
    assert all(r.message.startswith("dry-run:") for r in results)
    assert [j for j in dry.snapshot().jobs if j.job_id == "dry"] == []
    assert dry.reservations() == {}


def test_refused_start_is_a_failed_result_not_an_exception(slurm_backend: SlurmBackend) -> None:
    gpus = node_gpus(slurm_backend, "n3")[:1]
    plan = Plan(starts=(start("nopayload", gpus, "n3"), start("bad", gpus, "n3")))
    # 999 GPUs' worth of CPUs cannot exist on a node: Slurm refuses the submission itself.
    results = slurm_backend.apply(plan, payloads={"bad": {"command": "true", "cpus_per_task": 999}})
    assert [r.is_ok for r in results] == [False, False]
    assert "no payload" in results[0].message
    assert "slurm" in results[1].message


def test_token_is_renewed_before_it_expires(slurm_config: SlurmConfig) -> None:
    minted: list[str] = []
    fake_now = [time.time()]

    def counting_runner(argv: list[str] | tuple[str, ...]) -> str:
        if "token" in argv:
            minted.append(" ".join(argv))
        return run_command(argv)

    backend = SlurmBackend(slurm_config, clock=lambda: fake_now[0], runner=counting_runner)
    backend.snapshot()
    backend.snapshot()
    assert len(minted) == 1  # reused while valid
    fake_now[0] += slurm_config.token_lifespan_s - slurm_config.token_refresh_margin_s + 1
    backend.snapshot()
    assert len(minted) == 2  # renewed before expiry; the request with it succeeded


def test_controller_outage_raises_and_nothing_is_lost_after_restart(
    slurm_backend: SlurmBackend, job_dir: Path
) -> None:
    payloads = {"survivor": {"script": evidence_script(job_dir), "time_limit_s": 300}}
    [started] = slurm_backend.apply(
        Plan(starts=(start("survivor", node_gpus(slurm_backend, "n2")[:1], "n2"),)), payloads=payloads
    )
    assert started.is_ok, started.message
    before = wait_for(job_in(slurm_backend, "survivor", ObservedState.RUNNING), what="survivor running")
    subprocess.run([str(SLURM_SH), "stop-controller"], timeout=30, check=True)
    try:
        with pytest.raises(BackendError):
            slurm_backend.snapshot()
        # A plan cannot be applied either, and says so instead of pretending.
        with pytest.raises(BackendError):
            slurm_backend.apply(Plan(preemptions=(PreemptAction("survivor", 0.0, 1.0, "x"),)))
    finally:
        subprocess.run([str(SLURM_SH), "start-controller"], timeout=60, check=True)
    after = wait_for(job_in(slurm_backend, "survivor", ObservedState.RUNNING), what="survivor after restart")
    assert after.backend_ref == before.backend_ref
    assert after.started_at == before.started_at  # the same run: it kept running while slurmctld was away
    assert slurm_backend.cancel("survivor").is_ok


def test_engine_rounds_through_the_backend(slurm_backend: SlurmBackend, job_dir: Path) -> None:
    """Two engine rounds end to end on the real Slurm: snapshot -> `plan_round` -> apply -> snapshot.

    Round 1 places an a100 job and a full h100 node; round 2 sees them running (as `RunningJob`s built
    from the snapshot) and places an 8-GPU job on the other h100 node.  Slurm runs everything the engine
    placed at once: its view of free GPUs per node agrees with Berth's.
    """
    # After the outage test slurmctld may list nodes as not responding for a moment (reported down).
    deadline = time.monotonic() + 20
    observed = slurm_backend.snapshot()
    while any(n.status is not NodeStatus.UP for n in observed.nodes):
        assert time.monotonic() < deadline, f"nodes not up: {observed.nodes}"
        time.sleep(0.3)
        observed = slurm_backend.snapshot()
    gpu_types = tuple(GpuType(name=t) for t in sorted({n.gpu_type for n in observed.nodes}))
    now = time.time()
    requests = (
        JobRequest(
            id="e2e-a", user="ana", project="vision", gpu_count=2, submit_at=now - 20, gpu_type="a100"
        ),
        JobRequest(id="e2e-h", user="bo", project="nlp", gpu_count=8, submit_at=now - 10, gpu_type="h100"),
    )
    payloads = {r.id: {"script": evidence_script(job_dir), "time_limit_s": 300} for r in requests}
    snapshot = ClusterSnapshot(cluster="slurm", gpu_types=gpu_types, nodes=observed.nodes, pending=requests)
    plan = plan_round(snapshot, PolicyConfig(name="fifo"), now=now)
    assert {s.job_id for s in plan.starts} == {"e2e-a", "e2e-h"}
    assert all(r.is_ok for r in slurm_backend.apply(plan, payloads=payloads))
    running: dict[str, ObservedJob] = {}
    for start_action in plan.starts:
        job = wait_for(
            job_in(slurm_backend, start_action.job_id, ObservedState.RUNNING), what=start_action.job_id
        )
        assert scontrol_job(job.backend_ref)["NodeList"] == ",".join(start_action.node_ids)
        assert len(job.gpu_ids) == len(start_action.gpu_ids)
        running[job.job_id] = job

    full_node = next(s.node_ids[0] for s in plan.starts if s.job_id == "e2e-h")
    second = JobRequest(id="e2e-h2", user="cy", project="nlp", gpu_count=8, submit_at=now, gpu_type="h100")
    observed = slurm_backend.snapshot()
    snapshot = ClusterSnapshot(
        cluster="slurm",
        gpu_types=gpu_types,
        nodes=observed.nodes,
        running=tuple(
            RunningJob(job=r, gpu_ids=running[r.id].gpu_ids, started_at=now, is_preemptible=False)
            for r in requests
        ),
        pending=(second,),
    )
    plan2 = plan_round(snapshot, PolicyConfig(name="fifo"), now=time.time())
    [start2] = plan2.starts
    assert start2.node_ids != (full_node,)
    [result] = slurm_backend.apply(plan2, payloads={"e2e-h2": {"command": "sleep 30", "time_limit_s": 300}})
    assert result.is_ok, result.message
    job2 = wait_for(job_in(slurm_backend, "e2e-h2", ObservedState.RUNNING), what="e2e-h2 running")
    assert set(job2.gpu_ids) == set(start2.gpu_ids)  # all 8 GPUs of the node: the same ids either way
    for job_id in ("e2e-a", "e2e-h", "e2e-h2"):
        assert slurm_backend.cancel(job_id).is_ok
