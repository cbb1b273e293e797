"""Berth's queue order, starvation bound, overdue correction and backfill rule."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings

from scheduling.engine import plan_round
from scheduling.engine.cluster import RoundState
from scheduling.engine.priority import SlowdownOrder, slowdown_orders, submitted_at
from scheduling.engine.types import JobKind, JobRequest, Plan, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot
from tests.scheduling.engine.test_properties import NOW as PROP_NOW
from tests.scheduling.engine.test_properties import Case, cases

NOW = 100_000.0
DAY = 86_400.0


def started(plan: Plan) -> list[str]:
    return [s.job_id for s in plan.starts]


def test_a_short_job_overtakes_an_older_long_one_once_it_waited_a_share_of_its_runtime() -> None:
    nodes = make_nodes(4, 1)
    pending = [
        # waited an hour for a ten-hour run: expansion 1.1
        job(
            "long",
            4,
            submit_at=NOW - 3_600,
            requested_s=40_000,
            predicted_p50_s=36_000,
            predicted_p90_s=40_000,
        ),
        # waited ten minutes for a ten-minute run: expansion 2
        job("short", 4, submit_at=NOW - 600, requested_s=1_200, predicted_p50_s=600, predicted_p90_s=900),
    ]
    snap = snapshot(nodes, pending=pending)
    assert started(plan_round(snap, PolicyConfig(name="berth"), NOW)) == ["short"]
    assert started(plan_round(snap, PolicyConfig(name="easy"), NOW)) == ["long"]  # age first


def test_a_starved_job_goes_ahead_of_any_newer_job() -> None:
    nodes = make_nodes(4, 1)
    pending = [
        job("old", 4, submit_at=NOW - DAY - 1, requested_s=400_000, predicted_p50_s=300_000),
        job("tiny", 4, submit_at=NOW - 3_000, requested_s=60, predicted_p50_s=10, predicted_p90_s=20),
    ]
    snap = snapshot(nodes, pending=pending)
    assert started(plan_round(snap, PolicyConfig(name="berth"), NOW)) == ["old"]
    # a day earlier, the old job's expansion factor (1.29) loses to the tiny job's (11)
    younger = [
        job("old", 4, submit_at=NOW - 86_000, requested_s=400_000, predicted_p50_s=300_000),
        pending[1],
    ]
    assert started(plan_round(snapshot(nodes, pending=younger), PolicyConfig(name="berth"), NOW)) == ["tiny"]


def test_fair_share_is_a_factor_of_the_order() -> None:
    nodes = make_nodes(2, 1)
    pending = [
        job("heavy", 2, submit_at=NOW - 600, project="a", predicted_p50_s=600),
        job("light", 2, submit_at=NOW - 500, project="b", predicted_p50_s=600),
    ]
    shares = (ProjectShare(name="a", weight=1, decayed_usage=1_000.0), ProjectShare(name="b", weight=1))
    snap = snapshot(nodes, pending=pending, projects=shares)
    assert started(plan_round(snap, PolicyConfig(name="berth"), NOW)) == ["light"]
    neutral = PolicyConfig(name="berth", fairshare_weight=0.0)
    assert started(plan_round(snap, neutral, NOW)) == ["heavy"]  # it waited longer


def test_requeued_jobs_keep_their_original_age() -> None:
    nodes = make_nodes(1, 1)
    pending = [
        job(
            "requeued",
            1,
            submit_at=NOW - 10,
            first_submit_at=NOW - DAY - 5,
            attempt=1,
            predicted_p50_s=50_000,
        ),
        job("fresh", 1, submit_at=NOW - 3_000, predicted_p50_s=60),
    ]
    assert started(plan_round(snapshot(nodes, pending=pending), PolicyConfig(name="berth"), NOW)) == [
        "requeued"
    ]


def test_berth_backfills_in_front_of_a_top_job_blocked_by_an_overdue_job() -> None:
    nodes = make_nodes(4, 1)
    # ran 10,000 s on a 1-hour limit: easy expects it to end in a minute, berth in 5,000 s
    overdue = running(job("r", 1, requested_s=3_600), (0,), started_at=NOW - 10_000)
    pending = [
        job("top", 4, submit_at=NOW - 100),
        job("c", 2, submit_at=NOW - 50, requested_s=3_600, predicted_p50_s=1_800, predicted_p90_s=3_000),
    ]
    snap = snapshot(nodes, running_jobs=[overdue], pending=pending)
    berth = plan_round(snap, PolicyConfig(name="berth", overrun_fraction=0.5), NOW)
    assert started(berth) == ["c"]
    (reservation,) = [r for r in berth.reservations if r.holder_id == "top"]
    assert reservation.start_at >= NOW + 3_000  # c ends (on its p90) before the top job's start
    easy = plan_round(snap, PolicyConfig(name="easy"), NOW)
    assert started(easy) == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_slowdown_order_keeps_classes_and_the_starvation_bound(case: Case) -> None:
    """Sessions, then priority classes, then starved jobs oldest first, then the rest; the
    backfill order is a permutation of the queue; the top job is never newer than a starved
    job of its class (so a starved job's wait ends within one reservation of the older ones)."""
    order = SlowdownOrder(starvation_s=50_000.0)
    state = RoundState(case.snapshot, case.policy, PROP_NOW, is_predicted=True)
    queue, backfill = slowdown_orders(state, order)
    assert sorted(j.id for j in queue) == sorted(j.id for j in case.snapshot.pending)
    assert sorted(j.id for j in backfill) == sorted(j.id for j in queue)

    def tier(j: JobRequest) -> tuple[bool, int]:
        return (j.kind != JobKind.INTERACTIVE, -j.priority)

    tiers = [tier(j) for j in queue]
    assert tiers == sorted(tiers)
    for a, b in itertools.pairwise(queue):
        if tier(a) != tier(b):
            continue
        a_starved = PROP_NOW - submitted_at(a) >= order.starvation_s
        b_starved = PROP_NOW - submitted_at(b) >= order.starvation_s
        assert a_starved or not b_starved, "a starved job behind a job that is not"
        if a_starved and b_starved:
            assert submitted_at(a) <= submitted_at(b), "starved jobs out of age order"


def test_the_runtime_floor_is_bounded_slowdowns_so_a_short_job_that_waited_goes_first() -> None:
    nodes = make_nodes(1, 1)
    pending = [
        # waited 50 minutes for an hour: expansion 1.83
        job("hour", 1, submit_at=NOW - 3_000, requested_s=4_000, predicted_p50_s=3_600),
        # waited 200 s for 30 s: expansion 7.7 (1.67 if runtimes counted at least 300 s)
        job("short", 1, submit_at=NOW - 200, requested_s=60, predicted_p50_s=30, predicted_p90_s=40),
    ]
    snap = snapshot(nodes, pending=pending)
    assert SlowdownOrder().runtime_floor_s == 10.0
    assert started(plan_round(snap, PolicyConfig(name="berth"), NOW)) == ["short"]
    state = RoundState(snap, PolicyConfig(name="berth"), NOW, is_predicted=True)
    queue, _backfill = slowdown_orders(state, SlowdownOrder(runtime_floor_s=300.0))
    assert [j.id for j in queue] == ["hour", "short"]
