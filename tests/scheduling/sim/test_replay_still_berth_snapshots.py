"""Berth's still ticks on hand-made snapshots: for each time reading the rule relies on, every
instant it would skip (before `berth_until`, with berth's order unchanged) plans the very no-op
the still round planned, and just past the reading the plan does change (so the reading is
needed).  The skipped instants are planned with the real engine; `replay_still_berth` is the rule
(docs/benchmarks.md, "Speed XIII")."""

from __future__ import annotations

import math

import pytest

from scheduling.engine import plan_round
from scheduling.engine.policies.berth import BERTH
from scheduling.engine.stages.compose import plan_and_round
from scheduling.engine.stages.order import guarantee_test
from scheduling.engine.types import (
    Booking,
    ClusterSnapshot,
    JobKind,
    JobRequest,
    Plan,
    PolicyConfig,
    ProjectShare,
)
from scheduling.sim import replay_still_berth
from scheduling.sim.replay_still_berth import berth_order, berth_refuses, berth_until, has_starved
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

T = 100_000.0
BERTH_CONFIG = PolicyConfig(name="berth")


def _checkpointing(job_id: str, gpus: int, *, p50: float, p90: float) -> JobRequest:
    return job(
        job_id,
        gpus,
        submit_at=T - 10_000,
        requested_s=200_000,
        predicted_p50_s=p50,
        predicted_p90_s=p90,
        is_preemptible=True,
        is_checkpointable=True,
        checkpoint_interval_s=600.0,
    )


def _lent_victim_and_top(*, victim_started_at: float, other_requested_s: int) -> ClusterSnapshot:
    """Five 1-GPU nodes: lent checkpointing work on 0-1, other work on 2-3, a 3-GPU top job
    pending that could suspend the lent work."""
    victim = _checkpointing("v", 2, p50=150_000.0, p90=190_000.0)
    other = job("r", 2, submit_at=T - 20_000, requested_s=other_requested_s)
    top = job("j", 3, submit_at=T - 500, requested_s=1_200, predicted_p50_s=600.0, predicted_p90_s=900.0)
    return snapshot(
        make_nodes(5, 1),
        running_jobs=[
            running(victim, [0, 1], started_at=victim_started_at, is_preemptible=True),
            running(other, [2, 3], started_at=T - 1_000),
        ],
        pending=[top],
    )


def _minimum_runtime() -> tuple[ClusterSnapshot, PolicyConfig, float]:
    """The top job may suspend lent checkpointing work once it passes its minimum runtime
    (less the grace): at T + 170."""
    snap = _lent_victim_and_top(victim_started_at=T - 100, other_requested_s=50_000)
    return snap, BERTH_CONFIG, T + 170


def _booking_signal() -> tuple[ClusterSnapshot, PolicyConfig, float]:
    """A booking signals the lent work on its GPUs a grace before its start: at T + 970."""
    victim = _checkpointing("v", 1, p50=150_000.0, p90=190_000.0)
    wide = job(
        "j", 3, submit_at=T - 500, requested_s=200_000, predicted_p50_s=100_000.0, predicted_p90_s=190_000.0
    )
    booking = Booking(
        id="bk", user="b", project="q", gpu_count=1, start_at=T + 1_000, end_at=T + 4_600, gpu_ids=(0,)
    )
    snap = snapshot(
        make_nodes(3, 1),
        running_jobs=[running(victim, [0], started_at=T - 5_000, is_preemptible=True)],
        pending=[wide],
        bookings=(booking,),
    )
    return snap, BERTH_CONFIG, T + 970


def _pool_hour() -> tuple[ClusterSnapshot, PolicyConfig, float]:
    """The interactive pool's level drops at the next hour start (T + 1,800): a
    non-preemptible job starts once the pool no longer holds its GPUs."""
    pool = tuple((T - 1_800 + hour * 3_600, "*", 3 if hour == 0 else 0) for hour in range(26))
    narrow = job(
        "jf", 2, submit_at=T - 500, requested_s=2_000, predicted_p50_s=600.0, predicted_p90_s=1_000.0
    )
    return (
        snapshot(make_nodes(4, 1), pending=[narrow]),
        PolicyConfig(name="berth", interactive_pool=pool),
        T + 1_800,
    )


def _slowdown_order() -> tuple[ClusterSnapshot, PolicyConfig, float]:
    """A short job overtakes the wide top job in berth's order (expected slowdown) at T + 80,
    and starts on the free GPU."""
    wide = job(
        "big", 4, submit_at=T - 3_600, requested_s=40_000, predicted_p50_s=36_000.0, predicted_p90_s=40_000.0
    )
    short = job(
        "small", 1, submit_at=T - 60, requested_s=2_400, predicted_p50_s=1_200.0, predicted_p90_s=1_800.0
    )
    other = job("r4", 3, submit_at=T - 9_000, requested_s=5_000)
    snap = snapshot(
        make_nodes(4, 1),
        running_jobs=[running(other, [0, 1, 2], started_at=T - 4_000)],
        pending=[wide, short],
    )
    return snap, BERTH_CONFIG, T + 80


SCENARIOS = {
    "minimum_runtime": _minimum_runtime,
    "booking_signal": _booking_signal,
    "pool_hour": _pool_hour,
    "slowdown_order": _slowdown_order,
}


def _free_gpus(snap: ClusterSnapshot) -> int:
    busy = {gpu for run in snap.running for gpu in run.gpu_ids}
    return sum(1 for node in snap.nodes for gpu in node.gpu_ids if gpu not in busy)


def _until(snap: ClusterSnapshot, config: PolicyConfig, t: float) -> tuple[Plan, list[JobRequest], float]:
    """The still round at ``t`` (asserted a no-op), its queue order and the rule's bound."""
    plan, rnd, queue = plan_and_round(BERTH, snap, config, t)
    assert not plan.starts
    assert not plan.preemptions
    if berth_refuses(snap, config, t):
        return plan, queue, t
    return plan, queue, berth_until(snap, plan, config, t, free_gpus=_free_gpus(snap), rnd=rnd)


def _is_same_no_op(still: Plan, plan: Plan, *, t: float) -> bool:
    """What a skipped tick assumes of its plan (`replay_still.still_plan_difference`)."""
    wake = plan.next_round_at
    return (
        not plan.starts
        and not plan.preemptions
        and plan.idle == still.idle
        and (wake is None or wake <= t or wake == still.next_round_at)
    )


def _check_skips(snap: ClusterSnapshot, config: PolicyConfig, samples: int = 60) -> int:
    """Plan the instants the rule would skip (grids before its bound, and the last instant
    before it) and assert each is the still round's no-op; returns how many were skipped."""
    still, queue, until = _until(snap, config, T)
    checked = 0
    if until <= T:
        return checked
    end = min(until, T + 10 * 86_400.0)
    # a grid over the whole span, every 10 s over its first two hours, and its last instant
    coarse = [T + (end - T) * k / samples for k in range(1, samples)]
    fine = [T + 10.0 * k for k in range(1, 721) if T + 10.0 * k < end]
    instants = sorted({*coarse, *fine, math.nextafter(end, -math.inf)})
    for at in instants:
        guarantees = (
            guarantee_test(plan_and_round(BERTH, snap, config, T)[1]) if has_starved(snap, at) else None
        )
        if berth_order(snap, config, at, guarantees) != queue:
            continue  # the tick's order differs: the replay plans it
        assert _is_same_no_op(still, plan_round(snap, config, at), t=at), (
            f"skipped {at - T:+.3f} s plans anew"
        )
        checked += 1
    return checked


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_skipped_instant_plans_the_still_no_op(name: str) -> None:
    snap, config, _changes_at = SCENARIOS[name]()
    assert _check_skips(snap, config) > 0


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_plan_changes_just_past_the_time_reading(name: str) -> None:
    # the reading is needed: at the instant it names the plan acts, and the rule stops before
    snap, config, changes_at = SCENARIOS[name]()
    still, queue, until = _until(snap, config, T)
    changed = plan_round(snap, config, changes_at)
    assert not _is_same_no_op(still, changed, t=changes_at)
    if name == "slowdown_order":
        # caught by the order, compared at every tick, not by the bound
        assert berth_order(snap, config, changes_at, None) != queue
    else:
        assert T < until < changes_at


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        # the victim's GPUs count as back at its kill time, so the top job's shadow lies there
        # too: the minimum runtime and the shadow less the grace name the same instant
        ("minimum_runtime", ("_reclaim_until", "_first_crossing")),
        ("booking_signal", ("_first_crossing",)),
        ("pool_hour", ("_first_crossing",)),
    ],
)
def test_without_the_reading_a_skipped_instant_would_plan_anew(
    name: str, parts: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    for part in parts:
        monkeypatch.setattr(replay_still_berth, part, lambda *_args, **_kwargs: math.inf)
    snap, config, _changes_at = SCENARIOS[name]()
    with pytest.raises(AssertionError, match="plans anew"):
        _check_skips(snap, config)


def test_a_reclaim_refused_as_not_worth_it_is_not_still() -> None:
    # the top job could suspend lent work now but the gain (its other GPUs free at T + 300) is
    # not worth the loss: gain and loss move with now, so the round is not kept
    snap = _lent_victim_and_top(victim_started_at=T - 1_000, other_requested_s=1_300)
    _plan, rnd, _queue = plan_and_round(BERTH, snap, BERTH_CONFIG, T)
    assert rnd.out.worth_refused
    assert _until(snap, BERTH_CONFIG, T)[2] == T
    assert plan_round(snap, BERTH_CONFIG, T + 300).preemptions  # later it is worth it


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_plan_and_round_gives_plan_rounds_plan_and_berths_order(name: str) -> None:
    # the replay plans berth through `plan_and_round` (to keep the round for the still test)
    snap, config, changes_at = SCENARIOS[name]()
    for at in (T, changes_at):
        plan, _rnd, queue = plan_and_round(BERTH, snap, config, at)
        assert plan == plan_round(snap, config, at)
        assert queue == berth_order(snap, config, at, None)


def _reclaim_demand(
    demand: JobRequest, *, victim_age: float, projects: tuple[ProjectShare, ...] = ()
) -> ClusterSnapshot:
    """No GPU free; the demand may take the restartable work on GPU 0 only while what it
    would lose (its age) is at most the demand's GPU-time (3,600 s)."""
    victim = job(
        "w",
        1,
        submit_at=T - 20_000,
        requested_s=100_000,
        project="other",
        is_preemptible=True,
        predicted_p50_s=50_000.0,
        predicted_p90_s=90_000.0,
    )
    other = job("r", 1, submit_at=T - 20_000, requested_s=100_000)
    return snapshot(
        make_nodes(2, 1),
        running_jobs=[
            running(victim, [0], started_at=T - victim_age, is_preemptible=True),
            running(other, [1], started_at=T - 10_000),
        ],
        pending=[demand],
        projects=projects,
    )


_SESSION = job("s", 1, submit_at=T - 100, requested_s=3_600, kind=JobKind.INTERACTIVE)
_CLAIM = job(
    "g",
    1,
    submit_at=T - 100,
    requested_s=3_600,
    project="own",
    predicted_p50_s=1_000.0,
    predicted_p90_s=3_600.0,
)
_QUOTAS = (ProjectShare(name="own", guaranteed=(("A100", 1),)), ProjectShare(name="other"))


@pytest.mark.parametrize(
    ("demand", "projects"), [(_SESSION, ()), (_CLAIM, _QUOTAS)], ids=["session", "quota_claim"]
)
def test_a_failed_session_or_claim_reclaim_stays_failed(
    demand: JobRequest, projects: tuple[ProjectShare, ...]
) -> None:
    # the restartable victim costs more than the demand asks for, and costs more as it runs:
    # the still round is kept while a session waits or a job within its guarantee does
    costly = _reclaim_demand(demand, victim_age=10_000.0, projects=projects)
    assert _until(costly, BERTH_CONFIG, T)[2] > T + 3_600
    assert _check_skips(costly, BERTH_CONFIG) > 0
    # the same demand takes it while it has run less than the demand's GPU-time
    cheap = _reclaim_demand(demand, victim_age=1_000.0, projects=projects)
    assert [p.job_id for p in plan_round(cheap, BERTH_CONFIG, T).preemptions] == ["w"]
