"""A round runs with the cyclic garbage collector paused (`engine.collector`) and leaves it as
it found it: enabled after the round and after its explanations are read, even when a stage
raises, and still disabled for a caller that runs without it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import replace

import pytest

from scheduling.engine import explain, plan_round
from scheduling.engine.collector import collector_paused
from scheduling.engine.policies import berth
from scheduling.engine.stages.compose import plan_with
from scheduling.engine.types import PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, snapshot


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_restored_after(collector_enabled: None) -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a stage failed")
    assert gc.isenabled()


def test_a_caller_without_the_collector_keeps_it_off(collector_enabled: None) -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_a_round_and_its_explanations_run_paused(
    collector_enabled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    order = berth.BERTH.order
    explain_pending = explain.explain_pending

    def watching_explain(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return explain_pending(*args, **kwargs)

    monkeypatch.setattr(explain, "explain_pending", watching_explain)

    def watching_order(rnd):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return order(rnd)

    composition = replace(berth.BERTH, order=watching_order)
    snap = snapshot(make_nodes(2, 4), pending=[job("a", 2), job("b", 8), job("c", 4)])
    plan = plan_with(composition, snap, PolicyConfig(name="berth"), 0.0)
    assert seen == [False]  # the round, up to its plan
    assert gc.isenabled()
    assert [p.job_id for p in plan.pending] == ["b"]
    assert seen == [False, False]  # and the explanations, read later
    assert gc.isenabled()
    # the same plan as without the pause
    gc.disable()
    plain = plan_round(snap, PolicyConfig(name="berth"), 0.0)
    gc.enable()
    assert plain == plan_round(snap, PolicyConfig(name="berth"), 0.0)


@pytest.mark.parametrize("is_explained", [True, False])
@pytest.mark.parametrize("policy", ["fifo", "easy", "static", "berth"])
def test_a_round_leaves_no_cycle_for_the_collector(
    policy: str, is_explained: bool, collector_enabled: None
) -> None:
    """A dropped plan frees its round by reference counting: a cycle through the round would
    leave each of a replay's hundreds of thousands of rounds to the cyclic collector (with
    static's span pool pointing back at its round that was 12 % of static's CPU on the
    overlay's first 3,000 KTH jobs).  Unexplained (a replay's way), the round still holds the
    deferred verdicts behind its backfill window (`backfill.beyond_window`)."""
    nodes = make_nodes(8, 1)
    # a wide job heads static's batch queue (it spans the partition), work waits behind it:
    # the next job holds every GPU, the last one is behind a window of one
    pending = [
        job("wide", 6, submit_at=0.0),
        job("a", 8, submit_at=10.0),
        job("b", 3, submit_at=20.0),
        job("c", 3, submit_at=30.0),
    ]
    snap = snapshot(nodes, pending=pending)
    config = PolicyConfig(
        name=policy,
        interactive_partition=("n6", "n7") if policy == "static" else (),
        backfill_depth=1,
    )
    plan_round(snap, config, 100.0)  # caches of the shared topology are built, not garbage
    gc.collect()
    plan = plan_round(snap, config, 101.0)
    assert plan.reservations or plan.starts  # the round did its work
    if is_explained:
        assert plan.pending  # and was explained (the explanations read the round)
    was_debug = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds, to name it
    try:
        del plan
        found = gc.collect()
        names = sorted({type(obj).__name__ for obj in gc.garbage})
    finally:
        gc.set_debug(was_debug)
        gc.garbage.clear()
    assert found == 0, names
