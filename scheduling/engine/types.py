"""Frozen inputs and outputs of the pure scheduling core.

Every value here is immutable and slotted.  Times are float seconds on one clock chosen by
the caller (epoch seconds in the portal, trace seconds in the simulator); durations end in
``_s``.  GPUs are identified by small integers that are unique within one cluster snapshot.

This module is the contract between the engine (`plan_round`), the simulator, the backends
and the Django services.  Add fields with defaults; never change the meaning of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class NodeStatus(StrEnum):
    UP = "up"
    DRAINING = "draining"
    DOWN = "down"


class JobKind(StrEnum):
    """What a request is, which decides its class in the preemption order."""

    BATCH = "batch"
    INTERACTIVE = "interactive"  # on-demand session: wants GPUs within seconds


class IdleReason(StrEnum):
    """Exactly one reason per idle GPU-interval (DESIGN §3.5)."""

    NO_DEMAND = "no_demand"
    FRAGMENTATION = "fragmentation"
    CONSTRAINT_MISMATCH = "constraint_mismatch"
    RESERVED_UNUSED = "reserved_unused"
    QUOTA_BLOCKED = "quota_blocked"
    DRAINING = "draining"
    DOWN = "down"
    SCHEDULER_LATENCY = "scheduler_latency"
    ALLOCATED_BUT_IDLE = "allocated_but_idle"


class PendingReason(StrEnum):
    """Why a job is still waiting; each comes with a sentence and an ETA."""

    RESOURCES = "resources"  # not enough free GPUs of a fitting type right now
    PRIORITY = "priority"  # GPUs would fit but higher-priority work is ahead / reserved
    RESERVATION = "reservation"  # would collide with a booking or the top job's reservation
    FRAGMENTATION = "fragmentation"  # enough GPUs in total, but not on one node / not contiguous
    CONSTRAINT = "constraint"  # no GPU in the cluster satisfies type/memory/precision
    QUOTA = "quota"  # project at its limit and the job is not preemptible
    PREEMPTING = "preempting"  # GPUs are being reclaimed for it; starts after the grace period
    HEADROOM = "headroom"  # capacity held back for interactive demand
    BACKEND = "backend"  # the backend refused or failed to start it; retrying


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_gib: float = 80.0
    precisions: frozenset[str] = frozenset({"fp32", "tf32", "bf16", "fp16"})
    relative_speed: float = 1.0  # throughput relative to the reference type
    value: float = 1.0  # fair-share weight of one GPU-hour of this type


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    gpu_type: str
    gpu_ids: tuple[int, ...]
    status: NodeStatus = NodeStatus.UP
    domain: str = ""  # topology domain (NVLink island, rack); "" when unknown


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A batch job or an on-demand interactive session waiting for GPUs."""

    id: str
    user: str
    project: str
    gpu_count: int
    submit_at: float
    kind: JobKind = JobKind.BATCH
    gpu_type: str | None = None  # None: any type that satisfies the other constraints
    min_memory_gib: float = 0.0
    precisions: frozenset[str] = frozenset()
    requested_s: float | None = None  # the user's runtime estimate / wall-clock limit
    predicted_p50_s: float | None = None  # from the runtime predictor
    predicted_p90_s: float | None = None
    is_preemptible: bool = False  # the user allows preemption (checkpointing or restartable)
    is_checkpointable: bool = False
    checkpoint_interval_s: float | None = None
    priority: int = 0  # explicit priority class bonus; higher first
    name: str = ""
    attempt: int = 0  # how many times it was preempted and requeued
    first_submit_at: float | None = None  # original submit time, kept across requeues


@dataclass(frozen=True, slots=True)
class RunningJob:
    job: JobRequest
    gpu_ids: tuple[int, ...]
    started_at: float
    is_preemptible: bool  # runs on lent/borrowed capacity and may be reclaimed
    grace_until: float | None = None  # set once a preemption signal was sent


@dataclass(frozen=True, slots=True)
class Booking:
    """An interactive window booked now or in advance.

    ``gpu_ids`` are the concrete GPUs the portal assigned (the database guarantees they do
    not overlap other bookings); empty means the engine chooses them before the start.
    """

    id: str
    user: str
    project: str
    gpu_count: int
    start_at: float
    end_at: float
    gpu_type: str | None = None
    gpu_ids: tuple[int, ...] = ()
    is_in_use: bool = False  # the owner is actually running on it (telemetry / session open)


@dataclass(frozen=True, slots=True)
class ProjectShare:
    name: str
    weight: float = 1.0
    decayed_usage: float = 0.0  # value-weighted GPU-hours, exponentially decayed
    guaranteed: tuple[tuple[str, int], ...] = ()  # (gpu_type, GPUs) never preempted
    borrow_limit: int | None = None  # extra GPUs above guaranteed (all types), always preemptible
    # (gpu_type or "*", GPUs) a type may borrow above its guarantee (Kueue ``borrowingLimit``);
    # a type without an entry has no per-type limit (see `engine.quota`)
    borrow_limits: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    name: str = "berth"  # fifo | easy | static | berth
    grace_s: float = 30.0  # signal-to-kill time when reclaiming lent GPUs
    min_runtime_s: float = 300.0  # never preempt a job that ran less than this
    booking_lead_s: float = 0.0  # start reclaiming this long before a booking starts (+ grace)
    interactive_headroom: tuple[tuple[str, int], ...] = ()  # (gpu_type or "*", GPUs) held idle
    interactive_partition: tuple[str, ...] = ()  # node ids reserved for interactive (static)
    default_limit_s: float = 86_400.0  # runtime assumed when a job gives no estimate
    fairshare_half_life_s: float = 7 * 86_400.0
    age_weight: float = 1.0
    fairshare_weight: float = 1.0
    backfill_depth: int = 1_000  # pending jobs considered for backfill each round
    max_age_s: float = 7 * 86_400.0  # age factor saturates here (Slurm PriorityMaxAge)
    overdue_epsilon_s: float = 60.0  # a job past its estimate is assumed to end this soon (easy)
    overrun_fraction: float = 0.5  # berth: a job past its p90 is expected to run this x elapsed more
    short_job_weight: float = 1.0  # berth: priority bonus for short predicted GPU-time
    interactive_priority: float = 1_000.0  # priority bonus of on-demand interactive sessions
    # The interactive pool over time: (hour start_at, gpu_type or "*", GPUs), the forecast p95 of
    # on-demand session demand for each coming hour (ascending start_at, covering at least the
    # next 24 h).  Empty: only ``interactive_headroom`` (the level for now) is known.
    interactive_pool: tuple[tuple[float, str, int], ...] = ()
    restore_s: float = 120.0  # GPU-time each GPU loses when work resumes from a checkpoint
    # how long past its kill a claim (``ClusterSnapshot.claims``) keeps the evicted job behind
    # its claimant: the next round or two in the portal (a round every 15 s), the next event in
    # the replay
    claim_hold_s: float = 120.0
    # berth: consenting batch work that fits nowhere on its own estimate may start as a probe on
    # GPUs free for this long (its time limit lowered to it); 0: no probes
    probe_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    cluster: str
    gpu_types: tuple[GpuType, ...]
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...] = ()
    pending: tuple[JobRequest, ...] = ()
    bookings: tuple[Booking, ...] = ()  # those overlapping [now, now + horizon)
    projects: tuple[ProjectShare, ...] = ()
    gpus_in_use_idle: frozenset[int] = frozenset()  # telemetry: allocated but 0% busy
    # (claimant job id, evicted job id, planned kill): running work reclaimed for a job.  While
    # the claim lives (``PolicyConfig.claim_hold_s`` past the kill) the evicted job, requeued,
    # ranks no higher than right behind its claimant, so the GPUs freed for the claimant do not
    # go back to it (a round forgets whom the one before evicted work for).
    claims: tuple[tuple[str, str, float], ...] = ()


# ---- plan ----


@dataclass(frozen=True, slots=True)
class StartAction:
    job_id: str
    gpu_ids: tuple[int, ...]
    node_ids: tuple[str, ...]
    is_preemptible: bool  # started on lent/borrowed capacity
    expected_end_at: float
    # a probe: the run's time limit is lowered to this (Slurm ``--time-min``); consenting work
    # still running then is stopped and requeued, keeping its place (`stages.place`)
    time_limit_s: float | None = None


@dataclass(frozen=True, slots=True)
class PreemptAction:
    job_id: str
    signal_at: float  # the grace signal (SIGTERM / checkpoint request)
    kill_at: float  # requeue happens here; never before started_at + min_runtime_s
    reason: str  # human sentence: for whom and why
    for_id: str = ""  # the booking or job the GPUs are reclaimed for


@dataclass(frozen=True, slots=True)
class ReserveAction:
    """GPUs held for a future start (EASY shadow reservation or a booking)."""

    holder_id: str
    gpu_ids: tuple[int, ...]
    start_at: float
    end_at: float


@dataclass(frozen=True, slots=True)
class ReleaseAction:
    """GPUs given back early (a booking not in use, a finished reservation)."""

    holder_id: str
    gpu_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class PendingExplanation:
    job_id: str
    reason: PendingReason
    sentence: str
    eta_p50_at: float | None
    eta_p90_at: float | None


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[StartAction, ...] = ()
    preemptions: tuple[PreemptAction, ...] = ()
    reservations: tuple[ReserveAction, ...] = ()
    releases: tuple[ReleaseAction, ...] = ()
    pending: tuple[PendingExplanation, ...] = ()
    idle: tuple[tuple[int, IdleReason], ...] = ()  # (gpu_id, reason) for every idle GPU
    notes: tuple[str, ...] = field(default=())
    # The engine wants another round by this time even if nothing else happens (a booking's
    # reclaim signal is due, a reservation starts); None when no such deadline exists.
    next_round_at: float | None = None
