"""The common backfill candidate told "too few GPUs free" from what the pass last read.

`backfill.backfill` reads the free GPUs, the top job and its too-few verdicts for the common
job (unconstrained batch work of a project without a limit) once (`CheapVerdicts.plain_epoch`),
and again only after a call that may have changed them (a start, a claim, a wide job tried); a
common job wider than that count gets the verdict of its size, unless it is the top job's owner's
(whose sentence names the top job).  docs/benchmarks.md, "Speed XII".

Each test compares the plan (starts, reservations, idle reasons, every explanation) with the
long way (every candidate admitted, tried and explained in turn) on queues where jobs start in
the middle of the pass, so the free count moves between too-few jobs.
"""

from __future__ import annotations

import random

import pytest

from scheduling.engine import plan_round
from scheduling.engine.stages import backfill
from scheduling.engine.types import JobKind, JobRequest, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot
from tests.scheduling.engine.test_speed_shortcuts import _long_way

NOW = 1_000_000.0


def _plans(
    pending: list[JobRequest], policy: str, monkeypatch: pytest.MonkeyPatch, *, gpus: int = 12, busy: int = 4
) -> tuple[object, object]:
    """(shortcut plan, long-way plan) on ``gpus`` one-GPU nodes, ``busy`` of them running a
    long job (the top job's reservation waits for them)."""
    nodes = make_nodes(gpus, 1)
    jobs = [
        running(job(f"r{i}", 1, user="x", requested_s=50_000.0), (i,), started_at=NOW - 60.0)
        for i in range(busy)
    ]
    snap = snapshot(nodes, running_jobs=jobs, pending=pending)
    config = PolicyConfig(name=policy, interactive_partition=(f"n{gpus - 1}",) if policy == "static" else ())
    shortcut = plan_round(snap, config, NOW)
    with monkeypatch.context() as patched:
        patched.setattr(backfill, "backfill", _long_way)
        long_way = plan_round(snap, config, NOW)
    return shortcut, long_way


@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
def test_a_start_mid_pass_changes_the_count_the_next_too_few_job_is_told(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too-few jobs before and after short jobs that start are told the count of their time."""
    pending = [
        job("top", 12, submit_at=0.0, user="a"),  # waits for every GPU: the top job
        job("wide-1", 9, submit_at=1.0, user="b"),  # too few (8 or 7 free)
        job("short-1", 1, submit_at=2.0, user="b", requested_s=60.0),  # starts: one fewer free
        job("wide-2", 9, submit_at=3.0, user="b"),
        job("short-2", 2, submit_at=4.0, user="c", requested_s=60.0),  # starts: two fewer
        job("wide-3", 9, submit_at=5.0, user="b"),
        job("wide-4", 7, submit_at=6.0, user="c"),
    ]
    shortcut, long_way = _plans(pending, policy, monkeypatch)
    assert shortcut == long_way
    said = {p.job_id: p.sentence for p in shortcut.pending}  # type: ignore[attr-defined]
    assert {s.job_id for s in shortcut.starts} == {"short-1", "short-2"}  # type: ignore[attr-defined]
    counts = [said[name].split(" are free")[0].rsplit(" ", 1)[-1] for name in ("wide-1", "wide-2", "wide-3")]
    # 8/7/5 (easy) or 7/6/4 (static), each after its starts; berth's backfill order (shortest
    # work first) tries the short jobs first
    assert len(set(counts)) == (1 if policy == "berth" else 3)
    assert said["wide-4"].split(" are free")[0].endswith(counts[2])


@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
def test_the_top_job_owners_too_few_job_is_told_of_its_own_job(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs of one size and one free count: the top job's owner is shown its job's name,
    another user is not (the verdict of a size is shared only by jobs of other owners)."""
    pending = [
        job("top", 12, submit_at=0.0, user="a", name="train"),
        job("other", 9, submit_at=1.0, user="b"),
        job("mine", 9, submit_at=2.0, user="a"),
        job("other-2", 9, submit_at=3.0, user="c"),
    ]
    shortcut, long_way = _plans(pending, policy, monkeypatch)
    assert shortcut == long_way
    said = {p.job_id: p.sentence for p in shortcut.pending}  # type: ignore[attr-defined]
    assert "\u201ctrain\u201d." in said["mine"]
    assert "another user's job." in said["other"]
    assert said["other-2"] == said["other"]


@pytest.mark.parametrize("policy", ["easy", "static", "berth"])
@pytest.mark.parametrize("seed", range(20))
def test_random_queues_with_starts_between_too_few_jobs(
    policy: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wide and short common jobs mixed with sessions and constrained jobs, of three owners
    (the top job's among them): every explanation as the long way gives it."""
    rng = random.Random(seed)
    pending = [job("top", 24, submit_at=0.0, user="a", name="head")]
    for i in range(60):
        roll = rng.random()
        extra: dict[str, str] = {"gpu_type": "A100"} if roll < 0.05 else {}
        pending.append(
            job(
                f"j{i}",
                rng.choice((1, 1, 2, 3, 8, 12, 16, 20)),
                submit_at=1.0 + i,
                user=rng.choice(("a", "b", "c")),
                requested_s=rng.choice((60.0, 600.0, 90_000.0)),
                kind=JobKind.INTERACTIVE if roll > 0.95 else JobKind.BATCH,
                **extra,
            )
        )
    shortcut, long_way = _plans(pending, policy, monkeypatch, gpus=24, busy=rng.randint(2, 10))
    assert shortcut == long_way
