"""Static's wide jobs, kept from the last round for the very same pending jobs.

`partition.open_span` keeps the last round's pending tuple and its wide ids on the topology: a
queue that holds those very objects first (a replay's queue keeps its order: ends leave it as
it was, arrivals add jobs behind it) scans only the jobs behind them.  docs/benchmarks.md,
"Speed XII".  Each case compares the round's wide set with the one computed from nothing (the
kept entry dropped first).
"""

from __future__ import annotations

import random

from scheduling.engine.policies.static import STATIC
from scheduling.engine.round import Round
from scheduling.engine.types import ClusterSnapshot, JobKind, JobRequest, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, snapshot

NOW = 1_000_000.0
NODES = make_nodes(12, 1)
CONFIG = PolicyConfig(name="static", interactive_partition=("n10", "n11"))  # batch side: 10 GPUs


def _snap(pending: list[JobRequest]) -> ClusterSnapshot:
    return snapshot(NODES, pending=pending)


def _wide(snap: ClusterSnapshot, *, fresh: bool) -> frozenset[str]:
    if fresh:
        derived = Round(snap, CONFIG, NOW, STATIC).state.topology.derived
        for key in [k for k in derived if k[0] == "wide_last"]:
            del derived[key]
    return Round(snap, CONFIG, NOW, STATIC).wide


def test_kept_wide_jobs_follow_the_queue() -> None:
    jobs = [job(f"j{i}", size, submit_at=float(i)) for i, size in enumerate((11, 2, 12, 1, 11))]
    first = _snap(jobs)
    assert _wide(first, fresh=True) == {"j0", "j2", "j4"}
    # the same jobs again, in a new tuple: the kept answer
    assert _wide(_snap(list(jobs)), fresh=False) == {"j0", "j2", "j4"}
    # arrivals behind them: scanned
    grown = [*jobs, job("new-wide", 20), job("new-small", 3)]
    assert _wide(_snap(grown), fresh=False) == {"j0", "j2", "j4", "new-wide"}
    # a wide job started (gone from the middle): not the same jobs in the same places
    assert _wide(_snap([jobs[0], *jobs[2:]]), fresh=False) == {"j0", "j2", "j4"}
    assert _wide(_snap([jobs[1], *jobs[3:]]), fresh=False) == {"j4"}
    # a job back under the same id as another object (requeued narrower): judged anew
    assert _wide(_snap([job("j0", 2), *jobs[1:]]), fresh=False) == {"j2", "j4"}
    # fewer jobs than last time, the same first ones
    assert _wide(_snap(jobs[:2]), fresh=False) == {"j0"}


def test_kept_wide_jobs_equal_the_scan_on_random_queues() -> None:
    """A queue that grows, loses jobs and gets sessions and constrained jobs, round after round."""
    rng = random.Random(7)
    queue: list[JobRequest] = []
    for step in range(200):
        roll = rng.random()
        if roll < 0.5 or not queue:
            queue.append(
                job(
                    f"q{step}",
                    rng.choice((1, 2, 9, 10, 11, 12, 30)),
                    kind=JobKind.INTERACTIVE if rng.random() < 0.1 else JobKind.BATCH,
                    **({"gpu_type": "A100"} if rng.random() < 0.1 else {}),  # type: ignore[arg-type]
                )
            )
        elif roll < 0.7:
            queue.pop(rng.randrange(len(queue)))
        snap = _snap(list(queue))
        kept = _wide(snap, fresh=False)
        assert kept == _wide(snap, fresh=True)
