"""Per-type quota arithmetic shared by the admit stage and `startability` (Kueue semantics).

A project's quota per GPU type is a guarantee (GPUs it gets back, reclaiming from borrowers,
and that are never preempted) plus an optional borrowing limit above it
(``ProjectShare.borrow_limits``; a type not listed may borrow without a per-type limit, as a
Kueue ClusterQueue without ``borrowingLimit``).  Under a policy that enforces guarantees, work
above the guarantee starts as preemptible (borrowed capacity the owner or higher-class demand
may reclaim) whether or not its owner marked it preemptible; under every policy a project never
runs more of a type than guarantee + borrowing limit (as a Slurm QOS ``GrpTRES`` on that GPU
type would cap it).  The project-wide ``ProjectShare.borrow_limit`` stays a cap over all types.
"""

from __future__ import annotations

from scheduling.engine.types import ProjectShare


def guarantee_of(share: ProjectShare, gpu_type: str) -> int:
    """Guaranteed GPUs of a type (entries naming the type or ``"*"``)."""
    return sum(n for t, n in share.guaranteed if t in (gpu_type, "*"))


def borrow_limit_of(share: ProjectShare, gpu_type: str) -> int | None:
    """The type's borrowing limit above its guarantee; None when no entry limits it."""
    limits = [n for t, n in share.borrow_limits if t in (gpu_type, "*")]
    return sum(limits) if limits else None


def type_limit(share: ProjectShare | None, gpu_type: str) -> int | None:
    """Most GPUs of a type the project may hold at once (guarantee + borrowing limit); None:
    no per-type limit."""
    if share is None:
        return None
    borrow = borrow_limit_of(share, gpu_type)
    return None if borrow is None else guarantee_of(share, gpu_type) + borrow
