"""Which events run a round in the replay: an event that cannot change anything does not
(simulator backend, real engine)."""

from __future__ import annotations

import pytest

from scheduling.engine import plan_round
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import InteractiveSession, Overlay, OverlayConfig
from scheduling.sim.replay import Replay
from scheduling.sim.trace import Trace, TraceJob


def _job(job_id: str, submit_at: float, runtime_s: float, gpus: int = 1) -> TraceJob:
    return TraceJob(
        id=job_id,
        user="u",
        project="p",
        submit_at=submit_at,
        runtime_s=runtime_s,
        gpu_count=gpus,
        gpu_type=None,
        requested_s=runtime_s,
        status="completed",
    )


def _session(session_id: str, submit_at: float, duration_s: float) -> InteractiveSession:
    return InteractiveSession(
        id=session_id,
        user="v",
        project="p",
        submit_at=submit_at,
        duration_s=duration_s,
        gpu_count=1,
        requested_s=duration_s,
    )


def _run(policy: str, jobs: tuple[TraceJob, ...], sessions: tuple[InteractiveSession, ...], spec: str):
    trace = Trace(name="tiny", jobs=jobs, skipped_no_runtime=0, skipped_no_gpus=0, week_phase_s=0.0)
    overlay = Overlay(
        sessions=sessions,
        bookings=(),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1_800.0,
        config=OverlayConfig(session_patience_s=900.0),
    )
    record = Replay(trace, parse_cluster_spec(spec), overlay, policy=policy, plan_fn=plan_round).run()
    return record, compute_metrics(record)


@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
def test_the_patience_check_of_a_session_that_started_runs_no_round(policy: str) -> None:
    # a free GPU: the session starts on arrival, so its patience check changes nothing
    record, metrics = _run(policy, (), (_session("int-0", 100.0, 600.0),), "2x1")
    assert metrics["sessions_abandoned"] == 0
    assert record.interactive_waits_s == [0.0]
    assert "abandon" not in record.extra["rounds_by_trigger"]


def test_the_patience_check_of_a_session_still_waiting_runs_a_round() -> None:
    # the only GPU runs non-preemptible work for hours: the session gives up after 900 s
    record, metrics = _run("easy", (_job("long", 0.0, 20_000.0),), (_session("int-0", 100.0, 600.0),), "1x1")
    assert metrics["sessions_abandoned"] == 1
    assert record.extra["rounds_by_trigger"]["abandon"] == 1


@pytest.mark.parametrize("policy", ["easy", "berth"])
def test_no_tick_while_every_waiting_job_is_wider_than_the_free_gpus(policy: str) -> None:
    # GPU 0 runs a long job and GPU 1 a session for 10,000 s; a 2-GPU job waits with one GPU
    # free: nothing can start before a completion, so no tick runs (a running session does
    # not keep ticks going)
    record, metrics = _run(
        policy,
        (_job("long", 0.0, 20_000.0), _job("wide", 10.0, 1_000.0, gpus=2)),
        (_session("int-0", 0.0, 10_000.0),),
        "3x1",
    )
    assert "tick" not in record.extra["rounds_by_trigger"]
    # the wide job starts at the session's end, when two GPUs are free
    wide = next(job for job in record.jobs if job.id == "wide")
    assert wide.end_at == pytest.approx(10_000.0 + 1_000.0, abs=1.0)
    assert metrics["sessions_abandoned"] == 0


def test_no_tick_under_fifo_while_the_head_job_is_blocked() -> None:
    # GPU 0 runs a long job; a 3-GPU head job waits with two GPUs free and a 1-GPU job waits
    # behind it.  Under strict arrival order nobody passes the head, so time alone starts
    # nothing: no tick runs (the old rule ticked, the small job being no wider than the free
    # GPUs), and the schedule is the one the completions alone give
    record, _ = _run(
        "fifo",
        (_job("long", 0.0, 20_000.0), _job("wide", 10.0, 1_000.0, gpus=3), _job("small", 20.0, 1_000.0)),
        (),
        "3x1",
    )
    assert "tick" not in record.extra["rounds_by_trigger"]
    ends = {job.id: job.end_at for job in record.jobs}
    assert ends["wide"] == pytest.approx(21_000.0, abs=1.0)
    assert ends["small"] == pytest.approx(22_000.0, abs=1.0)
