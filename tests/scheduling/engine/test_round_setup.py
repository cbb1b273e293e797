"""A round's set-up takes exact shortcuts: the same pools and plans as the long way round.

* `FreePool.hold_each` leaves a pool exactly as holding each GPU in turn would (the same holds,
  and the same order of every dict and set a later query walks);
* `reserve.booking_holds` merges each GPU's booking holds first; holding them once leaves the
  pools as holding the bookings one by one did;
* `reserve.place_bookings` reuses what it recorded for the same booking objects, lead, grace
  and started/over counts (`reserve._PLACED`): a warm cache gives the plans of a cold one;
* `PoolForecast.of` keeps the forecast of the last ``interactive_pool`` tuple.
"""

from __future__ import annotations

import random

import pytest

from scheduling.engine import plan_round
from scheduling.engine.placement import INF, FreePool, Hold
from scheduling.engine.stages import reserve
from scheduling.engine.types import Booking, JobKind, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0


def _pool(rng: random.Random, free: set[int]) -> FreePool:
    # two types: nodes 0-5 of 4 GPUs (T4), nodes 6-8 of 8 GPUs (A100)
    gpu_node = {g: g // 4 for g in range(24)} | {24 + g: 6 + g // 8 for g in range(24)}
    node_types = ["T4"] * 6 + ["A100"] * 3
    return FreePool(free, gpu_node=gpu_node, node_types=node_types, max_size={"T4": 4, "A100": 8})


def _layout(pool: FreePool) -> object:
    """Everything a query reads, in the order it reads it (dict and set iteration orders)."""
    return (
        list(pool._held.items()),
        # a group's order is never read (sums and unions): compared as a mapping
        {name: {h: sorted(g) for h, g in groups.items()} for name, groups in pool._groups.items()},
        list(pool._plain.items()),
        {name: [list(b) for b in buckets] for name, buckets in pool._buckets.items()},
        {name: list(nodes) for name, nodes in pool._held_nodes.items()},
        dict(pool._type_plain),
        dict(pool._type_free),
    )


def _random_hold(rng: random.Random, holder: str) -> Hold:
    until = rng.choice([NOW + 600.0, NOW + 3_600.0, NOW + 7_200.0])
    return Hold(
        holder=holder,
        normal_until=until,
        lent_until=rng.choice([until, INF]),
        is_strict=rng.random() < 0.5,
        is_checkpoint_only=rng.random() < 0.5,
        is_for_interactive=rng.random() < 0.3,
        restart_until=rng.choice([-INF, NOW + 900.0]),
    )


@pytest.mark.parametrize("seed", range(40))
def test_hold_each_leaves_the_pool_as_holding_one_gpu_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    free = set(rng.sample(range(48), rng.randint(5, 40)))
    one_by_one, at_once = _pool(rng, free), _pool(rng, free)
    if rng.random() < 0.5:  # a hold already there (the top job's): later holds merge with it
        earlier = _random_hold(rng, "top")
        gpus = rng.sample(range(48), 6)
        one_by_one.hold(gpus, earlier)
        at_once.hold(gpus, earlier)
    # GPUs named twice, busy GPUs and GPUs of no node among them
    pairs = [(rng.choice([*range(48), 99]), _random_hold(rng, f"b{rng.randint(0, 5)}")) for _ in range(30)]
    for gpu, hold in pairs:
        one_by_one.hold([gpu], hold)
    at_once.hold_each(pairs)
    assert _layout(at_once) == _layout(one_by_one)
    for gpu_count in (1, 3, 4, 8, 12):
        for until in (NOW + 500.0, NOW + 5_000.0):
            for lent in (False, True):
                found = [
                    pool.find(["T4", "A100"], gpu_count, until=until, is_lent=lent, is_checkpointing=lent)
                    for pool in (at_once, one_by_one)
                ]
                assert found[0] == found[1]


@pytest.mark.parametrize("seed", range(30))
def test_merged_booking_holds_leave_the_pool_as_holding_each_booking(seed: int) -> None:
    rng = random.Random(seed)
    free = set(rng.sample(range(48), rng.randint(5, 40)))
    per_booking, merged = _pool(rng, free), _pool(rng, free)
    bookings = []
    for i in range(rng.randint(1, 8)):
        lead_at = NOW + rng.choice([600.0, 1_800.0, 3_600.0])  # ties: the first booking names it
        bookings.append((tuple(rng.sample(range(48), rng.randint(1, 6))), lead_at, f"b{i}"))
    final: dict[int, Hold] = {}
    for gpus, lead_at, holder in bookings:
        hold = Hold(
            holder=holder, normal_until=lead_at, lent_until=lead_at, is_strict=True, is_checkpoint_only=True
        )
        per_booking.hold(gpus, hold)  # what `hold_bookings` did before
        for gpu in gpus:
            final[gpu] = hold if gpu not in final else final[gpu].merge(hold)
    merged.hold_each(tuple(final.items()))
    assert _layout(merged) == _layout(per_booking)


def _bookings(*, portal: bool) -> tuple[Booking, ...]:
    def booking(i: int, gpus: tuple[int, ...], start: float, end: float) -> Booking:
        return Booking(
            id=f"bk{i}",
            user="v",
            project="q",
            gpu_count=len(gpus),
            start_at=NOW + start,
            end_at=NOW + end,
            gpu_ids=gpus if portal else (),
        )

    return (
        booking(0, (0, 1), 1_000.0, 4_000.0),
        booking(1, (2,), 3_000.0, 9_000.0),
        booking(2, (1, 6), 6_000.0, 8_000.0),
        booking(3, (7,), 6_000.0, 7_000.0),
    )


# instants before, between and after the bookings' lead times (grace before them), starts and ends
_OFFSETS = [-5_000.0, -3_000.0, 0.0, 500.0, 950.0, 1_000.0, 2_000.0, 2_900.0, 3_500.0, 4_000.0]
_OFFSETS += [5_000.0, 5_990.0, 6_500.0, 7_000.0, 7_500.0, 8_500.0, 9_000.0, 10_000.0]


@pytest.mark.parametrize("portal", [True, False])
@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
def test_recorded_bookings_give_the_plans_of_placing_them_anew(policy: str, portal: bool) -> None:
    # the same booking objects round after round (as the replay passes them), work ending and
    # starting around them; every plan with the cache warm equals the plan placed from scratch
    nodes = make_nodes(8, 1)
    bookings = _bookings(portal=portal)
    config = PolicyConfig(
        name=policy,
        interactive_partition=("n6", "n7") if policy == "static" else (),
        booking_lead_s=600.0,
    )
    runs = [
        running(
            job(f"r{g}", 1, requested_s=4_000.0 * (g + 1)),
            (g,),
            started_at=NOW - 1_000.0,
            is_preemptible=g % 2 == 1,
        )
        for g in range(3, 6)
    ]
    pending = [
        job("long", 2, requested_s=50_000.0, submit_at=1.0),
        job("short", 1, requested_s=300.0, submit_at=2.0),
        job("s", 1, requested_s=900.0, submit_at=3.0, kind=JobKind.INTERACTIVE),
    ]
    snap = snapshot(nodes, running_jobs=runs, pending=pending, bookings=bookings)
    reserve._PLACED.clear()
    warm = [plan_round(snap, config, NOW + offset) for offset in _OFFSETS]
    # one entry per count of bookings started and not over, none while the engine chooses GPUs
    counts = {
        (sum(b.start_at <= NOW + t for b in bookings), sum(b.end_at > NOW + t for b in bookings))
        for t in _OFFSETS
    }
    assert len(reserve._PLACED) == len([c for c in counts if portal or c[1] == 0]) < len(_OFFSETS)
    for offset, plan in zip(_OFFSETS, warm, strict=True):
        reserve._PLACED.clear()
        assert plan_round(snap, config, NOW + offset) == plan, offset


@pytest.mark.parametrize("policy", ["easy", "berth"])
def test_recorded_bookings_follow_the_lead_and_the_grace(policy: str) -> None:
    # two policies on the same booking objects, interleaved: a warm cache must not hand one
    # the other's windows (lead) or wake-ups (berth reclaims one grace before the lead time)
    nodes = make_nodes(8, 1)
    bookings = _bookings(portal=True)
    configs = [
        PolicyConfig(name=policy, booking_lead_s=600.0, grace_s=300.0),
        PolicyConfig(name=policy, booking_lead_s=1_200.0, grace_s=300.0),
        PolicyConfig(name=policy, booking_lead_s=600.0, grace_s=1_800.0),
    ]
    pending = [
        job("long", 2, requested_s=50_000.0, submit_at=1.0),
        job("x", 1, requested_s=200.0, submit_at=2.0),
    ]
    runs = [running(job("r", 2, requested_s=90_000.0), (4, 5), started_at=NOW - 10.0, is_preemptible=True)]
    snap = snapshot(nodes, running_jobs=runs, pending=pending, bookings=bookings)
    reserve._PLACED.clear()
    warm = [
        (t, c, plan_round(snap, c, NOW + t)) for t in (-3_000.0, -1_500.0, -500.0, 2_000.0) for c in configs
    ]
    for t, config, plan in warm:
        reserve._PLACED.clear()
        assert plan_round(snap, config, NOW + t) == plan, (t, config.booking_lead_s, config.grace_s)


def test_the_pool_forecast_follows_the_policys_entries() -> None:
    # `PoolForecast.of` keeps the last forecast while the very same entries come back
    from scheduling.engine.pool import PoolForecast

    first = ((0.0, "*", 2), (3_600.0, "*", 5), (3_600.0, "A100", 1))
    second = ((0.0, "*", 1), (7_200.0, "T4", 3))
    for entries in (first, second, first, (*first,), ()):
        forecast = PoolForecast.of(PolicyConfig(name="berth", interactive_pool=entries))
        assert forecast == (PoolForecast.build(entries) if entries else None)
    policy = PolicyConfig(name="berth", interactive_pool=second)
    assert PoolForecast.of(policy) is PoolForecast.of(policy)
