"""`preemption.plan_reclaim`'s per-round caches and its pruning (nodes with nothing free or
arriving whose victims cannot beat the best node, `_victims_floor` / `_victims_bound`) give
the plan of the exhaustive search: every node costed, victims sorted per search (the search
as it was before the pruning, written out here), on random clusters."""

from __future__ import annotations

import random

import pytest

from scheduling.engine.cluster import RoundState
from scheduling.engine.preemption import Reclaim, _assemble, plan_reclaim, takeable_on, victim_of
from scheduling.engine.types import PolicyConfig, RunningJob
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0


def _planned(
    state: RoundState,
    *,
    gpu_count: int,
    free: dict[int, list[int]],
    incoming: dict[int, float],
    excluded: set[str],
    single: bool,
    refused: set[str],
    high: bool,
    nodes: range | tuple[int, ...],
    free_nodes: set[int] | None,
) -> Reclaim | None:
    """`plan_reclaim` on the same arguments `_exhaustive` takes (and the round's free nodes)."""
    return plan_reclaim(
        state,
        node_indexes=nodes,
        gpu_count=gpu_count,
        free_on_node=lambda i: list(free.get(i, [])),
        incoming=incoming,
        excluded_jobs=excluded,
        is_single_node=single,
        may_take=lambda r: r.job.id not in refused,
        is_high_class=high,
        free_nodes=free_nodes,
    )


def _exhaustive(
    state: RoundState,
    *,
    gpu_count: int,
    free: dict[int, list[int]],
    incoming: dict[int, float],
    excluded: set[str],
    single: bool,
    refused: set[str],
    high: bool,
    nodes: range | tuple[int, ...],
) -> Reclaim | None:
    best: tuple[tuple[float, float, int], Reclaim] | None = None
    pool_free: list[int] = []
    pool_incoming: list[tuple[float, int]] = []
    pool_victims = {}
    for index in nodes:
        node = state.nodes[index]
        if single and len(node.gpu_ids) < gpu_count:
            continue
        node_free = free.get(index, [])
        arriving = sorted((incoming[g], g) for g in node.gpu_ids if g in incoming)
        victims = {
            r.job.id: victim_of(state, r, is_high_class=high)
            for r in takeable_on(state, index)
            if r.job.id not in excluded and r.job.id not in refused
        }
        if not single:
            pool_free.extend(node_free)
            pool_incoming.extend(arriving)
            pool_victims.update(victims)
            continue
        on_node = sum(
            sum(1 for g in v.running.gpu_ids if state.gpu_node[g] == index) for v in victims.values()
        )
        if len(node_free) + len(arriving) + on_node < gpu_count:
            continue
        reclaim = _assemble(
            state, node_free, arriving, victims.values(), gpu_count, index, is_high_class=high
        )
        if reclaim is None:
            continue
        cost = (reclaim.ready_at, sum(v.lost_gpu_s for v in reclaim.victims), index)
        if best is None or cost < best[0]:
            best = (cost, reclaim)
    if not single:
        return _assemble(
            state,
            pool_free,
            sorted(pool_incoming),
            pool_victims.values(),
            gpu_count,
            None,
            is_high_class=high,
        )
    return None if best is None else best[1]


def _cluster(rng: random.Random) -> tuple[RoundState, dict[int, list[int]], dict[int, float], set[str]]:
    nodes = make_nodes(rng.randint(3, 14), rng.choice((2, 4, 8)))
    jobs: list[RunningJob] = []
    free: dict[int, list[int]] = {}
    incoming: dict[int, float] = {}
    count = 0
    free_share = rng.choice((0.0, 0.05, 0.2))  # mostly busy clusters: the floor's case
    for index, node in enumerate(nodes):
        gpus = list(node.gpu_ids)
        while gpus:
            if rng.random() < free_share:
                free.setdefault(index, []).append(gpus.pop(0))
                continue
            size = min(len(gpus), rng.choice((1, 1, 2, 4)))
            taken, gpus = gpus[:size], gpus[size:]
            count += 1
            consent = rng.random() < 0.7
            request = job(
                f"r{count}",
                size,
                requested_s=50_000,
                is_preemptible=consent,
                is_checkpointable=consent and rng.random() < 0.5,
                checkpoint_interval_s=rng.choice((600.0, 1_800.0)),
            )
            # some started within the grace (kill later than the grace: "slow" victims)
            started = NOW - rng.choice((5.0, 20.0, 400.0, rng.uniform(0, 40_000)))
            if rng.random() < 0.1:
                for gpu in taken:  # in grace: arriving for the demand
                    incoming[gpu] = NOW + rng.choice((0.0, 10.0, 30.0))
            jobs.append(running(request, taken, started_at=started, is_preemptible=rng.random() < 0.3))
    state = RoundState(snapshot(nodes, running_jobs=jobs), PolicyConfig(name="berth"), NOW, is_predicted=True)
    excluded = {r.job.id for r in jobs if rng.random() < 0.1}
    return state, free, incoming, excluded


@pytest.mark.parametrize("seed", range(300))
def test_the_pruned_search_finds_the_exhaustive_plan(seed: int) -> None:
    rng = random.Random(seed)
    state, free, incoming, excluded = _cluster(rng)
    refused = {f"r{i}" for i in range(200) if rng.random() < 0.15}  # what may_take says no to
    everywhere = range(len(state.nodes))
    # some nodes only (a demand's GPU types), which the floor order's index must respect
    some = tuple(i for i in everywhere if rng.random() < 0.6)
    for nodes in (everywhere, some):
        for single in (True, False):
            for high in (True, False):
                gpu_count = rng.choice((1, 1, 2, 3, 4, 8))
                expected = _exhaustive(
                    state,
                    gpu_count=gpu_count,
                    free=free,
                    incoming=incoming,
                    excluded=excluded,
                    single=single,
                    refused=refused,
                    high=high,
                    nodes=nodes,
                )
                for free_nodes in (set(free), None, set(free)):  # the round's caches warm after the first
                    got = _planned(
                        state,
                        gpu_count=gpu_count,
                        free=free,
                        incoming=incoming,
                        excluded=excluded,
                        single=single,
                        refused=refused,
                        high=high,
                        nodes=nodes,
                        free_nodes=free_nodes,
                    )
                    assert got == expected, (seed, nodes, single, high, gpu_count, free_nodes)


@pytest.mark.parametrize("seed", range(150))
def test_the_search_stays_exhaustive_while_the_round_signals_jobs(seed: int) -> None:
    """One state searched again and again, as a round does, its signalled set growing between
    the searches (the floor index keeps floors computed with fewer signalled jobs) and once
    replaced by another, smaller set."""
    rng = random.Random(seed)
    state, free, incoming, _ = _cluster(rng)
    refused = {f"r{i}" for i in range(200) if rng.random() < 0.15}
    nodes = tuple(range(len(state.nodes)))
    signalled: set[str] = set()
    ids = sorted(r.job.id for r in state.snapshot.running)
    for step in range(12):
        if step == 8:
            signalled = set(rng.sample(sorted(signalled), len(signalled) // 2)) if signalled else set()
        elif ids:
            signalled.add(rng.choice(ids))
        high = rng.random() < 0.5
        gpu_count = rng.choice((1, 1, 2, 3, 4))
        expected = _exhaustive(
            state,
            gpu_count=gpu_count,
            free=free,
            incoming=incoming,
            excluded=signalled,
            single=True,
            refused=refused,
            high=high,
            nodes=nodes,
        )
        got = _planned(
            state,
            gpu_count=gpu_count,
            free=free,
            incoming=incoming,
            excluded=signalled,
            single=True,
            refused=refused,
            high=high,
            nodes=nodes,
            free_nodes=set(free),
        )
        assert got == expected, (seed, step, gpu_count, high)


def _spanning_cluster(rng: random.Random) -> tuple[RoundState, dict[int, list[int]], dict[int, float]]:
    """Jobs laid over the GPUs in order, so many span two or more nodes (a multi-node gang)."""
    nodes = make_nodes(rng.randint(3, 12), rng.choice((1, 2, 4)))
    flat = [gpu for node in nodes for gpu in node.gpu_ids]
    jobs: list[RunningJob] = []
    free: dict[int, list[int]] = {}
    incoming: dict[int, float] = {}
    node_of = {gpu: index for index, node in enumerate(nodes) for gpu in node.gpu_ids}
    at = 0
    while at < len(flat):
        if rng.random() < 0.15:
            free.setdefault(node_of[flat[at]], []).append(flat[at])
            at += 1
            continue
        size = rng.choice((1, 2, 3, 5))
        taken, at = flat[at : at + size], at + size
        consent = rng.random() < 0.7
        request = job(
            f"s{len(jobs)}",
            len(taken),
            requested_s=50_000,
            is_preemptible=consent,
            is_checkpointable=consent and rng.random() < 0.5,
        )
        if rng.random() < 0.1:
            for gpu in taken:
                incoming[gpu] = NOW + rng.choice((0.0, 30.0))
        started = NOW - rng.choice((5.0, 400.0, rng.uniform(0, 40_000)))
        jobs.append(running(request, taken, started_at=started, is_preemptible=rng.random() < 0.3))
    state = RoundState(snapshot(nodes, running_jobs=jobs), PolicyConfig(name="berth"), NOW, is_predicted=True)
    return state, free, incoming


@pytest.mark.parametrize("seed", range(200))
def test_a_multi_node_demand_takes_the_victims_of_the_exhaustive_search(seed: int) -> None:
    """A multi-node demand's victims are collected per running job (`takeable_on_nodes`), not
    per node: a gang with GPUs on a node of the demand is a victim (freeing all its GPUs), one
    with none there is not, one signalled or refused never; the plan equals the per-node search,
    also while the round's signalled set grows between searches of the same node list."""
    rng = random.Random(seed)
    state, free, incoming = _spanning_cluster(rng)
    ids = sorted(r.job.id for r in state.snapshot.running)
    refused = {i for i in ids if rng.random() < 0.15}
    some = tuple(i for i in range(len(state.nodes)) if rng.random() < 0.5) or (0,)
    signalled: set[str] = set()
    for step in range(6):
        if ids and step:
            signalled.add(rng.choice(ids))
        gpu_count = rng.randint(2, 9)
        high = rng.random() < 0.5
        expected = _exhaustive(
            state, gpu_count=gpu_count, free=free, incoming=incoming, excluded=signalled, single=False,
            refused=refused, high=high, nodes=some,
        )  # fmt: skip
        got = _planned(
            state, gpu_count=gpu_count, free=free, incoming=incoming, excluded=signalled, single=False,
            refused=refused, high=high, nodes=some, free_nodes=None,
        )  # fmt: skip
        assert got == expected, (seed, step, some, gpu_count)
