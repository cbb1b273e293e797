"""Easy's and static's still ticks on hand-made snapshots (`scheduling.sim.replay_still_order`,
`replay_still._next_fit_change`): a queue order the rule takes as deciding alike plans, with the
real engine, the still round's no-op as the replay reads it (starts, preemptions, idle reasons,
wake), and each order it refuses plans a start (so the refusal is needed).  The engine's order
is forced through `stages.order.priority_order` (docs/benchmarks.md, "Speed XV")."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from scheduling.engine import plan_round
from scheduling.engine.policies.easy import EASY as EASY_ROUND
from scheduling.engine.round import Round
from scheduling.engine.stages import order as order_stage
from scheduling.engine.stages.compose import plan_and_round
from scheduling.engine.types import ClusterSnapshot, JobKind, JobRequest, Plan, PolicyConfig
from scheduling.sim import replay_still
from scheduling.sim.replay_still_order import Passes, _window_end, decides_alike, pass_heads
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

T = 100_000.0
DEPTH = 3


def _easy() -> tuple[ClusterSnapshot, dict[str, JobRequest]]:
    """Six 1-GPU nodes, 0-3 busy until T + 1,000, 4-5 free.  W (6 GPUs) is the top job, its
    shadow at T + 1,000 holds 4-5; A and B (3 GPUs) find too few free; X (2 GPUs, 10,000 s)
    would run into the shadow; D (1 GPU, 100 s) ends before it and starts wherever it is
    considered."""
    jobs = {
        "W": job("W", 6, submit_at=T - 900, requested_s=3_600),
        "A": job("A", 3, submit_at=T - 800, requested_s=3_600),
        "B": job("B", 3, submit_at=T - 700, requested_s=3_600),
        "X": job("X", 2, submit_at=T - 600, requested_s=10_000),
        "D": job("D", 1, submit_at=T - 500, requested_s=100),
    }
    busy = job("R", 4, submit_at=T - 2_000, requested_s=2_000)
    snap = snapshot(
        make_nodes(6, 1),
        running_jobs=[running(busy, [0, 1, 2, 3], started_at=T - 1_000)],
        pending=list(jobs.values()),
    )
    return snap, jobs


def _static() -> tuple[ClusterSnapshot, dict[str, JobRequest]]:
    """`_easy`'s batch side on nodes 0-5 and a 2-node partition (6-7): a session runs on 6
    until T + 500; S1 (2 GPUs) is the session pass's top job (its shadow holds 7); S2
    (1 GPU, 3,600 s) would run into it; S4 and S5 (2 GPUs) find too few free; S3 (1 GPU,
    100 s) starts wherever it is considered."""
    snap, jobs = _easy()
    sessions = {
        "S1": job("S1", 2, submit_at=T - 400, requested_s=3_600, kind=JobKind.INTERACTIVE),
        "S2": job("S2", 1, submit_at=T - 300, requested_s=3_600, kind=JobKind.INTERACTIVE),
        "S3": job("S3", 1, submit_at=T - 200, requested_s=100, kind=JobKind.INTERACTIVE),
        "S4": job("S4", 2, submit_at=T - 100, requested_s=3_600, kind=JobKind.INTERACTIVE),
        "S5": job("S5", 2, submit_at=T - 50, requested_s=3_600, kind=JobKind.INTERACTIVE),
    }
    busy = running(
        job("Q", 1, submit_at=T - 1_000, requested_s=1_000, kind=JobKind.INTERACTIVE), [6], started_at=T - 500
    )
    snap = snapshot(
        make_nodes(8, 1),
        running_jobs=[*snap.running, busy],
        pending=[*jobs.values(), *sessions.values()],
    )
    return snap, {**jobs, **sessions}


EASY = PolicyConfig(name="easy", backfill_depth=DEPTH)
STATIC = PolicyConfig(name="static", backfill_depth=DEPTH, interactive_partition=("n6", "n7"))


def _plan(
    monkeypatch: pytest.MonkeyPatch,
    snap: ClusterSnapshot,
    config: PolicyConfig,
    order: list[JobRequest],
    at: float = T,
) -> Plan:
    """The real engine's plan with its queue order forced to ``order``."""
    monkeypatch.setattr(order_stage, "priority_order", lambda _state: list(order))
    return plan_round(snap, policy=config, now=at)


def _plan_and_round(
    monkeypatch: pytest.MonkeyPatch, snap: ClusterSnapshot, order: list[JobRequest]
) -> tuple[Plan, Round]:
    """`_plan` under easy, with the round (what the replay keeps of a still round)."""
    monkeypatch.setattr(order_stage, "priority_order", lambda _state: list(order))
    plan, rnd, _queue = plan_and_round(EASY_ROUND, snap, EASY, T)
    return plan, rnd


def _read(plan: Plan) -> tuple[tuple[str, ...], int, Counter[str], float | None]:
    """What the replay reads of a plan (`replay_still.still_plan_difference`)."""
    reasons = Counter(reason.value for _gpu, reason in plan.idle)
    return tuple(s.job_id for s in plan.starts), len(plan.preemptions), reasons, plan.next_round_at


def _ids(jobs: dict[str, JobRequest], names: str) -> list[JobRequest]:
    return [jobs[name] for name in names.split()]


def _check_reorder(
    monkeypatch: pytest.MonkeyPatch,
    snap: ClusterSnapshot,
    policy: PolicyConfig,
    still_order: list[JobRequest],
    order: list[JobRequest],
    alike: bool,
    starts: tuple[str, ...],
) -> Passes:
    """Plan ``still_order`` (a no-op), then ``order``: `decides_alike` says ``alike``, and the
    plan of ``order`` is the still no-op when it does, else it starts ``starts``; the passes."""
    split = policy.name == "static"
    still = _plan(monkeypatch, snap, policy, still_order)
    assert not still.starts
    assert not still.preemptions
    passes = pass_heads(still_order, still, snap, split=split, depth=DEPTH)
    assert passes is not None
    assert decides_alike(order, passes, DEPTH, split=split) is alike
    _assert_planned(_plan(monkeypatch, snap, policy, order), still, alike, starts)
    return passes


def _assert_planned(planned: Plan, still: Plan, alike: bool, starts: tuple[str, ...]) -> None:
    """A tick's plan: the still no-op when its order decides alike, else it starts ``starts``."""
    if alike:
        assert _read(planned) == _read(still)
    else:
        assert tuple(s.job_id for s in planned.starts) == starts


@pytest.mark.parametrize(
    ("tick", "alike", "starts"),
    [
        ("W B X A D", True, ()),  # a swap inside the window behind the top job
        ("W X B A D", True, ()),
        ("W A D B X", False, ("D",)),  # D, beyond the window, comes into it
        ("W A B D X", False, ("D",)),  # (the window's last place)
        ("X W A B D", False, ("X",)),  # the top job changes: X heads the queue and fits
        ("A W B X D", False, ("X",)),  # A the top job: its shadow holds 0-2, so X fits on 4-5
    ],
)
def test_easy_reorders(
    monkeypatch: pytest.MonkeyPatch, tick: str, alike: bool, starts: tuple[str, ...]
) -> None:
    snap, jobs = _easy()
    passes = _check_reorder(monkeypatch, snap, EASY, _ids(jobs, "W A B X D"), _ids(jobs, tick), alike, starts)
    assert passes[0][1] == 0  # W is the top job


def test_a_window_that_holds_the_whole_rest_takes_any_reorder(monkeypatch: pytest.MonkeyPatch) -> None:
    # with every job behind the top job inside the window, any reorder of them decides alike
    snap, jobs = _easy()
    snap = snapshot(snap.nodes, running_jobs=snap.running, pending=_ids(jobs, "W A B X"))
    still_order = _ids(jobs, "W A B X")
    still = _plan(monkeypatch, snap, EASY, still_order)
    passes = pass_heads(still_order, still, snap, split=False, depth=DEPTH)
    assert passes is not None
    for tick in ("W X B A", "W B X A", "W X A B"):
        order = _ids(jobs, tick)
        assert decides_alike(order, passes, DEPTH, split=False)
        assert _read(_plan(monkeypatch, snap, EASY, order)) == _read(still)


@pytest.mark.parametrize(
    ("tick", "alike", "starts"),
    [
        ("W S1 A S2 B S4 X S5 D S3", True, ()),  # sessions and batch jobs interleaved otherwise
        ("S1 S4 W B X A S2 S5 S3 D", True, ()),  # a swap in each pass's window
        ("S1 W S5 S4 S2 S3 A B X D", True, ()),
        ("S2 S1 W S4 S5 S3 A B X D", False, ("S2",)),  # the session top changes: S2 heads and fits
        ("S1 W S2 S3 S4 S5 A B X D", False, ("S3",)),  # S3 comes into the session window
        ("W A D B X S1 S2 S4 S5 S3", False, ("D",)),  # D comes into the batch window
    ],
)
def test_static_reorders(
    monkeypatch: pytest.MonkeyPatch, tick: str, alike: bool, starts: tuple[str, ...]
) -> None:
    snap, jobs = _static()
    still_order = _ids(jobs, "S1 W S2 S4 S5 S3 A B X D")
    passes = _check_reorder(monkeypatch, snap, STATIC, still_order, _ids(jobs, tick), alike, starts)
    assert [top for _queue, top, _window in passes] == [0, 0]  # W, S1


def test_a_fit_change_of_a_job_that_did_not_start_is_no_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # D (100 s, 160 s with the overdue epsilon) beyond the window stops fitting before W's
    # shadow (T + 1,000) at T + 840: with
    # the still round acting on nothing only the holders' durations count, and planned past
    # that instant the round is the still no-op (with D in the window, D would have started)
    snap, jobs = _easy()
    still_order = _ids(jobs, "W A B X D")
    still = _plan(monkeypatch, snap, EASY, still_order)
    every = replay_still._next_fit_change(snap, still, EASY, T, free_gpus=2)
    holders = replay_still._next_fit_change(snap, still, EASY, T, free_gpus=2, holders_only=True)
    assert every == pytest.approx(T + 840, abs=0.01)
    assert holders == math.inf  # W's 3,600 s never fit before its own shadow
    for at in (T + 839, T + 841, T + 901, T + 990, T + 999):
        assert _read(_plan(monkeypatch, snap, EASY, still_order, at)) == _read(still)


def test_a_plan_that_starts_keeps_every_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    # a still round whose plan started something (its start refused by the backend) is not one
    # the monotonicity argument covers: `_is_still` then passes holders_only=False
    snap, jobs = _easy()
    plan = _plan(monkeypatch, snap, EASY, _ids(jobs, "W D A B X"))
    assert [s.job_id for s in plan.starts] == ["D"]
    assert not replay_still._acted_on_nothing(plan)


def _long_tail() -> tuple[ClusterSnapshot, dict[str, JobRequest]]:
    """`_easy` with more jobs behind the window: E and F (3 GPUs) find too few free, N asks
    for a GPU type the cluster lacks (admit refuses it: it is not counted in the window)."""
    snap, jobs = _easy()
    more = {
        "E": job("E", 3, submit_at=T - 450, requested_s=3_600),
        "F": job("F", 3, submit_at=T - 440, requested_s=3_600),
        "N": job("N", 1, submit_at=T - 430, requested_s=100, gpu_type="H100"),
    }
    jobs.update(more)
    return snapshot(snap.nodes, running_jobs=snap.running, pending=list(jobs.values())), jobs


@pytest.mark.parametrize(
    ("still_at", "tick", "alike", "starts"),
    [
        ("W A B X E D F", "W A B X F E D", True, ()),  # only the jobs beyond the window reorder
        ("W A B X E D F", "W X A B D F E", True, ()),  # both
        ("W A B X E D F", "W A B D X E F", False, ("D",)),  # D comes into the window
        ("W A B X E D F", "W A B X E D F", True, ()),
        # N, refused by admit, is not counted: the window ends after X, D is the first beyond it
        ("W A B X N D E F", "W A B N X D E F", True, ()),
        ("W A B X N D E F", "W A N B D X E F", False, ("D",)),
    ],
)
def test_the_window_read_from_the_still_round(
    monkeypatch: pytest.MonkeyPatch, still_at: str, tick: str, alike: bool, starts: tuple[str, ...]
) -> None:
    snap, jobs = _long_tail()
    if "N" not in still_at:
        snap = snapshot(
            snap.nodes, running_jobs=snap.running, pending=[j for j in snap.pending if j.id != "N"]
        )
    still_order = _ids(jobs, still_at)
    still, rnd = _plan_and_round(monkeypatch, snap, still_order)
    assert not still.starts
    passes = pass_heads(still_order, still, snap, split=False, depth=DEPTH, rnd=rnd)
    assert passes is not None
    order = _ids(jobs, tick)
    assert decides_alike(order, passes, DEPTH, split=False) is alike
    _assert_planned(_plan(monkeypatch, snap, EASY, order), still, alike, starts)
    # without the round (its verdicts) only a reorder within the depth's places is taken
    strict = pass_heads(still_order, still, snap, split=False, depth=DEPTH)
    assert strict is not None
    tail_moves = order[1 + DEPTH :] != still_order[1 + DEPTH :]
    assert decides_alike(order, strict, DEPTH, split=False) is (alike and not tail_moves)


def test_the_window_end_is_the_engines_beyond_window_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    # `_window_end` reads the engine's own verdict for the first job beyond the window
    snap, jobs = _long_tail()
    still_order = _ids(jobs, "W A B X N D E F")
    _still, rnd = _plan_and_round(monkeypatch, snap, still_order)
    assert _window_end(rnd, still_order, 0, DEPTH) == still_order.index(jobs["D"])
    # a queue the depth covers has no window end to read
    assert _window_end(rnd, still_order[:4], 0, DEPTH) is None
