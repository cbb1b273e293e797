"""The per-round inputs and queue orders give what the long way gives (docs/benchmarks.md, Speed X).

* `fairshare.fairshare_factors` builds its name -> weight and name -> usage maps in C and skips
  the ``max(x, 0.0)`` pass when no value is below 0: the factors of the comprehension it was;
* `inputs.ShareBuilder` fills a `ProjectShare`'s slots through a writable twin class: the same
  object as the dataclass' own constructor, still frozen;
* `priority._priority_order` sorts the jobs by first submit and id, then stably by -score alone,
  and takes the saturated jobs' scores per project: the order of the scores' tuples;
* `priority.slowdown_orders` keeps each job's time-free key parts across rounds, by job object:
  a job that comes back changed (same id, new object) gets new parts.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from scheduling import inputs
from scheduling.engine import priority
from scheduling.engine.cluster import RoundState
from scheduling.engine.fairshare import fairshare_factors
from scheduling.engine.priority import SlowdownOrder, _ordered, priority_order, slowdown_orders
from scheduling.engine.types import JobKind, JobRequest, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot
from tests.scheduling.engine.test_long_queue_shortcuts import _reference_scores

NOW = 2_000_000.0
WEEK_S = 604_800.0


def _factors_the_long_way(state: RoundState) -> dict[str, float]:
    """`fairshare_factors` (queued only) as it was written before: comprehensions, ``max``."""
    snap = state.snapshot
    weights = {share.name: max(share.weight, 0.0) for share in snap.projects}
    usage = {share.name: max(share.decayed_usage, 0.0) for share in snap.projects}
    queued = dict.fromkeys([j.project for j in snap.pending])
    for project in queued:
        weights.setdefault(project, 1.0)
        usage.setdefault(project, 0.0)
    for run in snap.running:
        weights.setdefault(run.job.project, 1.0)
        usage[run.job.project] = usage.get(run.job.project, 0.0) + float(len(run.gpu_ids))
    total_usage, total_weight = sum(usage.values()), sum(weights.values())
    if total_usage <= 0:
        return dict.fromkeys(queued, 1.0)
    out = {}
    for project in queued:
        share = weights[project] / total_weight if total_weight > 0 else 0.0
        used = usage.get(project, 0.0) / total_usage
        out[project] = (0.0 if used > 0 else 1.0) if share <= 0 else math.pow(2.0, -used / share)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_fairshare_factors_equal_the_comprehensions_with_odd_values(seed: int) -> None:
    """Negative, NaN (first or after a negative), -0.0 and repeated names among the shares."""
    rng = random.Random(seed)
    odd = (-1.0, math.nan, -0.0, 0.0, 3.5, 1e-300, 7.0)
    projects = [
        ProjectShare(name=rng.choice("abcde"), weight=rng.choice(odd), decayed_usage=rng.choice(odd))
        for _ in range(rng.randint(0, 6))
    ]
    pending = [job(f"p{i}", 1, project=rng.choice("abcdef")) for i in range(5)]
    busy = [running(job("r", 2, project=rng.choice("abz")), (0, 1), started_at=NOW - 60.0)]
    snap = snapshot(make_nodes(2, 2), pending=pending, running_jobs=busy, projects=tuple(projects))
    state = RoundState(snap, PolicyConfig(name="easy"), NOW, is_predicted=False)
    got = fairshare_factors(snap, state.types, state.gpu_type, queued_only=True)
    want = _factors_the_long_way(state)
    assert list(got) == list(want)
    # NaN factors compare as NaN; the rest exactly (the same float, not merely close)
    assert [(math.isnan(v), v if not math.isnan(v) else 0.0) for v in got.values()] == [
        (math.isnan(v), v if not math.isnan(v) else 0.0) for v in want.values()
    ]


def test_share_builder_gives_frozen_shares_equal_to_the_dataclass() -> None:
    specs = [
        inputs.ProjectSpec(name="b", weight=2.0, guaranteed=(("A100", 3),), borrow_limit=4),
        inputs.ProjectSpec(name="a", borrow_limits=(("*", 1),)),
    ]
    builder = inputs.ShareBuilder(specs)
    first = builder.shares({"a": 1.5})
    assert first == (
        ProjectShare(name="a", decayed_usage=1.5, borrow_limits=(("*", 1),)),
        ProjectShare(name="b", weight=2.0, decayed_usage=0.0, guaranteed=(("A100", 3),), borrow_limit=4),
    )
    assert all(type(share) is ProjectShare for share in first)
    assert hash(first[0]) == hash(ProjectShare(name="a", decayed_usage=1.5, borrow_limits=(("*", 1),)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].decayed_usage = 2.0  # type: ignore[misc]  # frozen: what the test checks
    again = builder.shares({"a": 2.5, "b": 0.0})
    assert again[0].decayed_usage == 2.5  # a changed usage: a new share
    assert again[1] is first[1]  # the same value: the same share


def _queue(rng: random.Random, count: int, *, classes: bool) -> list[JobRequest]:
    """Jobs of a few projects, many of them waiting past ``max_age_s`` (saturated), ties in
    first submit, and (``classes``) sessions and priority classes among the old ones."""
    submits = (NOW - 3 * WEEK_S, NOW - WEEK_S, NOW - WEEK_S + 1.0, NOW - 10.0, NOW + 50.0)
    return [
        job(
            f"j{rng.randint(0, 99)}-{i}",
            1,
            submit_at=NOW,
            first_submit_at=rng.choice((*submits, rng.uniform(NOW - 2 * WEEK_S, NOW))),
            project=rng.choice(("zero", "capped", "busy", "unknown")),
            kind=JobKind.INTERACTIVE if classes and rng.random() < 0.1 else JobKind.BATCH,
            priority=rng.choice((0, 0, 0, 1)) if classes else 0,
        )
        for i in range(count)
    ]


_PROJECTS = (
    ProjectShare(name="zero", decayed_usage=5.0),
    ProjectShare(name="capped", decayed_usage=1.0, weight=3.0),
    ProjectShare(name="busy", decayed_usage=50.0),
)


@pytest.mark.parametrize("classes", [False, True])
@pytest.mark.parametrize("seed", range(15))
def test_priority_order_equals_the_sort_of_the_score_tuples(seed: int, classes: bool) -> None:
    rng = random.Random(seed)
    pending = _queue(rng, 300, classes=classes)
    policy = PolicyConfig(name="easy", age_weight=rng.choice((1.0, 0.0, -1.0, 3.0)))
    for now in (NOW, NOW + 3_600.0):
        snap = snapshot(make_nodes(2, 2), pending=pending, projects=_PROJECTS)
        state = RoundState(snap, policy, now, is_predicted=False)
        assert priority_order(state) == _ordered(snap.pending, _reference_scores(state))


def test_priority_order_reads_the_jobs_given_not_the_last_ones_alike() -> None:
    """The by-submit order kept for the very same jobs is not reused for equal new objects
    or for the same jobs in other places: the order holds the jobs given."""
    pending = [job(f"j{i}", 1, first_submit_at=NOW - i * 1_000.0, submit_at=NOW) for i in range(6)]
    policy = PolicyConfig(name="easy")
    first = priority_order(
        RoundState(snapshot(make_nodes(1, 1), pending=pending), policy, NOW, is_predicted=False)
    )
    copies = [dataclasses.replace(j) for j in pending]
    snap = snapshot(make_nodes(1, 1), pending=copies)
    second = priority_order(RoundState(snap, policy, NOW, is_predicted=False))
    assert second == first
    assert all(any(got is c for c in copies) for got in second)
    # the same objects, another place each, and one replaced by a younger job with its id
    moved = [*copies[1:], dataclasses.replace(copies[0], first_submit_at=NOW)]
    snap = snapshot(make_nodes(1, 1), pending=moved)
    third = priority_order(RoundState(snap, policy, NOW, is_predicted=False))
    assert third == _ordered(
        snap.pending, _reference_scores(RoundState(snap, policy, NOW, is_predicted=False))
    )
    assert third[-1] is moved[-1]


def _slowdown_the_long_way(state: RoundState, order: SlowdownOrder) -> tuple[list[str], list[str]]:
    """`slowdown_orders` with nothing kept from an earlier call."""
    priority._SLOWDOWN_PARTS.clear()
    queue, backfill = slowdown_orders(state, order)
    return [j.id for j in queue], [j.id for j in backfill]


def test_slowdown_parts_follow_a_job_that_comes_back_changed() -> None:
    """Parts are kept per job object: a job requeued (same id, attempt and submit moved), given
    a new prediction or class, or another floor or session bonus, is ranked by what it is now."""
    rng = random.Random(7)
    pending = [
        job(
            f"j{i}",
            rng.choice((1, 2)),
            submit_at=NOW - rng.uniform(0, 100_000.0),
            predicted_p50_s=rng.choice((30.0, 600.0, 7_200.0)),
            project=rng.choice(("zero", "busy")),
            kind=JobKind.INTERACTIVE if i % 9 == 0 else JobKind.BATCH,
        )
        for i in range(40)
    ]
    policy = PolicyConfig(name="berth", short_job_weight=1.0)
    order = SlowdownOrder()

    def state_of(jobs: list[JobRequest], cfg: PolicyConfig = policy) -> RoundState:
        return RoundState(
            snapshot(make_nodes(4, 2), pending=jobs, projects=_PROJECTS), cfg, NOW, is_predicted=True
        )

    first = slowdown_orders(state_of(pending), order)
    changed = list(pending)
    changed[3] = dataclasses.replace(pending[3], predicted_p50_s=1.0)  # short now: jumps ahead
    changed[5] = dataclasses.replace(
        pending[5], attempt=1, first_submit_at=pending[5].submit_at, submit_at=NOW
    )
    changed[7] = dataclasses.replace(pending[7], priority=2)
    kept = slowdown_orders(state_of(changed), order)
    assert ([j.id for j in kept[0]], [j.id for j in kept[1]]) == _slowdown_the_long_way(
        state_of(changed), order
    )
    assert [j.id for j in kept[0]] != [j.id for j in first[0]]
    # its class puts it before every other batch job, as the object given
    assert next(j for j in kept[0] if j.kind == JobKind.BATCH) is changed[7]
    for params, cfg in (
        (SlowdownOrder(runtime_floor_s=3_000.0), policy),
        (order, dataclasses.replace(policy, interactive_priority=0.0)),
    ):
        slowdown_orders(state_of(changed), order)  # the parts of the default settings are kept
        got = slowdown_orders(state_of(changed, cfg), params)
        assert ([j.id for j in got[0]], [j.id for j in got[1]]) == _slowdown_the_long_way(
            state_of(changed, cfg), params
        )
