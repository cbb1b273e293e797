"""The demo history's replay record and trace window (pure: no database).

The recorder must see every run the replay made, including a job that starts and ends with no
round in between (the demo lab once stored those as pending forever: 477 of its 479 "pending at
now" had finished in the replay).  The window lays the log over the history in whole weeks up
to a target load, and keeps every job inside its project's limits.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduling.engine import types as et
from scheduling.management.demo_history import HistoryJob, history_replay
from scheduling.management.demo_traces import (
    KTH_EPOCH,
    SAMPLE_JOB_EVERY,
    SAMPLES_DIR,
    TraceRow,
    _trace_window,
    read_trace,
    trace_load,
)
from scheduling.sim.inventory import gpu_type_spec

ORIGIN = datetime(2026, 11, 2, tzinfo=UTC)


def _job(key: str, submit_s: float, runtime_s: float, gpus: int = 1) -> HistoryJob:
    return HistoryJob(
        key=key,
        user="u",
        project="p",
        submit_s=submit_s,
        runtime_s=runtime_s,
        gpu_count=gpus,
        gpu_type="A100",
        requested_s=runtime_s * 2,
        status="completed",
    )


def test_a_job_that_starts_and_ends_between_two_rounds_is_recorded() -> None:
    nodes = (et.Node(id="n0", gpu_type="A100", gpu_ids=(0, 1)),)
    # "short" starts at 0 and ends at 100 s; the next arrival is at 1,000 s: no round sees it running.
    jobs = [_job("short", 0.0, 100.0), _job("later", 1_000.0, 50.0, gpus=2)]
    history = history_replay(
        jobs,
        nodes=nodes,
        gpu_types=(gpu_type_spec("A100"),),
        policy=et.PolicyConfig(),
        origin=ORIGIN,
        interactive_share=0.0,
    )
    assert set(history.runs) >= {"short", "later"}
    (short,) = history.runs["short"]
    assert short.start_s == 0.0
    assert short.end_s == pytest.approx(100.0)
    assert len(short.gpu_ids) == 1
    (later,) = history.runs["later"]
    assert later.start_s == pytest.approx(1_000.0)
    assert sorted(later.gpu_ids) == [0, 1]
    # The round after the start counts the job as running (the state that holds until then).
    first = history.rounds[0]
    assert first.running == 1
    assert first.pending == 0


def test_stopped_replay_leaves_the_running_job_open_and_the_waiting_one_without_a_run() -> None:
    nodes = (et.Node(id="n0", gpu_type="A100", gpu_ids=(0,)),)
    jobs = [_job("long", 0.0, 5_000.0), _job("waits", 10.0, 100.0)]
    history = history_replay(
        jobs,
        nodes=nodes,
        gpu_types=(gpu_type_spec("A100"),),
        policy=et.PolicyConfig(),
        origin=ORIGIN,
        interactive_share=0.0,
        stop_at_s=1_000.0,
    )
    (long,) = history.runs["long"]
    assert long.end_s is None
    assert "waits" not in history.runs


def _rows(days: int, every_s: int, gpus: int, runtime_s: int) -> list[TraceRow]:
    return [
        TraceRow(
            f"{i}",
            f"user{i % 3}",
            "",
            i * every_s,
            i * every_s,
            i * every_s + runtime_s,
            gpus,
            "completed",
            None,
        )
        for i in range(days * 86_400 // every_s)
    ]


NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def test_trace_load_of_the_shipped_sample_is_the_logs_own_about_70_percent() -> None:
    rows = read_trace(SAMPLES_DIR / "pwa_kth_sp2_1996.csv.gz")
    assert 0.6 < trace_load(rows, sample_every=SAMPLE_JOB_EVERY) < 0.85


@pytest.mark.parametrize("target", [0.3, 0.7])
def test_window_reaches_the_target_load_and_keeps_hour_of_week(target: float) -> None:
    # 8 weeks of a light log: one 1-GPU job an hour running 30 min, on a 10-GPU cluster (5 % a layer).
    rows = _rows(56, 3_600, 1, 1_800)
    capacity = {"A": 6, "B": 4}
    placed, offered, wanted = _trace_window(
        rows, now=NOW, history_days=7, load=target, capacity=capacity, max_uses=5
    )
    assert wanted == target
    assert offered == pytest.approx(target, rel=0.1)
    start = NOW - timedelta(days=7)
    assert all(start <= p.submit_at < NOW for p in placed)
    assert len({p.key for p in placed}) == len(placed)
    # Whole weeks (first uses) or whole days (later copies): the hour of day never changes.
    for p in placed:
        logged = KTH_EPOCH + timedelta(seconds=p.row.submit_s)
        assert (p.submit_at - logged) % timedelta(days=1) == timedelta(0)
        if p.copy == 0:
            assert (p.submit_at - logged) % timedelta(weeks=1) == timedelta(0)
    # Both types get about the same share of their capacity.
    per_type = {
        t: sum(p.gpu_count * 1_800 for p in placed if p.gpu_type == t) / c for t, c in capacity.items()
    }
    assert max(per_type.values()) < 1.3 * min(per_type.values())


def test_window_caps_every_job_at_its_projects_limit() -> None:
    rows = _rows(14, 3_600, 16, 3_600)
    capacity = {"A": 8, "B": 32}

    def limits_of(row: TraceRow) -> dict[str, int]:
        return {"A": 0, "B": 4} if row.user == "user0" else {"A": 8, "B": 32}

    placed, _, _ = _trace_window(
        rows, now=NOW, history_days=7, load=0.5, capacity=capacity, limits_of=limits_of
    )
    assert placed
    for p in placed:
        limit = limits_of(p.row)[p.gpu_type]
        assert 1 <= p.gpu_count <= limit
        assert p.gpu_count <= capacity[p.gpu_type]
