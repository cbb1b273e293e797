"""`priority.order_inputs` (docs/benchmarks.md, Speed XIV): the multifactor order from just what
it reads (snapshot, policy, instant, GPU types) is the order from a whole `RoundState`, with
running work on GPUs of unequal fair-share value (the factors read each GPU's type)."""

from __future__ import annotations

import random

import pytest

from scheduling.engine import priority
from scheduling.engine.cluster import RoundState
from scheduling.engine.priority import _ordered, order_inputs, priority_order
from scheduling.engine.types import GpuType, JobKind, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot
from tests.scheduling.engine.test_long_queue_shortcuts import _reference_scores

NOW = 2_000_000.0


def _forget() -> None:
    """Nothing kept from an earlier call (`priority_order` keeps its last order by snapshot)."""
    priority._LAST_ORDER[0] = None
    priority._LAST_BY_SUBMIT.clear()


@pytest.mark.parametrize("seed", range(20))
def test_order_from_order_inputs_equals_the_round_states(seed: int) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(4, 2, gpu_type="A100") + make_nodes(4, 2, gpu_type="T4", first_gpu=8, prefix="t")
    types = (GpuType(name="A100", value=4.0), GpuType(name="T4", value=0.5))
    projects = tuple(
        ProjectShare(name=p, weight=rng.choice((1.0, 2.0)), decayed_usage=rng.uniform(0.0, 50.0))
        for p in "abc"
    )
    gpus = list(range(16))
    rng.shuffle(gpus)
    busy = [
        running(job(f"r{i}", 2, project=rng.choice("abcd")), gpus[2 * i : 2 * i + 2], started_at=NOW - 600.0)
        for i in range(rng.randint(1, 6))
    ]
    pending = [
        job(
            f"j{i}",
            1,
            submit_at=NOW,
            first_submit_at=NOW - rng.uniform(0.0, 3 * 604_800.0),
            project=rng.choice("abcde"),
            kind=JobKind.INTERACTIVE if rng.random() < 0.1 else JobKind.BATCH,
        )
        for i in range(60)
    ]
    snap = snapshot(nodes, running_jobs=busy, pending=pending, gpu_types=types, projects=projects)
    policy = PolicyConfig(name="easy", fairshare_weight=rng.choice((1.0, 5.0, 50.0)))
    for now in (NOW, NOW + 7_200.0):
        _forget()
        got = priority_order(order_inputs(snap, policy, now))
        _forget()
        state = RoundState(snap, policy, now, is_predicted=False)
        assert got == priority_order(state)
        assert got == _ordered(snap.pending, _reference_scores(state))
