"""Round speed V: predictions made once per job, explanation writes planned as hash joins,
HOT room on the job table."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from django.db import connection, transaction

from scheduling.engine.types import JobRequest
from scheduling.rounds.batch import nested_loops_off
from scheduling.snapshot import jobs as snapshot_jobs


class _Port:
    """A prediction port that answers p50 = 10 x the job's GPUs and counts what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def runtime_predict(self, *, cluster_id: int, requests):
        self.asked += [r.id for r in requests]
        return [(10.0 * r.gpu_count, 20.0 * r.gpu_count) for r in requests]


class _BrokenPort(_Port):
    def runtime_predict(self, *, cluster_id: int, requests):
        raise RuntimeError("predictor down")


def _request(job_id: str, *, gpus: int = 1, p50: float | None = None) -> JobRequest:
    return JobRequest(
        id=job_id,
        user="u",
        project="p",
        gpu_count=gpus,
        submit_at=1_000.0,
        predicted_p50_s=p50,
        predicted_p90_s=None if p50 is None else 2 * p50,
    )


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> _Port:
    monkeypatch.setattr(snapshot_jobs, "_PREDICTED", {})
    fake = _Port()
    monkeypatch.setattr(snapshot_jobs, "prediction_port", lambda: fake)
    return fake


CLUSTER = SimpleNamespace(pk=7, name="lab")


def test_a_job_is_predicted_once_while_its_request_stays_the_same(port: _Port) -> None:
    requests = [_request("1"), _request("2", gpus=2), _request("3", p50=5.0)]
    first = snapshot_jobs.with_predictions(cluster=CLUSTER, requests=requests)
    assert port.asked == ["1", "2"]  # a stored prediction is never asked for
    assert [(r.predicted_p50_s, r.predicted_p90_s) for r in first] == [
        (10.0, 20.0),
        (20.0, 40.0),
        (5.0, 10.0),
    ]

    # The next round: the same requests (equal, not the same objects) are not asked again.
    again = snapshot_jobs.with_predictions(
        cluster=CLUSTER, requests=[dataclasses.replace(r) for r in requests]
    )
    assert port.asked == ["1", "2"]
    assert again == first

    # A changed request (the job now asks for 4 GPUs) is predicted anew; the other is kept.
    changed = [_request("1", gpus=4), _request("2", gpus=2)]
    out = snapshot_jobs.with_predictions(cluster=CLUSTER, requests=changed)
    assert port.asked == ["1", "2", "1"]
    assert [r.predicted_p50_s for r in out] == [40.0, 20.0]


def test_a_prediction_is_made_again_after_the_reuse_period(
    port: _Port, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    monkeypatch.setattr(snapshot_jobs, "_PREDICTION_REUSE_S", 0.0)
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    assert port.asked == ["1", "1"]


def test_a_history_import_makes_rounds_predict_again(port: _Port) -> None:
    from scheduling.history import services as history_services

    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    assert port.asked == ["1"]
    # What an import calls once it stored the cluster's finished jobs.
    history_services._forget_predictor(CLUSTER.pk)
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    assert port.asked == ["1", "1"]


def test_jobs_that_left_the_queue_or_got_a_stored_prediction_are_forgotten(port: _Port) -> None:
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1"), _request("2")])
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1"), _request("2", p50=3.0)])
    (_, kept) = snapshot_jobs._PREDICTED[CLUSTER.pk]
    assert set(kept) == {"1"}
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("2", p50=3.0)])
    assert CLUSTER.pk not in snapshot_jobs._PREDICTED


def test_another_port_is_asked_afresh(port: _Port, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    other = _Port()
    monkeypatch.setattr(snapshot_jobs, "prediction_port", lambda: other)
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    assert other.asked == ["1"]


def test_a_failing_predictor_leaves_the_estimates_and_keeps_earlier_predictions(
    port: _Port, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("1")])
    broken = _BrokenPort()
    monkeypatch.setattr(snapshot_jobs, "prediction_port", lambda: broken)
    out = snapshot_jobs.with_predictions(cluster=CLUSTER, requests=[_request("2")])
    assert [r.predicted_p50_s for r in out] == [None]  # the engine plans on the user's estimate


@pytest.mark.django_db
def test_nested_loops_are_off_inside_the_block_and_restored_after() -> None:
    def setting() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('enable_nestloop')")
            return str(cursor.fetchone()[0])

    with transaction.atomic():
        assert setting() == "on"
        with nested_loops_off():
            assert setting() == "off"
            with connection.cursor() as cursor:
                # The explanation write's join: no nested loop whatever the row estimates.
                cursor.execute(
                    "EXPLAIN UPDATE scheduling_job AS j SET pending_sentence = v.s"
                    " FROM UNNEST('{1,2,3}'::bigint[], '{a,b,c}'::varchar[]) AS v(id, s)"
                    " WHERE j.id = v.id AND j.status = 'pending'"
                )
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Nested Loop" not in plan
        assert setting() == "on"
        with pytest.raises(RuntimeError), nested_loops_off():
            raise RuntimeError("the write failed")
        assert setting() == "on"


@pytest.mark.django_db
def test_the_job_table_leaves_room_for_hot_explanation_updates() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'scheduling_job'")
        (options,) = cursor.fetchone()
    assert "fillfactor=40" in (options or [])
