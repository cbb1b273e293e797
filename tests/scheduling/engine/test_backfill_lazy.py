"""Backfill's inert candidates recorded when first read give the plans of the walk over all.

`backfill_lazy.walk_lazily` (easy, static) walks only the candidates that some free GPUs could
fit and records the others' verdicts when they are first read.  Each test compares the whole
plan (starts, preemptions, reservations, releases, idle reasons, notes, wake-up and every
explanation, in order) with two references: `backfill.walk` over every candidate (the walk as
it was before) and `test_speed_shortcuts._long_way` (every candidate admitted, tried and
explained in turn).  The snapshots are random: long queues of mixed sizes on one-GPU and
four-GPU nodes of two types, projects with and without limits and quotas, sessions, constrained
jobs, the top job's owner's other jobs, jobs that start mid-pass, windows shorter than the queue
and repeated ids.  docs/benchmarks.md, "Speed XVI".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from scheduling.engine import plan_round
from scheduling.engine.stages import backfill, backfill_lazy
from scheduling.engine.stages.backfill_verdicts import CheapVerdicts
from scheduling.engine.types import GpuType, JobKind, JobRequest, PolicyConfig, ProjectShare
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot
from tests.scheduling.engine.test_speed_shortcuts import _long_way

if TYPE_CHECKING:
    from scheduling.engine.round import Round
    from scheduling.engine.types import ClusterSnapshot

NOW = 1_000_000.0


def _walk_all(rnd: Round, rest: Sequence[JobRequest]) -> None:
    """The reference: `backfill.walk` over every candidate, nothing deferred."""
    backfill.walk(rnd, rest, backfill.Admitted(rnd), CheapVerdicts(rnd))


def _snapshot(rng: random.Random, *, limits: bool) -> ClusterSnapshot:
    """A busy cluster (the top job waits) and a long queue, most of it wider than what is free."""
    two_types = rng.random() < 0.4
    nodes = make_nodes(20, 1)
    if two_types:
        nodes += make_nodes(3, 4, gpu_type="V100", first_gpu=20, prefix="v")
    gpus = 32 if two_types else 20
    busy = [
        running(
            job(
                f"r{i}", 1, project="busy", user=rng.choice("abcd"), requested_s=rng.choice((600.0, 36_000.0))
            ),
            (gpu,),
            started_at=NOW - 300.0,
        )
        for i, gpu in enumerate(rng.sample(range(gpus), rng.randint(6, gpus - 2)))
    ]
    pending = []
    for i in range(rng.randint(40, 400)):
        roll = rng.random()
        extra: dict[str, object] = {}
        if roll < 0.04:
            extra["gpu_type"] = "V100" if two_types else "A100"  # constrained
        elif roll < 0.06:
            extra["gpu_type"] = "H100"  # no such type: admit refuses it
        elif roll < 0.08:
            extra["min_memory_gib"] = -1.0  # unconstrained, another shape
        pending.append(
            job(
                f"j{i}",
                rng.choice((1, 1, 1, 2, 2, 3, 4, 6, 8, 12, 16, 24, 40)),  # 40: wider than the cluster
                submit_at=rng.choice((NOW - 900_000.0, NOW - 700_000.0, rng.uniform(0, NOW))),
                requested_s=rng.choice((60.0, 600.0, 7_200.0, 86_400.0)),
                project=rng.choice(
                    ("zero", "zero", "free", "busy", "unknown") + (("capped",) if limits else ())
                ),
                user=rng.choice("abcd"),
                kind=JobKind.INTERACTIVE if rng.random() < 0.06 else JobKind.BATCH,
                is_preemptible=rng.random() < 0.5,
                is_checkpointable=rng.random() < 0.3,
                **extra,
            )
        )
    for _ in range(rng.choice((0, 0, 0, 1, 3))):
        # a repeated id on another job, narrow or wide: the walk over all, as before
        other = pending[rng.randrange(len(pending))]
        pending.append(
            job(other.id, rng.choice((1, 2, 40)), submit_at=rng.uniform(0, NOW), user=rng.choice("abcd"))
        )
    projects = [
        ProjectShare(name="zero", guaranteed=(("A100", 0),), decayed_usage=5.0),  # the overlay's
        ProjectShare(name="free", decayed_usage=1.0),
        ProjectShare(name="busy", decayed_usage=50.0),
    ]
    if limits:
        projects.append(ProjectShare(name="capped", borrow_limit=6, decayed_usage=1.0))
    return snapshot(
        nodes,
        running_jobs=busy,
        pending=pending,
        projects=projects,
        gpu_types=(GpuType(name="A100"), GpuType(name="V100")) if two_types else None,
    )


def _config(rng: random.Random, policy: str) -> PolicyConfig:
    return PolicyConfig(
        name=policy,
        backfill_depth=rng.choice((3, 30, 1_000, 1_000)),
        interactive_partition=tuple(f"n{i}" for i in range(14, 20)) if policy == "static" else (),
    )


def _compare(seed: int, policy: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """Plans of the new backfill and both references on one random snapshot; how many passes
    deferred verdicts."""
    rng = random.Random(seed)
    snap = _snapshot(rng, limits=seed % 3 == 0)
    config = _config(rng, policy)
    deferred = [0]
    lazily = backfill_lazy.walk_lazily

    def counted(*args: object) -> bool:
        done = lazily(*args)  # type: ignore[arg-type]
        deferred[0] += done
        return done

    with monkeypatch.context() as patched:
        patched.setattr(backfill, "walk_lazily", counted)
        new = plan_round(snap, config, NOW)
    with monkeypatch.context() as patched:
        patched.setattr(backfill, "backfill", _walk_all)
        walked = plan_round(snap, config, NOW)
    with monkeypatch.context() as patched:
        patched.setattr(backfill, "backfill", _long_way)
        long_way = plan_round(snap, config, NOW)
    assert new == walked  # starts, reservations, idle reasons, notes, wake-up, every explanation
    assert new == long_way
    return deferred[0]


@pytest.mark.parametrize("policy", ["static", "easy", "berth"])
def test_plans_equal_the_walk_over_every_candidate(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    deferred = sum(_compare(seed, policy, monkeypatch) for seed in range(60))
    if policy == "berth":
        assert deferred == 0  # it reclaims: every candidate is walked
    else:
        assert deferred >= 20  # the lazy path ran on many snapshots (not with limits or repeated ids)
