"""A replay trace run in the simulator on one GPU type: waits and utilization (no ORM)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WaitPoint:
    gpus: int
    nodes: int
    wait_p95_s: float
    wait_mean_s: float
    utilization: float  # useful GPU-hours / (these GPUs x the replay's span): its own capacity
    unfinished_jobs: int
    wall_s: float
    useful_gpu_hours: float = 0.0
    span_h: float = 0.0  # first arrival to last completion
    too_large_jobs: int = 0  # jobs asking for more GPUs than these nodes have: they never run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_concurrent_gpus(trace: Any) -> int:
    """Most GPUs the trace's jobs would hold at once if each started on arrival."""
    events: list[tuple[float, int]] = []
    for job in trace.jobs:
        events.append((job.submit_at, job.gpu_count))
        events.append((job.submit_at + job.runtime_s, -job.gpu_count))
    level = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        level += delta
        peak = max(peak, level)
    return peak


def wait_replay(
    trace: Any, *, gpu_type: str, nodes: int, gpus_per_node: int, policy: str = "berth", seed: int = 0
) -> WaitPoint:
    """Replay ``trace`` on ``nodes`` nodes of ``gpus_per_node`` GPUs of one type; batch waits."""
    from forecasting.core.runtime import HistoryRuntimePredictor
    from scheduling.engine import plan_round
    from scheduling.sim.inventory import parse_cluster_spec
    from scheduling.sim.metrics import compute_metrics
    from scheduling.sim.overlays import Overlay
    from scheduling.sim.replay import run_replay

    inventory = parse_cluster_spec(f"{nodes}x{gpus_per_node}:{gpu_type}")
    # The lab's own jobs only: no synthetic sessions or bookings, nothing preemptible.
    overlay = Overlay(
        sessions=(),
        bookings=(),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1800.0,
    )
    started = time.perf_counter()
    record = run_replay(
        trace,
        inventory,
        overlay,
        policy=policy,
        plan_fn=plan_round,
        predictor=HistoryRuntimePredictor(),
        seed=seed,
    )
    wall = time.perf_counter() - started
    metrics = compute_metrics(record)
    gpus = nodes * gpus_per_node
    return WaitPoint(
        gpus=gpus,
        nodes=nodes,
        wait_p95_s=float(metrics["wait_p95_s"]),
        wait_mean_s=float(metrics["wait_mean_s"]),
        utilization=float(metrics["utilization"]),
        unfinished_jobs=int(metrics["unfinished_jobs"]),
        wall_s=wall,
        useful_gpu_hours=float(metrics["useful_gpu_hours"]),
        span_h=max(record.span_end - record.span_start, 0.0) / 3600.0,
        too_large_jobs=sum(1 for job in trace.jobs if job.gpu_count > gpus),
    )


def replay_nodes(gpus: int, per_node: int) -> int:
    """Whole nodes of ``per_node`` GPUs closest to ``gpus`` (at least one): what a replay gets."""
    return max(1, round(gpus / per_node))
