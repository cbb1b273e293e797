"""The replay predicts runtimes when the portal does: at submission, then every pending job
again at each hourly refresh, with what the predictor knew at that instant
(`scheduling.sim.replay_predictions`)."""

from __future__ import annotations

from scheduling.engine.types import ClusterSnapshot, JobRequest, Plan, PolicyConfig
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.overlays import OverlayConfig, build_overlay
from scheduling.sim.replay import Replay, ReplayOptions
from scheduling.sim.replay_predictions import REFRESH_OFFSET_S
from scheduling.sim.trace import Trace, TraceJob
from tests.scheduling.sim.standin import standin_plan


def _job(job_id: str, *, submit_at: float, runtime_s: float, gpus: int) -> TraceJob:
    return TraceJob(
        id=job_id,
        user="u",
        project="p",
        submit_at=submit_at,
        runtime_s=runtime_s,
        gpu_count=gpus,
        gpu_type=None,
        requested_s=50_000.0,
        status="completed",
    )


class Counting:
    """A predictor whose answer says how many finished jobs it had seen: p50 = 1,000 s + 500 s
    per job observed."""

    def __init__(self) -> None:
        self.observed = 0

    def predict(self, job: JobRequest) -> tuple[float, float]:
        p50 = 1_000.0 + 500.0 * self.observed
        return p50, 2 * p50

    def observe(self, job: JobRequest, runtime_s: float) -> None:
        self.observed += 1


def _seen_p50(options: ReplayOptions) -> dict[float, float | None]:
    """Two GPUs: A (1 GPU, ends at 2,000 s) and X (1 GPU, ends at 20,000 s) start at 0; B (both
    GPUs) waits from 10 s until X ends.  Returns B's predicted p50 in every round's snapshot."""
    trace = Trace(
        name="refresh",
        jobs=(
            _job("A", submit_at=0.0, runtime_s=2_000.0, gpus=1),
            _job("X", submit_at=0.0, runtime_s=20_000.0, gpus=1),
            _job("B", submit_at=10.0, runtime_s=100.0, gpus=2),
        ),
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=0.0,
    )
    inventory = parse_cluster_spec("2x1")
    overlay = build_overlay(
        trace, OverlayConfig(interactive_share=0.0, booking_share=0.0), inventory=inventory
    )
    seen: dict[float, float | None] = {}

    def spy(snapshot: ClusterSnapshot, *, policy: PolicyConfig, now: float) -> Plan:
        for job in snapshot.pending:
            if job.id == "B":
                seen[now] = job.predicted_p50_s
        return standin_plan(snapshot, policy=policy, now=now)

    replay = Replay(
        trace,
        inventory,
        overlay,
        policy="berth",
        plan_fn=spy,
        predictor=Counting(),
        config=PolicyConfig(name="easy"),
        options=options,
    )
    record = replay.run()
    assert {job.id for job in record.jobs if job.end_at is not None} == {"A", "X", "B"}
    return seen


def test_pending_jobs_are_predicted_again_with_what_was_known_at_the_refresh() -> None:
    seen = _seen_p50(ReplayOptions())
    # queued at 10 s with nothing finished (no round then: no GPU is free); at 2,000 s the
    # refresh of 120 s knew no finished job either (A's end at 2,000 s comes after it)
    assert seen[2_000.0] == 1_000.0
    # B starts when X ends at 20,000 s: the refresh due at 18,120 s had seen A finish, and
    # not X (which ends after that instant, though before this round)
    assert 5 * 3_600.0 + REFRESH_OFFSET_S == 18_120.0
    assert seen[20_000.0] == 1_500.0


def test_without_refreshes_a_job_keeps_its_prediction_from_submission() -> None:
    seen = _seen_p50(ReplayOptions(prediction_refresh_s=0.0))
    assert set(seen.values()) == {1_000.0}
    assert 20_000.0 in seen


def test_the_refresh_starts_no_round_by_itself() -> None:
    # B waits through five refreshes, but it is in only two rounds' snapshots: those of A's
    # and X's ends (its arrival, with no GPU free, plans nothing either)
    seen = _seen_p50(ReplayOptions())
    assert sorted(seen) == [2_000.0, 20_000.0]
