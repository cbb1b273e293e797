"""The pending sentences read as English: singular GPU counts, the job ahead named, not numbered."""

from __future__ import annotations

from scheduling.engine import plan_round
from scheduling.engine.outcome import fmt_gpus, job_label
from scheduling.engine.types import PendingReason, PolicyConfig
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 10_000.0


def test_gpu_counts_and_job_labels() -> None:
    assert fmt_gpus(1) == "1 GPU"
    assert fmt_gpus(0) == "0 GPUs"
    assert fmt_gpus(8) == "8 GPUs"
    assert job_label("j7", "era5-emulator") == "\u201cera5-emulator\u201d"
    assert job_label("j7", "") == "j7"
    assert job_label("j7", "era5-emulator", same_owner=False) == "another user's job"


def test_a_waiting_job_behind_the_top_job_names_it_and_counts_one_gpu_as_one() -> None:
    nodes = make_nodes(1, 4)
    busy = running(job("r", 4, requested_s=1_000), (0, 1, 2, 3), started_at=NOW - 100)
    snap = snapshot(
        nodes,
        running_jobs=[busy],
        pending=[
            job("big", 4, submit_at=1, name="climate-run"),
            job("small", 1, submit_at=2, requested_s=10, name="probe"),
        ],
    )
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    (small,) = [e for e in plan.pending if e.job_id == "small"]
    assert small.reason == PendingReason.PRIORITY
    assert small.sentence.startswith("Needs 1 GPU of type A100; 0 are free;"), small.sentence
    assert "\u201cclimate-run\u201d" in small.sentence, small.sentence
    assert "big" not in small.sentence, small.sentence


def test_a_sentence_never_shows_another_users_job_name() -> None:
    nodes = make_nodes(1, 4)
    busy = running(job("r", 4, requested_s=1_000), (0, 1, 2, 3), started_at=NOW - 100)
    snap = snapshot(
        nodes,
        running_jobs=[busy],
        pending=[
            job("theirs", 4, submit_at=1, user="v", name="secret-sweep"),
            job("mine", 1, submit_at=2, requested_s=10, name="probe"),
        ],
    )
    plan = plan_round(snap, PolicyConfig(name="easy"), NOW)
    (mine,) = [e for e in plan.pending if e.job_id == "mine"]
    assert "secret-sweep" not in mine.sentence, mine.sentence
    assert "theirs" not in mine.sentence, mine.sentence
    assert "another user's job" in mine.sentence, mine.sentence
