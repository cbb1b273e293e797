"""Per-round view of a snapshot: indexes and runtime estimates computed once per round.

Nothing here decides anything; it only answers "which node is GPU 17 on", "when do we expect
job X to end" and "which types may this job use" in O(1) after an O(GPUs + jobs) build.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.engine.placement import ConstraintKey, constraint_key, type_satisfies
from scheduling.engine.types import (
    Booking,
    ClusterSnapshot,
    GpuType,
    JobRequest,
    Node,
    NodeStatus,
    PolicyConfig,
    RunningJob,
)

_MIN_REMAINING_S = 1.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """Expected runtime of a job not yet started (seconds)."""

    p50_s: float
    hold_s: float  # what backfill plans with: the user's estimate (easy) or the p90 (berth)


def job_estimate(job: JobRequest, policy: PolicyConfig, *, is_predicted: bool) -> Estimate:
    """Runtime a policy plans with for a pending job.

    Baselines use the user's estimate, else the partition limit.  Berth uses the predictor's
    p50/p90, capped by the user's estimate (a wall-clock limit is an upper bound), falling
    back to the user's estimate.
    """
    requested = job.requested_s if job.requested_s and job.requested_s > 0 else policy.default_limit_s
    if not is_predicted:
        return Estimate(p50_s=requested, hold_s=requested)
    p90 = job.predicted_p90_s if job.predicted_p90_s and job.predicted_p90_s > 0 else requested
    p90 = min(p90, requested)
    p50 = job.predicted_p50_s if job.predicted_p50_s and job.predicted_p50_s > 0 else p90
    return Estimate(p50_s=min(p50, p90), hold_s=p90)


def running_ends(
    running: RunningJob, now: float, policy: PolicyConfig, *, is_predicted: bool
) -> tuple[float, float]:
    """(expected end p50, expected end used for reservations) of a running job.

    Work is never cut: a job past its estimate keeps running.  The baselines see it as
    overdue and assume it ends ``overdue_epsilon_s`` from now, as Slurm does; berth corrects
    upwards (a job that outlived its prediction is likely to run a good while longer).
    """
    estimate = job_estimate(running.job, policy, is_predicted=is_predicted)
    elapsed = max(0.0, now - running.started_at)
    if not is_predicted:
        end = running.started_at + estimate.hold_s
        if end <= now:
            end = now + policy.overdue_epsilon_s
        return end, end
    drift = policy.overrun_fraction * elapsed
    remaining_hold = max(estimate.hold_s - elapsed, drift, _MIN_REMAINING_S)
    remaining_p50 = max(estimate.p50_s - elapsed, 0.5 * drift, _MIN_REMAINING_S)
    return now + min(remaining_p50, remaining_hold), now + remaining_hold


class RoundState:
    """Read-only indexes over one snapshot for one round."""

    __slots__ = (
        "_eligible_cache",
        "end_hold",
        "end_p50",
        "gpu_node",
        "gpu_type",
        "is_predicted",
        "node_index",
        "nodes",
        "now",
        "policy",
        "running_by_gpu",
        "running_by_id",
        "snapshot",
        "type_order",
        "types",
    )

    def __init__(
        self, snapshot: ClusterSnapshot, policy: PolicyConfig, now: float, *, is_predicted: bool
    ) -> None:
        """Index the snapshot; ``is_predicted`` selects the runtime model (berth: predictions)."""
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.is_predicted = is_predicted
        self.types: dict[str, GpuType] = {t.name: t for t in snapshot.gpu_types}
        self.nodes: tuple[Node, ...] = snapshot.nodes
        self.node_index: dict[str, int] = {node.id: i for i, node in enumerate(snapshot.nodes)}
        self.gpu_node: dict[int, int] = {}
        self.gpu_type: dict[int, str] = {}
        present: list[str] = []
        for index, node in enumerate(snapshot.nodes):
            if node.gpu_type not in self.types:
                self.types[node.gpu_type] = GpuType(name=node.gpu_type)
            if node.gpu_type not in present:
                present.append(node.gpu_type)
            for gpu in node.gpu_ids:
                self.gpu_node[gpu] = index
                self.gpu_type[gpu] = node.gpu_type
        # Types in snapshot order (the baselines' order); berth re-ranks by value.
        self.type_order: tuple[str, ...] = tuple(present)
        self.running_by_gpu: dict[int, RunningJob] = {}
        self.running_by_id: dict[str, RunningJob] = {}
        self.end_p50: dict[str, float] = {}
        self.end_hold: dict[str, float] = {}
        for running in snapshot.running:
            self.running_by_id[running.job.id] = running
            for gpu in running.gpu_ids:
                self.running_by_gpu[gpu] = running
            p50, hold = running_ends(running, now, policy, is_predicted=is_predicted)
            if running.grace_until is not None:
                # being reclaimed: it is gone at the end of its grace whatever it predicted
                hold = min(hold, max(running.grace_until, now))
                p50 = min(p50, hold)
            self.end_p50[running.job.id] = p50
            self.end_hold[running.job.id] = hold
        self._eligible_cache: dict[ConstraintKey, tuple[str, ...]] = {}

    def eligible_types(self, job: JobRequest) -> tuple[str, ...]:
        """Types present in the cluster that satisfy the job, in ``type_order``."""
        key = constraint_key(job)
        cached = self._eligible_cache.get(key)
        if cached is None:
            cached = tuple(name for name in self.type_order if type_satisfies(self.types[name], key))
            self._eligible_cache[key] = cached
        return cached

    def booking_types(self, booking: Booking) -> tuple[str, ...]:
        if booking.gpu_type is None:
            return self.type_order
        return tuple(name for name in self.type_order if name == booking.gpu_type)

    def is_schedulable(self, node: Node) -> bool:
        return node.status == NodeStatus.UP

    def estimate(self, job: JobRequest) -> Estimate:
        return job_estimate(job, self.policy, is_predicted=self.is_predicted)

    def lost_work_s(self, running: RunningJob) -> float:
        """Seconds of work a preemption now would lose (since the last checkpoint)."""
        elapsed = max(0.0, self.now - running.started_at)
        job = running.job
        if job.is_checkpointable and job.checkpoint_interval_s and job.checkpoint_interval_s > 0:
            return elapsed % job.checkpoint_interval_s
        return elapsed
