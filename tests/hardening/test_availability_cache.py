"""The availability cache (`scheduling.selectors`): PostgreSQL tells every process of every
write (triggers + LISTEN), a client reads its own writes through the stamp its write got, and
the cache steps aside while its listener is not listening.

Real PostgreSQL; the listener thread is the production one.
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction

from scheduling import selectors
from scheduling.models import Cluster, Gpu, GpuType, Node
from tests.conftest import token_client

pytestmark = pytest.mark.django_db(transaction=True)


def _settled(watch: selectors._AvailabilityWatch, *, quiet_s: float = 0.3) -> int:
    deadline = time.monotonic() + 10
    last, since = watch.generation, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        if watch.generation != last or watch.generation is None:
            last, since = watch.generation, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return last
    raise AssertionError("the availability listener never settled")


def _free(client, soon) -> list[int]:
    params = {"gpu_type": "A100", "start": soon.isoformat(), "end": (soon + timedelta(hours=1)).isoformat()}
    response = client.get("/api/v1/availability/", params)
    assert response.status_code == 200, response.content
    return [s["free_gpus"] for s in response.json()["slots"]]


def test_a_write_is_read_back_by_its_writer_even_before_the_notification_arrives(
    member, project, nodes, soon, monkeypatch, computed
):
    """The listener is made deaf (as if the notification were still on its way): the writer's
    stamped read computes afresh and shows the booking; a read without a stamp gets the cached
    answer, which is what the stamp is for."""
    watch = selectors._availability_watch()
    _settled(watch)
    writer, other = token_client(member), token_client(member)
    assert _free(writer, soon) == _free(other, soon) == [8]
    assert len(computed) == 1
    monkeypatch.setattr(watch, "_notified", lambda notify: None)
    body = {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": 3,
        "start_at": soon.isoformat(),
        "end_at": (soon + timedelta(hours=1)).isoformat(),
    }
    created = writer.post("/api/v1/bookings/", body, format="json")
    assert created.status_code == 201
    stamp = float(created[selectors.STAMP_HEADER])
    assert created.cookies[selectors.STAMP_COOKIE].value == created[selectors.STAMP_HEADER]
    assert _free(writer, soon) == [5]  # the cookie carried the stamp
    assert _free(other, soon) == [8]  # deaf listener, no stamp: the cached answer
    header = {"HTTP_BERTH_AVAILABILITY_AFTER": f"{stamp:.6f}"}
    params = {"gpu_type": "A100", "start": soon.isoformat(), "end": (soon + timedelta(hours=1)).isoformat()}
    assert [s["free_gpus"] for s in other.get("/api/v1/availability/", params, **header).json()["slots"]] == [
        5
    ]


def test_the_stamped_reader_is_cached_again_once_the_listener_is_past_its_stamp(
    member, project, nodes, soon, computed
):
    watch = selectors._availability_watch()
    _settled(watch)
    client = token_client(member)
    stamp = selectors.availability_stamp()
    with selectors.availability_read_after(stamp):
        assert selectors.availability_get(
            gpu_type_name="A100", start_at=soon, end_at=soon + timedelta(hours=1)
        ).free == (8,)
        deadline = time.monotonic() + 5
        while watch.synced_to < stamp and time.monotonic() < deadline:  # the marker it asked for
            time.sleep(0.01)
        assert watch.synced_to >= stamp
    assert _free(client, soon) == _free(client, soon) == [8]
    assert len(computed) == 2  # the stamped read, then one cached answer for both


def test_a_refused_write_gets_no_stamp(member, project, nodes, soon):
    body = {"project": project.slug, "gpu_type": "A100", "gpu_count": 99, "start_at": soon.isoformat(),
            "end_at": (soon + timedelta(hours=1)).isoformat()}  # fmt: skip
    refused = token_client(member).post("/api/v1/bookings/", body, format="json")
    assert refused.status_code >= 400
    assert selectors.STAMP_HEADER not in refused


def test_every_table_availability_reads_notifies_at_commit_and_a_rollback_does_not(nodes):
    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k not in ("cursor_factory", "context", "prepare_threshold")
    }
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN berth_availability")

        def told() -> int:
            return sum(1 for n in listener.notifies(timeout=0.3) if not n.payload.startswith("sync:"))

        told()
        writes = {
            "allocation": lambda: selectors.Allocation.objects.filter(pk=-1).delete(),
            "gpu": lambda: Gpu.objects.filter(pk=-1).update(index=99),  # no row: still a write statement
            "node": lambda: Node.objects.filter(pk=nodes[0].pk).update(status=Node.Status.DOWN),
            "cluster": lambda: Cluster.objects.update(status_message="x"),
            "gputype": lambda: GpuType.objects.update(value=2.0),
        }
        for name, write in writes.items():
            with transaction.atomic():
                write()
                write()  # two statements, one transaction: one notification
            assert told() == 1, name
        with pytest.raises(RuntimeError):
            _write_then_fail(nodes[0])
        assert told() == 0


def _write_then_fail(node: Node) -> None:
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(status=Node.Status.UP)
        raise RuntimeError


def test_reads_are_computed_while_the_listener_is_down_and_cached_again_after(nodes, soon, computed):
    watch = selectors._availability_watch()
    before = _settled(watch)
    window = {"gpu_type_name": "A100", "start_at": soon, "end_at": soon + timedelta(hours=1)}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'berth-availability-listen' AND datname = current_database()"
        )
    deadline = time.monotonic() + 5
    while watch.generation is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.generation is None
    selectors.availability_get(**window)
    selectors.availability_get(**window)
    assert len(computed) == 2  # not cached: writes meanwhile would not be told
    after = _settled(watch)
    assert after > before  # a new generation: whatever it missed is retired
    selectors.availability_get(**window)
    selectors.availability_get(**window)
    assert len(computed) == 3
