"""Per-round view of a snapshot: indexes and runtime estimates computed once per round.

Nothing here decides anything; it only answers "which node is GPU 17 on", "when do we expect
job X to end" and "which types may this job use" in O(1) after an O(GPUs + jobs) build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:  # preemption imports this module
    from scheduling.engine.preemption import Victim, _FloorIndex

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


# (is_predicted, default limit, requested, p50, p90) -> its `job_estimate`: jobs repeat a few
# runtime figures and come back round after round, and an `Estimate` is immutable
_ESTIMATES: dict[tuple[bool, float, float | None, float | None, float | None], Estimate] = {}
_ESTIMATES_MAX = 1 << 16
_ESTIMATES_BY_JOB: dict[tuple[bool, float], dict[str, tuple[JobRequest, Estimate]]] = {}


def cached_estimate(job: JobRequest, policy: PolicyConfig, *, is_predicted: bool) -> Estimate:
    """`job_estimate`, memoised on the figures it reads (the same value, computed once)."""
    key = (is_predicted, policy.default_limit_s, job.requested_s, job.predicted_p50_s, job.predicted_p90_s)
    found = _ESTIMATES.get(key)
    if found is None:
        if len(_ESTIMATES) >= _ESTIMATES_MAX:
            _ESTIMATES.clear()
        found = _ESTIMATES[key] = job_estimate(job, policy, is_predicted=is_predicted)
    return found


def estimates_by_job(policy: PolicyConfig, *, is_predicted: bool) -> dict[str, tuple[JobRequest, Estimate]]:
    """Job id -> (the job, its `job_estimate`), kept across rounds of one runtime model: a job
    (immutable) that comes back as the very same object has the same estimate."""
    key = (is_predicted, policy.default_limit_s)
    estimates = _ESTIMATES_BY_JOB.get(key)
    if estimates is None or len(estimates) >= _ESTIMATES_MAX:
        estimates = _ESTIMATES_BY_JOB[key] = {}
    return estimates


def estimate_of(
    job: JobRequest,
    estimates: dict[str, tuple[JobRequest, Estimate]],
    policy: PolicyConfig,
    *,
    is_predicted: bool,
) -> Estimate:
    """`job_estimate` through ``estimates`` (`estimates_by_job` of the same model)."""
    entry = estimates.get(job.id)
    if entry is not None and entry[0] is job:
        return entry[1]
    found = cached_estimate(job, policy, is_predicted=is_predicted)
    estimates[job.id] = (job, found)
    return found


def running_ends(
    running: RunningJob, now: float, policy: PolicyConfig, *, is_predicted: bool
) -> tuple[float, float]:
    """(expected end p50, expected end used for reservations) of a running job.

    Work is never cut: a job past its estimate keeps running.  The baselines see it as
    overdue and assume it ends ``overdue_epsilon_s`` from now, as Slurm does; berth corrects
    upwards (a job that outlived its prediction is likely to run a good while longer).
    """
    return running_ends_from(
        running, now, policy, is_predicted, estimates_by_job(policy, is_predicted=is_predicted)
    )


def running_ends_from(
    running: RunningJob,
    now: float,
    policy: PolicyConfig,
    is_predicted: bool,
    estimates: dict[str, tuple[JobRequest, Estimate]],
) -> tuple[float, float]:
    """`running_ends` with the model's `estimates_by_job` looked up once by the caller."""
    job = running.job
    entry = estimates.get(job.id)
    if entry is not None and entry[0] is job:
        estimate = entry[1]
    else:
        estimate = estimate_of(job, estimates, policy, is_predicted=is_predicted)
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


class Topology:
    """Indexes that depend only on the node and type tuples of a snapshot.

    Callers pass the same (immutable) node tuple round after round, so `topology_of` keeps the
    last few by identity: the result is exactly what a fresh build would give, only cheaper.
    """

    __slots__ = (
        "all_gpus",
        "by_type",
        "derived",
        "eligible_cache",
        "gpu_node",
        "gpu_type",
        "max_size",
        "node_index",
        "node_types",
        "nodes",
        "schedulable",
        "type_order",
        "types",
        "up_gpus",
    )

    def __init__(self, nodes: tuple[Node, ...], gpu_types: tuple[GpuType, ...]) -> None:
        """Build every node/GPU index for one inventory."""
        self.nodes = nodes
        self.types: dict[str, GpuType] = {t.name: t for t in gpu_types}
        self.node_index: dict[str, int] = {node.id: i for i, node in enumerate(nodes)}
        self.gpu_node: dict[int, int] = {}
        self.gpu_type: dict[int, str] = {}
        self.max_size: dict[str, int] = {}
        self.by_type: dict[str, list[int]] = {}  # GPUs of schedulable nodes, per type
        present: list[str] = []
        for index, node in enumerate(nodes):
            name = node.gpu_type
            if name not in self.types:
                self.types[name] = GpuType(name=name)
            if name not in present:
                present.append(name)
            self.max_size[name] = max(self.max_size.get(name, 0), len(node.gpu_ids))
            for gpu in node.gpu_ids:
                self.gpu_node[gpu] = index
                self.gpu_type[gpu] = name
            if node.status == NodeStatus.UP:
                self.by_type.setdefault(name, []).extend(node.gpu_ids)
        # Types in snapshot order (the baselines' order); berth re-ranks by value.
        self.type_order: tuple[str, ...] = tuple(present)
        self.schedulable: list[int] = [i for i, node in enumerate(nodes) if node.status == NodeStatus.UP]
        self.up_gpus: frozenset[int] = frozenset(g for gpus in self.by_type.values() for g in gpus)
        self.all_gpus: tuple[int, ...] = tuple(g for node in nodes for g in node.gpu_ids)
        self.node_types: list[str] = [node.gpu_type for node in nodes]
        self.eligible_cache: dict[ConstraintKey, tuple[str, ...]] = {}
        # anything else derived from the nodes alone that callers want to keep across rounds
        # (key: a tuple starting with the caller's name); bounded by what callers ask for
        self.derived: dict[tuple[Any, ...], Any] = {}


_TOPOLOGIES: list[Topology] = []
_TOPOLOGY_CACHE_SIZE = 8


def topology_of(snapshot: ClusterSnapshot) -> Topology:
    """The `Topology` of a snapshot, reused when the very same node tuple comes back."""
    for topology in _TOPOLOGIES:
        if topology.nodes is snapshot.nodes and tuple(topology.types.values())[: len(snapshot.gpu_types)] == (
            snapshot.gpu_types
        ):
            return topology
    topology = Topology(snapshot.nodes, snapshot.gpu_types)
    _TOPOLOGIES.insert(0, topology)
    del _TOPOLOGIES[_TOPOLOGY_CACHE_SIZE:]
    return topology


class RoundState:
    """Read-only indexes over one snapshot for one round."""

    __slots__ = (
        "_eligible_cache",
        "_estimates",
        "end_hold",
        "end_p50",
        "floor_orders",
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
        "takeable_by_node",
        "takeable_gpus_by_node",
        "takeable_on_nodes",
        "topology",
        "type_order",
        "types",
        "victims_by_node",
        "victims_floor_by_node",
    )

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        policy: PolicyConfig,
        now: float,
        *,
        is_predicted: bool,
        is_running_predicted: bool | None = None,
    ) -> None:
        """Index the snapshot; ``is_predicted`` selects the runtime model of pending jobs (berth:
        predictions), ``is_running_predicted`` that of running jobs (default: the same)."""
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.is_predicted = is_predicted
        running_model = is_predicted if is_running_predicted is None else is_running_predicted
        self.topology = topology = topology_of(snapshot)
        self.types = topology.types
        self.nodes: tuple[Node, ...] = snapshot.nodes
        self.node_index = topology.node_index
        self.gpu_node = topology.gpu_node
        self.gpu_type = topology.gpu_type
        self.type_order = topology.type_order
        self.running_by_gpu: dict[int, RunningJob] = {}
        self.running_by_id: dict[str, RunningJob] = {}
        self.end_p50: dict[str, float] = {}
        self.end_hold: dict[str, float] = {}
        running_by_id, running_by_gpu = self.running_by_id, self.running_by_gpu
        end_p50, end_hold = self.end_p50, self.end_hold
        running_estimates = estimates_by_job(policy, is_predicted=running_model)
        for running in snapshot.running:
            job_id = running.job.id
            running_by_id[job_id] = running
            for gpu in running.gpu_ids:
                running_by_gpu[gpu] = running
            p50, hold = running_ends_from(running, now, policy, running_model, running_estimates)
            if running.grace_until is not None:
                # being reclaimed: it is gone at the end of its grace whatever it predicted
                hold = min(hold, max(running.grace_until, now))
                p50 = min(p50, hold)
            end_p50[job_id] = p50
            end_hold[job_id] = hold
        self._eligible_cache = topology.eligible_cache
        self._estimates = estimates_by_job(policy, is_predicted=is_predicted)
        # node index -> its running work a demand may ever take (`preemption.takeable_on`)
        self.takeable_by_node: dict[int, tuple[RunningJob, ...]] = {}
        # node index -> GPUs on it of that work (`preemption._takeable_gpus`)
        self.takeable_gpus_by_node: dict[int, int] = {}
        # node indexes -> that work with a GPU on any of them (`preemption.takeable_on_nodes`)
        self.takeable_on_nodes: dict[tuple[int, ...], tuple[RunningJob, ...]] = {}
        # (node index, high class) -> that work as victims in victim order, with the GPUs each
        # frees on the node (`preemption._node_victims`)
        self.victims_by_node: dict[tuple[int, bool], tuple[tuple[Victim, tuple[int, ...]], ...]] = {}
        # (node index, high class) -> a lower bound of a reclaim's cost there (`preemption._victims_floor`)
        self.victims_floor_by_node: dict[tuple[int, bool], tuple[float, float, int]] = {}
        # (high class, node indexes) -> those nodes by a lower bound of a reclaim's cost there
        # (`preemption._FloorIndex`)
        self.floor_orders: dict[tuple[bool, tuple[int, ...]], _FloorIndex] = {}

    def eligible_types(self, job: JobRequest) -> tuple[str, ...]:
        """Types present in the cluster that satisfy the job, in ``type_order``."""
        if job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
            return self.type_order  # the common unconstrained job
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

    def estimate(self, job: JobRequest) -> Estimate:
        """The policy's runtime estimate of a pending job (cached for the round)."""
        entry = self._estimates.get(job.id)
        if entry is not None and entry[0] is job:
            return entry[1]
        return estimate_of(job, self._estimates, self.policy, is_predicted=self.is_predicted)

    def lost_work_s(self, running: RunningJob) -> float:
        """Seconds of work (per GPU) a preemption now would lose: for checkpointing work the
        work since the last checkpoint plus ``restore_s`` to resume (never more than all of it
        plus the restore); for restartable work everything it did."""
        elapsed = max(0.0, self.now - running.started_at)
        job = running.job
        if job.is_checkpointable:
            interval = job.checkpoint_interval_s
            since = elapsed % interval if interval and interval > 0 else elapsed
            return since + self.policy.restore_s
        return elapsed
