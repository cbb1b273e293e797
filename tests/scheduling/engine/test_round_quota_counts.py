"""`Round._init_quotas` counts a one-type job's GPUs in one step (docs/benchmarks.md, Speed XIV):
the same ``used``, ``used_by_type`` and ``guaranteed_used`` as counting GPU by GPU, keys in the
same order, for one-type, mixed-type and unknown-GPU jobs, with and without quotas; and the
round's shares are the snapshot's by name (the last of a repeated name)."""

from __future__ import annotations

import random

import pytest

from scheduling.engine.policies.berth import BERTH
from scheduling.engine.round import Round
from scheduling.engine.types import PolicyConfig, ProjectShare, RunningJob
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 100_000.0


def _counts_the_long_way(
    runs: tuple[RunningJob, ...], type_of: dict[int, str], has_quotas: bool
) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    used: dict[str, int] = {}
    by_type: dict[tuple[str, str], int] = {}
    guaranteed: dict[tuple[str, str], int] = {}
    for run in runs:
        project = run.job.project
        used[project] = used.get(project, 0) + len(run.gpu_ids)
        for gpu in run.gpu_ids:
            key = (project, type_of.get(gpu, ""))
            by_type[key] = by_type.get(key, 0) + 1
            if has_quotas and not run.is_preemptible:
                guaranteed[key] = guaranteed.get(key, 0) + 1
    return used, by_type, guaranteed


@pytest.mark.parametrize("seed", range(40))
def test_quota_counts_equal_gpu_by_gpu(seed: int) -> None:
    rng = random.Random(seed)
    nodes = (
        make_nodes(6, 4, gpu_type="A100")
        + make_nodes(6, 4, gpu_type="H100", first_gpu=24, prefix="h")
        + make_nodes(4, 2, gpu_type="T4", first_gpu=48, prefix="t")
    )
    gpus = [g for node in nodes for g in node.gpu_ids] + [900, 901]  # two GPUs the inventory lacks
    rng.shuffle(gpus)
    runs = []
    for i in range(rng.randint(1, 12)):
        if not gpus:
            break
        if rng.random() < 0.5:  # one node's GPUs (one type), else any mix
            node = rng.choice(nodes)
            take = [g for g in node.gpu_ids if g in gpus][: rng.randint(1, 4)]
        else:
            take = gpus[: rng.randint(1, 6)]
        if not take:
            continue
        for g in take:
            gpus.remove(g)
        request = job(f"r{i}", len(take), project=rng.choice("abc"))
        runs.append(running(request, take, is_preemptible=rng.random() < 0.4))
    with_quotas = seed % 2 == 0
    projects = (
        ProjectShare("a", guaranteed=(("A100", 4),) if with_quotas else ()),
        ProjectShare("b", decayed_usage=1.0),
        ProjectShare("b", weight=2.0),  # a repeated name: the round keeps the last
    )
    snap = snapshot(nodes, running_jobs=runs, projects=projects)
    rnd = Round(snap, PolicyConfig(name="berth"), NOW, BERTH)
    type_of = {g: node.gpu_type for node in nodes for g in node.gpu_ids}
    used, by_type, guaranteed = _counts_the_long_way(snap.running, type_of, with_quotas)
    assert rnd.used == used
    assert list(rnd.used_by_type.items()) == list(by_type.items())
    assert list(rnd.guaranteed_used.items()) == list(guaranteed.items())
    assert list(rnd.shares.items()) == [("a", projects[0]), ("b", projects[2])]


def test_a_mixed_job_is_counted_per_type() -> None:
    """The one-step count is taken only when every GPU has the job's first GPU's type."""
    nodes = make_nodes(1, 2, gpu_type="A100") + make_nodes(1, 2, gpu_type="H100", first_gpu=2, prefix="h")
    runs = (running(job("m", 3, project="a"), (0, 2, 1)),)
    projects = (ProjectShare("a", guaranteed=(("A100", 1),)),)
    rnd = Round(snapshot(nodes, running_jobs=runs, projects=projects), PolicyConfig(name="berth"), NOW, BERTH)
    assert rnd.used_by_type == {("a", "A100"): 2, ("a", "H100"): 1}
    assert rnd.guaranteed_used == {("a", "A100"): 2, ("a", "H100"): 1}
