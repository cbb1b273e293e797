"""Static's long queue: the round's per-job shortcuts give the plans of the long way round.

* `backfill.backfill` decides the common candidate (unconstrained batch work of a project
  without a limit) without a call per job: admitted once per (size, project), too few GPUs
  free or a wide job behind the top job told so with one shared verdict, and (easy, static) a
  job held back like an earlier one, with nothing started since, told what it was told
  (`backfill_verdicts.CheapVerdicts`);
* `priority.priority_order` builds each job's sort key from its score in one pass, and gives
  the last order again for the same snapshot, policy and instant.

Each is compared with the long way on queues shaped like the KTH overlay's (one-GPU nodes,
a static partition that leaves batch short, most jobs wider than what is free) and with jobs
that start between the refused ones, so the free count changes mid-pass.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from scheduling.engine import explain, plan_round
from scheduling.engine.cluster import RoundState
from scheduling.engine.fairshare import fairshare_factors
from scheduling.engine.priority import _ordered, priority_order, priority_scores
from scheduling.engine.stages import backfill
from scheduling.engine.types import IdleReason, JobKind, JobRequest, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot
from tests.scheduling.engine.test_speed_shortcuts import _long_way

if TYPE_CHECKING:
    from scheduling.engine.round import Round

NOW = 1_000_000.0
_PROJECTS = (
    # the overlay's shape: a guarantee of 0 GPUs (quotas, but no limit)
    ProjectShare(name="zero", guaranteed=(("A100", 0),), decayed_usage=5.0),
    ProjectShare(name="capped", borrow_limit=6, decayed_usage=1.0),
    ProjectShare(name="busy", decayed_usage=50.0),
)


def _queue(rng: random.Random, count: int) -> list[JobRequest]:
    """Mostly unconstrained batch work of every width, short runs that backfill between the
    refused ones, a few sessions and constrained jobs, over projects with and without limits."""
    jobs = []
    for i in range(count):
        roll = rng.random()
        extra: dict[str, object] = {}
        if roll < 0.05:
            extra["gpu_type"] = "A100"  # constrained: the long path
        elif roll < 0.08:
            extra["min_memory_gib"] = -1.0  # unconstrained, another shape
        jobs.append(
            job(
                f"j{i}",
                rng.choice((1, 1, 2, 3, 4, 6, 8, 12, 16, 20, 24)),
                submit_at=rng.choice((NOW - 900_000.0, NOW - 700_000.0, rng.uniform(0, NOW))),
                requested_s=rng.choice((60.0, 600.0, 7_200.0, 86_400.0)),
                project=rng.choice(("zero", "zero", "capped", "busy", "unknown")),
                user=rng.choice(("a", "b", "c")),
                kind=JobKind.INTERACTIVE if rng.random() < 0.05 else JobKind.BATCH,
                is_preemptible=rng.random() < 0.5,
                is_checkpointable=rng.random() < 0.3,
                **extra,
            )
        )
    return jobs


@pytest.mark.parametrize("policy", ["static", "easy", "berth"])
@pytest.mark.parametrize("seed", range(12))
def test_long_queue_matches_the_long_way(policy: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(24, 1)
    # a few long jobs hold some batch GPUs, short ones end soon (they shape the top job's shadow)
    busy = [
        running(
            job(f"r{i}", 1, project="busy", requested_s=rng.choice((600.0, 36_000.0))),
            (gpu,),
            started_at=NOW - 300.0,
        )
        for i, gpu in enumerate(rng.sample(range(24), rng.randint(4, 12)))
    ]
    snap = snapshot(nodes, running_jobs=busy, pending=_queue(rng, 300), projects=_PROJECTS)
    config = PolicyConfig(
        name=policy,
        backfill_depth=rng.choice((5, 40, 1_000)),
        interactive_partition=tuple(f"n{i}" for i in range(16, 24)) if policy == "static" else (),
    )
    shortcut = plan_round(snap, config, NOW)
    monkeypatch.setattr(backfill, "backfill", _long_way)
    long_way = plan_round(snap, config, NOW)
    assert shortcut == long_way  # starts, reservations, idle reasons and every explanation
    if config.backfill_depth == 1_000:
        # the shortcuts had work to do: too-few verdicts at more than one free count (a start
        # between them), and (static) wide jobs behind the top job
        counts = {
            p.sentence.split(" are free")[0].rsplit(" ", 1)[-1]
            for p in long_way.pending
            if " are free" in p.sentence
        }
        assert len(counts) >= 2 or policy != "static"
        if policy == "static":
            assert any("more than the batch partition has" in p.sentence for p in long_way.pending)


def _reference_scores(state: RoundState) -> dict[str, float]:
    """The multifactor score per job id as `priority.priority_scores` defined it before the
    one-pass order (``min``/``max``, job by job): the reference the order must equal."""
    policy = state.policy
    factors = fairshare_factors(state.snapshot, state.types, state.gpu_type, queued_only=True)
    max_age = policy.max_age_s if policy.max_age_s > 0 else 1.0
    scores: dict[str, float] = {}
    for request in state.snapshot.pending:
        submitted = request.first_submit_at if request.first_submit_at is not None else request.submit_at
        score = min(max(0.0, state.now - submitted) * (policy.age_weight / max_age), policy.age_weight)
        score += policy.fairshare_weight * factors.get(request.project, 1.0)
        if request.priority:
            score += 10.0 * request.priority
        if request.kind == JobKind.INTERACTIVE:
            score += policy.interactive_priority
        scores[request.id] = score
    return scores


@pytest.mark.parametrize("mode", ["plain", "classes", "first-unknown"])
@pytest.mark.parametrize("seed", range(20))
def test_priority_order_is_the_order_of_the_scores(seed: int, mode: str) -> None:
    """Ties everywhere: equal submit times, ages saturated or negative (a submit in the
    future), projects with and without a share; then sessions and classes; then first
    submits unknown too."""
    rng = random.Random(seed)
    is_plain = mode == "plain"
    pending = [
        job(
            f"j{rng.randint(0, 10_000)}-{i}",
            1,
            submit_at=rng.choice((NOW, NOW + 10.0, NOW - 1e6, NOW - 604_800.0, rng.uniform(0, NOW))),
            project=rng.choice(("zero", "capped", "busy", "unknown")),
            kind=JobKind.INTERACTIVE if rng.random() < 0.2 and not is_plain else JobKind.BATCH,
            priority=0 if is_plain else rng.choice((0, 0, 1, 2)),
            first_submit_at=rng.choice(
                (None, 5.0, NOW - 2e6)
                if mode == "first-unknown"
                else (NOW, NOW - 1e6, NOW - 604_800.0, NOW + 5e5)
            ),
        )
        for i in range(200)
    ]
    snap = snapshot(make_nodes(2, 2), pending=pending, projects=_PROJECTS)
    state = RoundState(snap, PolicyConfig(name="easy"), NOW, is_predicted=False)
    assert priority_order(state) == _ordered(snap.pending, _reference_scores(state))
    assert priority_scores(state) == _reference_scores(state)


def test_priority_order_with_a_repeated_id_keeps_the_last_score() -> None:
    """Two pending jobs with one id share the last one's score, as `_ordered` has it."""
    pending = [
        job("same", 1, submit_at=0.0),
        job("other", 1, submit_at=500.0),
        job("same", 1, submit_at=900.0),
    ]
    snap = snapshot(make_nodes(1, 1), pending=pending)
    state = RoundState(snap, PolicyConfig(name="easy"), NOW, is_predicted=False)
    assert priority_order(state) == _ordered(snap.pending, _reference_scores(state))
    assert priority_scores(state) == _reference_scores(state)


def test_priority_order_is_kept_for_the_same_snapshot_policy_and_instant() -> None:
    """The last order is given again for the very same snapshot, policy and instant (a replay
    asks for it again to test a still tick), as a list of its own; any of the three changed,
    it is computed anew."""
    pending = [
        job("old", 1, submit_at=0.0, project="busy"),
        job("new", 1, submit_at=NOW - 10.0, project="zero"),
    ]
    snap = snapshot(make_nodes(1, 1), pending=pending, projects=_PROJECTS)
    policy = PolicyConfig(name="easy")
    first = priority_order(RoundState(snap, policy, NOW, is_predicted=False))
    first.reverse()  # the caller's own list
    again = priority_order(RoundState(snap, policy, NOW, is_predicted=False))
    assert [j.id for j in again] == ["old", "new"]
    # a heavy fair-share weight puts the light project's newer job first: a new policy is read
    heavy = PolicyConfig(name="easy", fairshare_weight=100.0)
    assert [j.id for j in priority_order(RoundState(snap, heavy, NOW, is_predicted=False))] == ["new", "old"]


@pytest.mark.parametrize("policy", ["easy", "static"])
def test_a_start_between_two_alike_blocked_jobs_is_seen(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two alike jobs held back by the top job's reservation share a verdict only while
    nothing starts between them: a short job starting in between leaves one GPU fewer free,
    and the second job is told so."""
    nodes = make_nodes(7, 1)  # static: n6 is the partition, the batch side has 6 GPUs
    busy = [running(job("r", 1, requested_s=1_300.0), (0,), started_at=NOW - 300.0)]
    pending = [
        # every GPU of its side: waits for GPU 0 at +1,000 s, holding the others
        job("top", 7 if policy == "easy" else 6, submit_at=0.0),
        job("long-a", 2, submit_at=10.0, requested_s=7_200.0),
        job("short", 1, submit_at=20.0, requested_s=600.0),  # ends before the top job starts
        job("long-b", 2, submit_at=30.0, requested_s=7_200.0),
    ]
    snap = snapshot(nodes, running_jobs=busy, pending=pending)
    config = PolicyConfig(name=policy, interactive_partition=("n6",) if policy == "static" else ())
    plan = plan_round(snap, config, NOW)
    by_id = {p.job_id: p.sentence for p in plan.pending}
    assert [s.job_id for s in plan.starts] == ["short"]
    free_a = 6 if policy == "easy" else 5
    assert by_id["long-a"].startswith(f"{free_a} fitting GPUs are free, but they are held")
    assert by_id["long-b"].startswith(f"{free_a - 1} fitting GPUs are free, but they are held")
    monkeypatch.setattr(backfill, "backfill", _long_way)
    assert plan_round(snap, config, NOW) == plan


_FROM_THE_QUEUE = {IdleReason.NO_DEMAND, IdleReason.CONSTRAINT_MISMATCH, IdleReason.QUOTA_BLOCKED}


def _eager_idle(sched: Round, queue: list[JobRequest]) -> tuple[tuple[int, IdleReason], ...]:
    """The idle reasons with the queue walked first, as before `explain.idle_reasons` asked
    for it only when an idle GPU needs it."""
    kinds = explain.waiting_kinds(sched, queue)
    demand = (kinds, explain.fragmented_types(sched, queue, kinds), explain.quota_demand(sched, queue, kinds))
    return explain.idle_reasons(sched, lambda: demand)


@pytest.mark.parametrize("policy", ["static", "easy", "berth"])
def test_idle_reasons_walk_the_queue_only_for_a_gpu_that_needs_it(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle GPU held, booked or in static's partition has its reason without the queue:
    rounds that leave only such GPUs do not walk it, and every round's reasons are those of
    the queue walked first.  Behind a short window the verdicts are recorded only when read
    (`backfill.beyond_window`), so the plan is compared before and after its explanations."""
    walks: list[int] = []
    waiting_kinds = explain.waiting_kinds

    def counted(sched: Round, queue: list[JobRequest]) -> set[explain.Kind]:
        walks.append(len(queue))
        return waiting_kinds(sched, queue)

    asked = {True: 0, False: 0}
    for seed in range(12):
        rng = random.Random(seed)
        nodes = make_nodes(24, 1)
        busy = [
            running(job(f"r{i}", 1, project="busy", requested_s=36_000.0), (gpu,), started_at=NOW - 300.0)
            for i, gpu in enumerate(rng.sample(range(24), rng.randint(2, 16)))
        ]
        queue = _queue(rng, rng.choice((3, 60)))
        snap = snapshot(nodes, running_jobs=busy, pending=queue, projects=_PROJECTS)
        config = PolicyConfig(
            name=policy,
            backfill_depth=rng.choice((2, 1_000)),
            interactive_partition=tuple(f"n{i}" for i in range(16, 24)) if policy == "static" else (),
        )
        monkeypatch.setattr(explain, "waiting_kinds", counted)
        walks.clear()
        plan = plan_round(snap, config, NOW)
        idle = plan.idle  # before the explanations are read
        is_asked = bool(walks)
        asked[is_asked] += 1
        if not is_asked:
            assert not {reason for _gpu, reason in idle} & _FROM_THE_QUEUE
        monkeypatch.setattr(explain, "waiting_kinds", waiting_kinds)
        monkeypatch.setattr(explain, "_idle", _eager_idle)
        eager = plan_round(snap, config, NOW)
        monkeypatch.undo()
        assert eager.idle == idle
        assert eager == plan  # explanations included (the deferred verdicts recorded now)
    assert asked[True]  # both ways were taken
    assert asked[False]


@pytest.mark.parametrize("policy", ["static", "easy"])
def test_a_round_whose_idle_gpus_are_held_does_not_walk_the_queue(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top job holds every free GPU of its side and static's partition is idle: each idle
    GPU is `reserved_unused` whatever waits, and the queue is not walked for it."""
    walks: list[int] = []
    waiting_kinds = explain.waiting_kinds

    def counted(sched: Round, queue: list[JobRequest]) -> set[explain.Kind]:
        walks.append(len(queue))
        return waiting_kinds(sched, queue)

    monkeypatch.setattr(explain, "waiting_kinds", counted)
    busy = [running(job("r", 1, requested_s=3_600.0), (0,), started_at=NOW - 300.0)]
    pending = [job("top", 6 if policy == "static" else 8, submit_at=0.0)] + [
        job(f"w{i}", 2, submit_at=10.0 + i, requested_s=7_200.0) for i in range(5)
    ]
    snap = snapshot(make_nodes(8, 1), running_jobs=busy, pending=pending)
    config = PolicyConfig(
        name=policy, interactive_partition=("n6", "n7") if policy == "static" else (), backfill_depth=2
    )
    plan = plan_round(snap, config, NOW)
    assert plan.idle == tuple((gpu, IdleReason.RESERVED_UNUSED) for gpu in range(1, 8))
    assert walks == []
    assert len(plan.pending) == 6  # the verdicts behind the window, recorded when read
    assert walks == []  # explaining walks the queue its own way


@pytest.mark.parametrize("case", ["apart", "same-id", "limit"])
def test_static_session_pass_and_the_verdicts_behind_the_window(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdicts behind static's batch window may wait past the session pass only when that
    pass cannot change them: a session sharing an id with a job behind the window is refused
    as that job was told to wait, and a session's start takes its project to its limit, which
    the job behind the window, admitted before, did not see."""
    limit = 1 if case == "limit" else None
    # p's heavy usage puts its batch job behind q's two, the second of which fills the window
    projects = (ProjectShare(name="p", borrow_limit=limit, decayed_usage=1_000.0), ProjectShare(name="q"))
    pending = [
        job("top", 6, submit_at=0.0, project="q"),  # every batch GPU: holds the free ones
        job("w0", 1, submit_at=10.0, project="q", requested_s=7_200.0),
        job("s" if case == "same-id" else "tail", 1, submit_at=20.0, project="p", requested_s=7_200.0),
        job("s", 1, submit_at=30.0, project="p", kind=JobKind.INTERACTIVE),  # starts on n6
    ]
    busy = [running(job("r", 1, project="o", requested_s=3_600.0), (0,), started_at=NOW - 300.0)]
    snap = snapshot(make_nodes(7, 1), running_jobs=busy, pending=pending, projects=projects)
    # no session bonus: a repeated id orders both jobs by the last one's score (the session's)
    config = PolicyConfig(
        name="static", interactive_partition=("n6",), backfill_depth=1, interactive_priority=0.0
    )
    plan = plan_round(snap, config, NOW)
    assert [s.job_id for s in plan.starts] == ([] if case == "same-id" else ["s"])
    monkeypatch.setattr(backfill, "backfill", _long_way)
    assert plan_round(snap, config, NOW) == plan
