"""The simulator backend: exact placement, no double allocation, preemption and lost work."""

from __future__ import annotations

import pytest

from scheduling.backends.base import ClusterBackend, ObservedState
from scheduling.backends.simulator import DoubleAllocationError, SimulatorBackend, TransitionKind
from scheduling.engine.types import Plan, PreemptAction, StartAction
from scheduling.sim.inventory import parse_cluster_spec


def _backend(*, strict: bool = False, checkpoint_on_signal: bool = True) -> SimulatorBackend:
    return SimulatorBackend(
        parse_cluster_spec("2x4").nodes, strict=strict, checkpoint_on_signal=checkpoint_on_signal
    )


def _start(job_id: str, gpu_ids: tuple[int, ...]) -> StartAction:
    return StartAction(job_id=job_id, gpu_ids=gpu_ids, node_ids=(), is_preemptible=False, expected_end_at=0.0)


def _preempt(job_id: str, *, at: float, grace: float = 30.0) -> PreemptAction:
    return PreemptAction(job_id=job_id, signal_at=at, kill_at=at + grace, reason="test")


def test_protocol_and_exact_gpus_and_completion_time() -> None:
    backend = _backend()
    assert isinstance(backend, ClusterBackend)
    backend.register("a", work_s=100.0)
    results = backend.apply(Plan(starts=(_start("a", (2, 5)),)))
    assert [r.is_ok for r in results] == [True]
    assert backend.owner_of(2) == "a"
    assert backend.owner_of(5) == "a"
    assert backend.free_gpu_count == 6
    assert backend.next_event_at() == 100.0
    assert backend.advance_to(99.0) == []
    (done,) = backend.advance_to(100.0)
    assert (done.kind, done.at, done.gpu_ids, done.lost_s) == (TransitionKind.COMPLETED, 100.0, (2, 5), 0.0)
    assert backend.free_gpu_count == 8
    observed = {job.job_id: job for job in backend.snapshot().jobs}
    assert observed["a"].state == ObservedState.COMPLETED
    assert observed["a"].ended_at == 100.0


def test_double_allocation_is_refused_or_raised() -> None:
    backend = _backend()
    backend.register("a", work_s=50.0)
    backend.register("b", work_s=50.0)
    backend.apply(Plan(starts=(_start("a", (0, 1)),)))
    (result,) = backend.apply(Plan(starts=(_start("b", (1, 2)),)))
    assert not result.is_ok
    assert backend.counters.double_allocations_refused == 1
    assert backend.is_free(2)  # nothing of the refused start stuck
    backend.check_invariants()
    strict = _backend(strict=True)
    strict.register("a", work_s=50.0)
    strict.register("b", work_s=50.0)
    strict.apply(Plan(starts=(_start("a", (0,)),)))
    with pytest.raises(DoubleAllocationError):
        strict.apply(Plan(starts=(_start("b", (0,)),)))
    # A booking owner's GPUs count as taken too.
    assert not strict.hold("bk", (0, 1))
    assert strict.hold("bk", (1, 2))
    with pytest.raises(DoubleAllocationError):
        strict.apply(Plan(starts=(_start("b", (2,)),)))


def test_repeated_actions_are_success() -> None:
    backend = _backend()
    backend.register("a", work_s=1_000.0, is_preemptible=True)
    backend.apply(Plan(starts=(_start("a", (0,)),)))
    (again,) = backend.apply(Plan(starts=(_start("a", (0,)),)))
    assert again.is_ok
    backend.apply(Plan(preemptions=(_preempt("a", at=0.0),)))
    (repeat,) = backend.apply(Plan(preemptions=(_preempt("a", at=10.0),)))
    assert repeat.is_ok
    assert backend.next_event_at() == 30.0  # the first kill time stands
    (gone,) = backend.apply(Plan(preemptions=(_preempt("nobody", at=0.0),)))
    assert gone.is_ok


def test_preemption_of_a_non_checkpointable_job_loses_all_progress() -> None:
    backend = _backend()
    backend.register("a", work_s=1_000.0, is_preemptible=True)
    backend.apply(Plan(starts=(_start("a", (0, 1)),)))
    backend.advance_to(400.0)
    backend.apply(Plan(preemptions=(_preempt("a", at=400.0),)))
    (killed,) = backend.advance_to(430.0)
    assert killed.kind == TransitionKind.PREEMPTED
    assert (killed.saved_s, killed.lost_s, killed.work_left_s) == (0.0, 430.0, 1_000.0)
    # Restarted, it needs its whole work again.
    backend.apply(Plan(starts=(_start("a", (4,)),)))
    assert backend.next_event_at() == 1_430.0


@pytest.mark.parametrize(("on_signal", "saved"), [(False, 300.0), (True, 400.0)])
def test_checkpointable_job_keeps_progress_up_to_its_last_checkpoint(on_signal: bool, saved: float) -> None:
    backend = _backend(checkpoint_on_signal=on_signal)
    backend.register("a", work_s=1_000.0, is_preemptible=True, checkpoint_interval_s=150.0)
    backend.apply(Plan(starts=(_start("a", (0,)),)))
    backend.advance_to(400.0)
    backend.apply(Plan(preemptions=(_preempt("a", at=400.0),)))
    (killed,) = backend.advance_to(1_000.0)
    assert killed.at == 430.0
    assert killed.saved_s == saved
    assert killed.lost_s == pytest.approx(430.0 - saved)
    assert killed.work_left_s == pytest.approx(1_000.0 - saved)


def test_completion_before_kill_wins_and_non_preemptible_is_refused() -> None:
    backend = _backend()
    backend.register("a", work_s=100.0, is_preemptible=True)
    backend.register("b", work_s=100.0)
    backend.apply(Plan(starts=(_start("a", (0,)), _start("b", (1,)))))
    backend.advance_to(70.0)
    results = backend.apply(Plan(preemptions=(_preempt("a", at=70.0), _preempt("b", at=70.0))))
    assert [r.is_ok for r in results] == [True, False]
    transitions = backend.advance_to(200.0)
    assert {t.job_id: t.kind for t in transitions} == {
        "a": TransitionKind.COMPLETED,
        "b": TransitionKind.COMPLETED,
    }
    assert backend.counters.kills == 0
    assert backend.counters.preemptions_refused == 1


def test_clock_never_goes_back() -> None:
    backend = _backend()
    backend.advance_to(10.0)
    with pytest.raises(Exception, match="cannot go back"):
        backend.advance_to(5.0)
