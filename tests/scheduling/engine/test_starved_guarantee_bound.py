"""berth's order answers "is this starved job within its guarantee" from a per-project bound.

`order.SlowdownFirst` asks `Round.is_within_guarantee` of every starved batch job; a job wider
than the most guaranteed GPUs its project has left on any type (`order._most_left`) is within
its guarantee on none of its types, so it is answered without its shape (docs/benchmarks.md,
"Speed XII").  The orders must equal those built with the question asked of every job.
"""

from __future__ import annotations

import random

import pytest

from scheduling.engine.policies.berth import BERTH
from scheduling.engine.priority import SlowdownOrder, live_claims, slowdown_orders
from scheduling.engine.round import Round
from scheduling.engine.stages.order import SlowdownFirst
from scheduling.engine.types import JobKind, JobRequest, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 10_000_000.0
DAY_S = 86_400.0


@pytest.mark.parametrize("seed", range(25))
def test_the_bound_gives_the_order_of_asking_every_starved_job(seed: int) -> None:
    rng = random.Random(seed)
    nodes = make_nodes(8, 2, gpu_type="A100") + make_nodes(8, 2, gpu_type="H100", first_gpu=16, prefix="h")
    projects = (
        ProjectShare(name="big", guaranteed=(("A100", rng.randint(0, 10)), ("H100", rng.randint(0, 6)))),
        ProjectShare(name="star", guaranteed=(("*", rng.randint(1, 8)),)),
        ProjectShare(name="zero", guaranteed=(("A100", 0),)),
        ProjectShare(name="limit", borrow_limit=4),
        ProjectShare(name="none"),
    )
    names = [p.name for p in projects] + ["unknown"]
    busy = [
        running(job(f"r{i}", 1, project=rng.choice(names)), (gpu,), started_at=NOW - 600.0)
        for i, gpu in enumerate(rng.sample(range(32), rng.randint(0, 12)))
    ]
    pending: list[JobRequest] = []
    for i in range(120):
        extra: dict[str, str] = {"gpu_type": rng.choice(("A100", "H100"))} if rng.random() < 0.3 else {}
        pending.append(
            job(
                f"j{i}",
                rng.choice((1, 2, 3, 4, 6, 8, 10, 12)),
                submit_at=NOW - rng.choice((2 * DAY_S, 3 * DAY_S, 600.0)),  # most of them starved
                project=rng.choice(names),
                kind=JobKind.INTERACTIVE if rng.random() < 0.05 else JobKind.BATCH,
                **extra,  # type: ignore[arg-type]
            )
        )
    snap = snapshot(nodes, running_jobs=busy, pending=pending, projects=projects)
    rnd = Round(snap, PolicyConfig(name="berth"), NOW, BERTH)
    params = SlowdownOrder()

    def asked(request: JobRequest) -> bool:
        return (
            request.kind == JobKind.BATCH
            and request.project in rnd.shares
            and rnd.is_within_guarantee(request, rnd.types_for(request))
        )

    state = rnd.state
    claims = live_claims(state.snapshot, state.policy.claim_hold_s, state.now)
    every = slowdown_orders(state, params, asked, claims)
    assert SlowdownFirst(params)(rnd) == every
    # a starved job within its guarantee was there to be put first
    assert any(asked(j) for j in pending)
