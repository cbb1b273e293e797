"""Whether a job can ever start under today's inventory, quotas and its preemptibility.

A job that no amount of waiting can start must not be shown an ETA: it gets a reason, a
sentence saying why, and what would unblock it (DESIGN §3.5).  The rule is a pure function of
the job, the cluster's inventory and its project's quota, so the engine's admit stage, the
portal's submit service (a 201 with a warning) and the round that stores explanations all ask
the same question and give the same answer.

A job can never start when, with every GPU of the cluster free and its project running nothing:

* no GPU type that is not down satisfies its type, memory and precision constraints with at
  least ``gpu_count`` GPUs (a job runs on one GPU type);
* its project has a total limit (guaranteed + borrowable) smaller than ``gpu_count``;
* every fitting type with enough GPUs has a per-type limit (guarantee + borrowing limit,
  `quota.type_limit`) smaller than ``gpu_count``: the job cannot run even by borrowing.

Being above its project's guarantee is not a reason: under a policy that enforces guarantees
such work starts as preemptible (borrowed capacity, reclaimable when the owning project
reclaims its guarantee or higher-class demand comes; DESIGN §3.4, Kueue's borrowing), and under
the others a guarantee limits nothing.  So the verdict is the same under every policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.engine.placement import constraint_key, type_satisfies
from scheduling.engine.quota import borrow_limit_of, guarantee_of, type_limit
from scheduling.engine.types import (
    ClusterSnapshot,
    GpuType,
    JobRequest,
    Node,
    NodeStatus,
    PendingReason,
    ProjectShare,
)

# Policies whose admit stage runs work above a project's guarantee only as preemptible.
GUARANTEE_POLICIES = frozenset({"berth"})


@dataclass(frozen=True, slots=True)
class Unstartable:
    """Why a job cannot start with what exists today, and what would change that."""

    reason: PendingReason  # CONSTRAINT (inventory) or QUOTA
    sentence: str  # "Cannot start: ..." (no ETA: waiting alone never starts it)
    unblock: str  # what the user or an admin can do

    @property
    def message(self) -> str:
        return f"{self.sentence} {self.unblock}"


def enforces_guarantees(policy_name: str) -> bool:
    """Whether a policy runs work above a project's guarantee only as preemptible."""
    return policy_name in GUARANTEE_POLICIES


def _has_quotas(share: ProjectShare | None) -> bool:
    return share is not None and (
        bool(share.guaranteed) or share.borrow_limit is not None or bool(share.borrow_limits)
    )


def type_capacity(nodes: Iterable[Node]) -> dict[str, int]:
    """GPUs per type on nodes that are not down (what `never_startable` counts)."""
    capacity: dict[str, int] = {}
    for node in nodes:
        if node.status != NodeStatus.DOWN:
            capacity[node.gpu_type] = capacity.get(node.gpu_type, 0) + len(node.gpu_ids)
    return capacity


def never_startable(
    job: JobRequest,
    *,
    gpu_types: Iterable[GpuType],
    nodes: Iterable[Node],
    share: ProjectShare | None,
    is_guarantee_enforced: bool,
    capacity_by_type: Mapping[str, int] | None = None,
) -> Unstartable | None:
    """`Unstartable` when ``job`` can never start on this inventory under this quota, else None.

    ``share`` is the job's project (None: no quotas known).  ``is_guarantee_enforced`` (the
    policy runs work above a guarantee only as preemptible, `enforces_guarantees`) does not
    change the verdict: such work borrows instead of waiting (see the module docstring); it
    stays in the signature so every caller states the policy it asks for.
    ``capacity_by_type``: `type_capacity` of ``nodes`` when the caller has it (a round asks
    for many jobs on one inventory), else it is counted here.
    """
    del is_guarantee_enforced
    key = constraint_key(job)
    fitting = [t.name for t in gpu_types if type_satisfies(t, key)]
    totals = type_capacity(nodes) if capacity_by_type is None else capacity_by_type
    capacity: dict[str, int] = {name: totals.get(name, 0) for name in fitting}
    count = job.gpu_count
    largest = max(capacity.values(), default=0)
    if largest < count:
        if not fitting or largest == 0:
            what = "no GPU in the cluster satisfies its constraints"
            if job.gpu_type is not None:
                what = f"the cluster has no usable {job.gpu_type} GPU"
            return Unstartable(
                PendingReason.CONSTRAINT,
                f"Cannot start: {what}.",
                "Allow another GPU type or less memory, or ask an admin about the missing GPUs.",
            )
        return Unstartable(
            PendingReason.CONSTRAINT,
            f"Cannot start: it needs {count} GPUs of one type and the most any fitting type has "
            f"(nodes not down) is {largest}.",
            f"Ask for at most {largest} GPUs, allow other GPU types, or ask an admin.",
        )
    if not _has_quotas(share):
        return None
    assert share is not None
    if share.borrow_limit is not None:
        limit = sum(n for _t, n in share.guaranteed) + share.borrow_limit
        if count > limit:
            return Unstartable(
                PendingReason.QUOTA,
                f"Cannot start: project {share.name} may use at most {limit} GPUs at once "
                f"(guaranteed + borrowable) and this job needs {count}.",
                f"Ask for at most {limit} GPUs or ask an admin to raise the project's guarantee "
                "or borrowing limit.",
            )
    usable = [t for t in fitting if capacity[t] >= count]
    limits = {t: type_limit(share, t) for t in usable}
    if usable and all(limit is not None and limit < count for limit in limits.values()):
        name = max(usable, key=lambda t: (limits[t] or 0, t))
        guaranteed = guarantee_of(share, name)
        borrow = borrow_limit_of(share, name) or 0
        most = guaranteed + borrow
        if most == 0:  # "ask for at most 0 GPUs" is no advice
            return Unstartable(
                PendingReason.QUOTA,
                f"Cannot start: project {share.name} is guaranteed 0 {name} GPUs and its borrowing "
                f"limit for them is 0, so it can run no {name} job (this one needs {count}).",
                f"Allow another GPU type, or ask an admin for a {name} guarantee or borrowing limit "
                "for the project.",
            )
        return Unstartable(
            PendingReason.QUOTA,
            f"Cannot start: project {share.name} is guaranteed {guaranteed} {name} GPUs and may "
            f"borrow {borrow} more, so it may run at most {most} at once, and this job needs {count}.",
            f"Ask for at most {most} GPUs, allow another GPU type, or ask an admin "
            "to raise the project's guarantee or borrowing limit.",
        )
    return None


def unstartable_jobs(
    snapshot: ClusterSnapshot, jobs: Iterable[JobRequest], *, is_guarantee_enforced: bool
) -> dict[str, Unstartable]:
    """`never_startable` for each of ``jobs`` on ``snapshot``'s inventory and projects; only the
    jobs that can never start are in the result (keyed by job id)."""
    shares: Mapping[str, ProjectShare] = {share.name: share for share in snapshot.projects}
    out: dict[str, Unstartable] = {}
    for job in jobs:
        verdict = never_startable(
            job,
            gpu_types=snapshot.gpu_types,
            nodes=snapshot.nodes,
            share=shares.get(job.project),
            is_guarantee_enforced=is_guarantee_enforced,
        )
        if verdict is not None:
            out[job.id] = verdict
    return out
