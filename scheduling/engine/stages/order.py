"""Order: the queue in priority order, and the order backfill candidates are taken in.

* `ArrivalOrder` (fifo): submit order (requeues keep their age), ties by id;
* `MultifactorOrder` (easy, static): Slurm-style age + fair share + class (`priority`);
* `SlowdownFirst` (berth): sessions, classes, starved jobs, then expected slowdown x fair
  share, a job evicted for another no higher than behind it while the claim lives; backfill
  candidates shortest predicted GPU-time first (`priority.slowdown_orders`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from scheduling.engine.priority import (
    SlowdownOrder,
    fifo_order,
    live_claims,
    priority_order,
    slowdown_orders,
)
from scheduling.engine.types import JobKind, JobRequest

if TYPE_CHECKING:
    from scheduling.engine.round import Round

Orders = tuple[list[JobRequest], list[JobRequest] | None]


class Order(Protocol):
    """(priority order, backfill order or None for the same order) of a round's pending jobs."""

    def __call__(self, rnd: Round) -> Orders: ...


@dataclass(frozen=True, slots=True)
class ArrivalOrder:
    """Strict arrival order."""

    def __call__(self, rnd: Round) -> Orders:
        """The pending jobs by first submit time, then id."""
        return fifo_order(rnd.state.snapshot.pending), None


@dataclass(frozen=True, slots=True)
class MultifactorOrder:
    """Multifactor priority, highest first (`priority.priority_scores`)."""

    def __call__(self, rnd: Round) -> Orders:
        """The pending jobs by score, then first submit time, then id."""
        return priority_order(rnd.state), None


@dataclass(frozen=True, slots=True)
class SlowdownFirst:
    """Berth's expected-slowdown order with its parameters (`priority.SlowdownOrder`)."""

    params: SlowdownOrder = field(default_factory=SlowdownOrder)

    def __call__(self, rnd: Round) -> Orders:
        """(priority order, backfill order) from `priority.slowdown_orders`: starved jobs within
        their project's guarantee (`Round.is_within_guarantee`) before the other starved, a job
        evicted for a live claim no higher than behind its claimant (`priority.live_claims`)."""
        state = rnd.state
        claims = live_claims(state.snapshot, state.policy.claim_hold_s, state.now)
        return slowdown_orders(state, self.params, guarantee_test(rnd), claims)


def guarantee_test(rnd: Round) -> Callable[[JobRequest], bool]:
    """Whether a batch job runs within its project's guarantee (`Round.is_within_guarantee`),
    as berth's order asks it of starved jobs, before anything has started this round."""
    shares = rnd.shares
    # nothing has started yet when the order is made, so the answer reads only the job's
    # project, size and type constraints: asked once per such shape (on a long-starved
    # queue most of the queue is starved, every round)
    answers: dict[tuple[str, int, str | None, float, frozenset[str]], bool] = {}
    # project -> the most guaranteed GPUs left on any type (`_most_left`): a job wider than
    # that is within its guarantee on none of its types, whatever they are
    most_left: dict[str, float] = {}

    def is_guaranteed(job: JobRequest) -> bool:  # asked of starved jobs only
        project = job.project
        if job.kind != JobKind.BATCH or project not in shares:
            return False
        left = most_left.get(project)
        if left is None:
            left = most_left[project] = _most_left(rnd, project)
        if job.gpu_count > left:
            return False
        shape = (project, job.gpu_count, job.gpu_type, job.min_memory_gib, job.precisions)
        answer = answers.get(shape)
        if answer is None:
            answer = answers[shape] = rnd.is_within_guarantee(job, rnd.types_for(job))
        return answer

    return is_guaranteed


def _most_left(rnd: Round, project: str) -> float:
    """The most guaranteed GPUs a project has left on any GPU type of the inventory
    (`Round.guarantee_left`; -inf without quotas): `Round.is_within_guarantee` is False for a
    job wider than that, since its types are some of those."""
    lefts = [left for name in rnd.state.type_order if (left := rnd.guarantee_left(project, name)) is not None]
    return max(lefts, default=-math.inf)
