"""Small replays of the overlay paths: berth's sessions reclaim lent work, static's wide jobs."""

from __future__ import annotations

from forecasting.core.runtime import HistoryRuntimePredictor
from scheduling.engine import plan_round
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.metrics import compute_metrics
from scheduling.sim.overlays import BookingPlan, InteractiveSession, Overlay
from scheduling.sim.replay import Replay
from scheduling.sim.trace import Trace, TraceJob

HOUR = 3_600.0


def _trace(*jobs: tuple[str, float, int, float]) -> Trace:
    return Trace(
        name="tiny",
        jobs=tuple(
            TraceJob(
                id=job_id,
                user="u",
                project="p",
                submit_at=submit,
                runtime_s=runtime,
                gpu_count=gpus,
                gpu_type=None,
                requested_s=runtime,
                status="completed",
            )
            for job_id, submit, gpus, runtime in jobs
        ),
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=0.0,
    )


def _session(submit: float) -> InteractiveSession:
    return InteractiveSession(
        id="int-0", user="v", project="q", submit_at=submit, duration_s=HOUR, gpu_count=1, requested_s=HOUR
    )


def test_berth_session_on_a_full_cluster_starts_within_grace() -> None:
    trace = _trace(*((f"j{i}", 0.0, 1, 10 * HOUR) for i in range(4)))
    overlay = Overlay(
        sessions=(_session(2 * HOUR),),
        bookings=(),
        preemptible=frozenset({"j2", "j3"}),
        checkpointable=frozenset({"j3"}),
        checkpoint_interval_s=1_800.0,
    )
    replay = Replay(
        trace,
        parse_cluster_spec("4x1"),
        overlay,
        policy="berth",
        plan_fn=plan_round,
        predictor=HistoryRuntimePredictor(),
    )
    record = replay.run()
    metrics = compute_metrics(record)
    assert record.interactive_waits_s == [replay.config.grace_s]
    assert metrics["preemptions"] == 1
    # the checkpointing job is the victim: it loses at most one checkpoint interval
    assert metrics["lost_gpu_hours"] <= 0.5 + 1e-9
    assert metrics["unfinished_jobs"] == 0


def test_static_runs_a_job_wider_than_its_batch_partition() -> None:
    trace = _trace(("narrow", 0.0, 1, HOUR), ("wide", 10.0, 4, HOUR))
    overlay = Overlay(
        sessions=(_session(0.0),),
        bookings=(),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1_800.0,
    )
    replay = Replay(trace, parse_cluster_spec("4x1"), overlay, policy="static", plan_fn=plan_round)
    assert len(replay.config.interactive_partition) == 1  # batch side: 3 GPUs
    record = replay.run()
    assert compute_metrics(record)["unfinished_jobs"] == 0
    # it starts when the session and the narrow job leave both sides free
    (wide,) = [job for job in record.jobs if job.id == "wide"]
    assert wide.end_at == 2 * HOUR


def _booking(gpu_ids: tuple[int, ...]) -> BookingPlan:
    return BookingPlan(
        id="bk-0",
        user="w",
        project="q",
        created_at=0.0,
        start_at=2 * HOUR,
        end_at=3 * HOUR,
        gpu_count=1,
        use_start_at=2 * HOUR,
        use_end_at=3 * HOUR,
        gpu_ids=gpu_ids,
    )


class _BookingSpy(Replay):
    """A replay that keeps the GPUs each booking was given when it was created."""

    booked: dict[str, tuple[int, ...]]

    def _create_booking(self, plan: BookingPlan, t: float) -> None:
        super()._create_booking(plan, t)
        self.booked = {**getattr(self, "booked", {}), plan.id: self._bookings[plan.id].gpu_ids}


def test_static_books_in_its_interactive_partition() -> None:
    """static's bookings take GPUs of its partition (the engine's rule, and what the partition is
    sized for), not of the batch side the overlay's admission picked; easy keeps that pick."""
    trace = _trace(("narrow", 0.0, 1, HOUR))
    overlay = Overlay(
        sessions=(_session(0.0),),
        bookings=(_booking((0,)),),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1_800.0,
    )
    inventory = parse_cluster_spec("4x1")
    gpu_of = {node.id: node.gpu_ids for node in inventory.nodes}
    static = _BookingSpy(trace, inventory, overlay, policy="static", plan_fn=plan_round)
    partition = {gpu for node in static.config.interactive_partition for gpu in gpu_of[node]}
    assert partition
    assert 0 not in partition
    static.run()
    assert set(static.booked["bk-0"]) <= partition
    easy = _BookingSpy(trace, inventory, overlay, policy="easy", plan_fn=plan_round)
    easy.run()
    assert not set(easy.booked["bk-0"]) <= partition
