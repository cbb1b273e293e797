"""`preemption.plan_reclaim` skips, for a single-node demand, the nodes where even taking every
reclaimable job could not free enough GPUs: their victims are never costed (nor asked of the
demand's ``may_take``), and the plan is the one found without the skip."""

from __future__ import annotations

from scheduling.engine.cluster import RoundState
from scheduling.engine.preemption import plan_reclaim
from scheduling.engine.types import PolicyConfig, RunningJob
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 50_000.0


def _consenting(job_id: str, gpus: tuple[int, ...]) -> RunningJob:
    request = job(job_id, len(gpus), requested_s=100_000, is_preemptible=True)
    return running(request, gpus, started_at=NOW - 10_000, is_preemptible=True)


def test_nodes_that_cannot_host_the_demand_are_not_costed() -> None:
    small = make_nodes(1, 2)  # GPUs 0-1: too small for 4
    big = make_nodes(2, 8, first_gpu=2, prefix="b")  # b0: GPUs 2-9, b1: GPUs 10-17
    nodes = (*small, *big)
    held = running(job("held", 6, requested_s=100_000), (2, 3, 4, 5, 6, 7))  # not preemptible
    jobs = [
        _consenting("on-small", (0, 1)),
        _consenting("on-b0", (8, 9)),  # b0: 2 takeable GPUs, no free one: at most 2 < 4
        _consenting("on-b1", (10, 11, 12, 13, 14, 15, 16, 17)),
    ]
    state = RoundState(
        snapshot(nodes, running_jobs=[held, *jobs]), PolicyConfig(name="berth"), NOW, is_predicted=True
    )
    asked: list[str] = []

    def may_take(candidate: RunningJob) -> bool:
        asked.append(candidate.job.id)
        return True

    reclaim = plan_reclaim(
        state,
        node_indexes=range(len(nodes)),
        gpu_count=4,
        free_on_node=lambda _i: [],
        incoming={},
        excluded_jobs=set(),
        is_single_node=True,
        may_take=may_take,
        is_high_class=True,
    )
    assert reclaim is not None
    assert [v.running.job.id for v in reclaim.victims] == ["on-b1"]
    assert asked == ["on-b1"]
