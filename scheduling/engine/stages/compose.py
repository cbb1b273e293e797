"""A policy as a composition of stages, and the function that runs one round of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine.collector import collector_paused
from scheduling.engine.round import Round
from scheduling.engine.types import ClusterSnapshot, JobRequest, Plan, PolicyConfig

if TYPE_CHECKING:
    from scheduling.engine.stages.admit import Admit
    from scheduling.engine.stages.backfill import Pass
    from scheduling.engine.stages.explain import Explain
    from scheduling.engine.stages.order import Order
    from scheduling.engine.stages.place import Place
    from scheduling.engine.stages.reclaim import Reclaim
    from scheduling.engine.stages.reserve import InteractivePool, Reserve


@dataclass(frozen=True, slots=True)
class Model:
    """What a policy sees of the snapshot before any stage acts.

    ``is_predicted``: pending jobs' runtimes from the predictor (p50/p90, capped by the user's
    limit) instead of the user's limit.  ``is_running_predicted``: running jobs' expected ends
    likewise (berth plans shadow times on the users' limits, as Slurm sees them: predictions of
    running jobs are optimistic for the long tail).  ``corrects_overdue``: a job past its limit
    is expected to run on in proportion to its age (`overdue.correct_overdue`) instead of ending
    within ``overdue_epsilon_s``.  ``prefers_cheap_types``: eligible GPU types ranked by value
    (cheapest first) and the first that fits wins, keeping scarce types for jobs that need them;
    else snapshot order and the tightest fit over all types.  ``has_partition``: sessions and
    bookings only on ``PolicyConfig.interactive_partition`` nodes, batch on the others;
    ``spans_wide_jobs``: batch jobs wider than the batch side may span both (`partition`).
    """

    is_predicted: bool = False
    is_running_predicted: bool = False
    corrects_overdue: bool = False
    prefers_cheap_types: bool = False
    has_partition: bool = False
    spans_wide_jobs: bool = False


@dataclass(frozen=True, slots=True)
class Composition:
    """One policy: its model of the snapshot and its stages (see `scheduling.engine.stages`).

    ``pool`` (the interactive pool held idle but lendable) and ``reclaim`` (taking consenting
    work back) are None for policies without them.
    """

    model: Model
    admit: Admit
    order: Order
    reserve: Reserve
    backfill: Pass
    place: Place
    explain: Explain
    pool: InteractivePool | None = None
    reclaim: Reclaim | None = None


def schedule(rnd: Round) -> list[JobRequest]:
    """Run every stage but explain on a built round; returns the queue in priority order."""
    composition = rnd.composition
    if composition.reclaim is not None:
        composition.reclaim.for_bookings(rnd)
    queue, backfill_order = composition.order(rnd)
    composition.backfill.run(rnd, queue, backfill_order)
    return queue


def plan_with(composition: Composition, snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """One round of ``composition`` on ``snapshot`` at ``now``: build, schedule, explain
    (with the cyclic collector paused: `collector`)."""
    return plan_and_round(composition, snapshot, policy, now)[0]


def plan_and_round(
    composition: Composition, snapshot: ClusterSnapshot, policy: PolicyConfig, now: float
) -> tuple[Plan, Round, list[JobRequest]]:
    """`plan_with`, also giving the finished round and its queue in priority order: for a
    caller that asks what the round read (the replay's still ticks, `scheduling.sim.
    replay_still_berth`).  Nothing of the round changes once the plan is built."""
    with collector_paused():
        rnd = Round(snapshot, policy, now, composition)
        queue = schedule(rnd)
        return composition.explain(rnd, queue), rnd, queue
