"""The API's hot paths (token authentication, availability, booking create) stay correct when fast.

The token cache must not outlive a revocation (at once in this process, within
``BERTH_API_TOKEN_CACHE_S`` elsewhere); availability must show a booking the moment it is made;
a created booking's response is what reading it back shows.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.db import connection, transaction
from rest_framework.authtoken.models import Token
from rest_framework.fields import DateTimeField

from portal.accounts import authentication
from portal.accounts.services import token_create
from scheduling import selectors
from scheduling.models import Allocation, Gpu, Node
from tests.conftest import token_client
from tests.factories import AllocationFactory

pytestmark = pytest.mark.django_db

ME = "/api/v1/me/"


@pytest.fixture(autouse=True)
def _empty_token_cache():
    authentication.token_cache_clear()
    yield
    authentication.token_cache_clear()


def _booking_body(project, start: datetime, /, *, gpu_count: int, **extra) -> dict[str, object]:
    """A one-hour A100 booking request from ``start``; ``extra`` adds or overrides fields."""
    return {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": gpu_count,
        "start_at": start.isoformat(),
        "end_at": (start + timedelta(hours=1)).isoformat(),
        **extra,
    }


def _availability(client, start: datetime, end: datetime, step: int = 3600, **extra):
    params = {"gpu_type": "A100", "start": start.isoformat(), "end": end.isoformat(), "step": step, **extra}
    response = client.get("/api/v1/availability/", params)
    assert response.status_code == 200, response.content
    return response.json()


# ---- token cache ----


def test_cached_token_needs_no_query(member, django_assert_num_queries):
    api = token_client(member)
    assert api.get(ME).status_code == 200  # token lookup + memberships
    with django_assert_num_queries(1):  # memberships only
        assert api.get(ME).json()["username"] == member.username


def test_replaced_token_is_refused_at_once(member):
    api = token_client(member)
    assert api.get(ME).status_code == 200
    new_key = token_create(user=member)
    assert api.get(ME).status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Token {new_key}")
    assert api.get(ME).status_code == 200


def test_deactivated_user_is_refused_at_once(member):
    api = token_client(member)
    assert api.get(ME).status_code == 200
    member.is_active = False
    member.save()
    assert api.get(ME).status_code == 401


def test_staff_flag_change_is_seen_at_once(member):
    api = token_client(member)
    assert api.get(ME).json()["is_staff"] is False
    assert api.get("/api/v1/audit-events/").status_code == 403
    member.is_staff = True
    member.save()
    assert api.get(ME).json()["is_staff"] is True
    assert api.get("/api/v1/audit-events/").status_code == 200


def test_a_change_no_signal_reports_is_refused_within_the_bound(member, settings, monkeypatch):
    """The documented bound: a token deleted where this process cannot see it (another web
    process, raw SQL) stops working once the cached entry expires."""
    settings.BERTH_API_TOKEN_CACHE_S = 5
    now = [1000.0]
    monkeypatch.setattr(authentication.time, "monotonic", lambda: now[0])
    api = token_client(member)
    assert api.get(ME).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token WHERE user_id = %s", [member.pk])
    now[0] += 4.9
    assert api.get(ME).status_code == 200  # still cached: within the bound
    now[0] += 0.2
    assert api.get(ME).status_code == 401


def test_cache_off_reads_the_token_every_time(member, settings):
    settings.BERTH_API_TOKEN_CACHE_S = 0
    api = token_client(member)
    assert api.get(ME).status_code == 200
    Token.objects.filter(user=member).update(key="0" * 40)  # no signal, nothing cached
    assert api.get(ME).status_code == 401


def test_unknown_token_is_refused_and_not_cached(member):
    api = token_client(member)
    api.credentials(HTTP_AUTHORIZATION="Token " + "f" * 40)
    assert api.get(ME).status_code == 401
    assert api.get(ME).status_code == 401


def test_request_user_is_not_shared_between_requests(member):
    api = token_client(member)
    api.get(ME)
    first, _ = authentication.CachedTokenAuthentication().authenticate_credentials(Token.objects.get().key)
    second, _ = authentication.CachedTokenAuthentication().authenticate_credentials(Token.objects.get().key)
    assert first == second
    assert first is not second


# ---- availability ----


def test_availability_reflects_a_new_booking_at_once(member_client, project, nodes, soon):
    window = (soon, soon + timedelta(hours=2))
    assert [s["free_gpus"] for s in _availability(member_client, *window)["slots"]] == [8, 8]
    body = _booking_body(project, soon, gpu_count=3)
    created = member_client.post("/api/v1/bookings/", body, format="json")
    assert created.status_code == 201
    assert [s["free_gpus"] for s in _availability(member_client, *window)["slots"]] == [5, 8]
    assert member_client.post(f"/api/v1/bookings/{created.json()['id']}/cancel/").status_code == 200
    assert [s["free_gpus"] for s in _availability(member_client, *window)["slots"]] == [8, 8]


def test_availability_renders_boundaries_as_drf_does(member_client, nodes):
    """Offsets and fractions of a second in the query: each boundary as DRF's DateTimeField
    would render it, the last one the requested end."""
    start = datetime.fromisoformat("2030-01-01T09:00:00.250000+02:00")
    end = start + timedelta(minutes=25, seconds=3)
    data = _availability(member_client, start, end, step=600)
    field = DateTimeField()
    expected = [start + timedelta(minutes=10 * i) for i in range(3)] + [end]
    assert [s["start_at"] for s in data["slots"]] == [field.to_representation(t) for t in expected[:-1]]
    assert [s["end_at"] for s in data["slots"]] == [field.to_representation(t) for t in expected[1:]]
    assert data["slots"][0]["start_at"] == "2030-01-01T07:00:00.250000Z"


def test_availability_step_edges_are_exact_to_the_microsecond(member_client, nodes):
    """An allocation ending exactly on a step boundary (with microseconds) leaves the next step free."""
    t0 = datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
    gpu = Gpu.objects.order_by("id").first()
    AllocationFactory(gpu=gpu, period=DateTimeTZRange(t0, t0 + timedelta(seconds=600), "[)"))
    AllocationFactory(
        gpu=gpu,
        period=DateTimeTZRange(t0 + timedelta(seconds=1800, microseconds=1), t0 + timedelta(hours=2), "[)"),
    )
    data = _availability(member_client, t0, t0 + timedelta(seconds=2400), 600)
    assert [s["free_gpus"] for s in data["slots"]] == [7, 8, 8, 7]


# ---- booking create ----


def test_create_answers_what_reading_it_back_shows(member_client, project, nodes, soon):
    for count in (1, 6):  # one node, then across both nodes
        body = _booking_body(project, soon, gpu_count=count, note="n")
        created = member_client.post("/api/v1/bookings/", body, format="json")
        assert created.status_code == 201, created.content
        again = member_client.get(f"/api/v1/bookings/{created.json()['id']}/")
        assert created.json() == again.json()
        assert len(created.json()["gpus"]) == count
        soon += timedelta(hours=1)


def test_create_query_count(member_client, project, nodes, soon, django_assert_max_num_queries):
    body = _booking_body(project, soon, gpu_count=2, cluster=nodes[0].cluster.name)
    member_client.get(ME)  # the token is cached from here on
    # 8 round trips: the names, membership + quota, the node lock, the free GPUs and the
    # allocations with their audit events run as prepared statements (scheduling.queries,
    # outside Django's query log); what the log shows is the booking's INSERT (the ORM's) and
    # the test's savepoint and its release (in production BEGIN and COMMIT).  It was 17
    # statements before.
    with django_assert_max_num_queries(5):
        assert member_client.post("/api/v1/bookings/", body, format="json").status_code == 201
    assert Allocation.objects.count() == 2


# ---- the availability cache (committed data: these tests commit like production does) ----


def _free(**window) -> list[int]:
    return [s.free_gpus for s in selectors.availability_get(gpu_type_name="A100", **window).slots]


@pytest.mark.django_db(transaction=True)
def test_cached_availability_shows_a_booking_at_once(member_client, project, nodes, soon, computed):
    window = (soon, soon + timedelta(hours=2))
    _generation_settled(selectors._availability_watch())  # until it listens, nothing is cached
    assert [s["free_gpus"] for s in _availability(member_client, *window)["slots"]] == [8, 8]
    assert [s["free_gpus"] for s in _availability(member_client, *window)["slots"]] == [8, 8]
    assert len(computed) == 1  # the second answer came from the cache
    body = _booking_body(project, soon, gpu_count=3)
    assert member_client.post("/api/v1/bookings/", body, format="json").status_code == 201
    assert [s["free_gpus"] for s in _availability(member_client, *window)["slots"]] == [5, 8]
    assert len(computed) == 2


def _free_after_write(**window) -> list[int]:
    """``_free`` read as a client that just wrote would (stamped after the write's commit)."""
    with selectors.availability_read_after(selectors.availability_stamp()):
        return _free(**window)


@pytest.mark.django_db(transaction=True)
def test_bulk_writes_and_node_changes_retire_cached_answers(nodes, soon):
    window = {"start_at": soon, "end_at": soon + timedelta(hours=1), "step_s": 3600}
    gpu = Gpu.objects.filter(node=nodes[0]).first()
    AllocationFactory(gpu=gpu, period=DateTimeTZRange(soon, soon + timedelta(hours=1), "[)"))
    assert _free_after_write(**window) == [7]
    Allocation.objects.update(state=Allocation.State.RELEASED)  # a queryset update: no signal
    assert _free_after_write(**window) == [8]
    Node.objects.filter(pk=nodes[1].pk).update(status=Node.Status.DOWN)
    assert _free_after_write(**window) == [4]


@pytest.mark.django_db(transaction=True)
def test_a_write_retires_cached_answers_when_it_commits(nodes, soon):
    window = {"start_at": soon, "end_at": soon + timedelta(hours=1)}
    watch = selectors._availability_watch()
    before = _generation_settled(watch)
    with transaction.atomic():
        Node.objects.filter(pk=nodes[1].pk).update(status=Node.Status.DOWN)
        # Its own transaction reads its write (and caches nothing a rollback could falsify).
        assert _free(**window) == [4]
        time.sleep(0.2)
        during = watch.generation
    assert during == before  # other processes cannot see the write yet: nobody is told
    assert _generation_settled(watch) == before + 1  # one notification for the transaction


def _generation_settled(watch, *, wait_s: float = 0.3) -> int:
    """The listener's generation once it has been connected and quiet for ``wait_s``."""
    deadline = time.monotonic() + 10
    last, since = watch.generation, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        if watch.generation != last or watch.generation is None:
            last, since = watch.generation, time.monotonic()
        elif time.monotonic() - since >= wait_s:
            return last
    raise AssertionError("the availability listener never settled")


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_write_leaves_no_cached_trace(nodes, soon):
    window = {"start_at": soon, "end_at": soon + timedelta(hours=1)}

    def write_read_fail() -> None:
        with transaction.atomic():
            Node.objects.filter(pk=nodes[1].pk).update(status=Node.Status.DOWN)
            assert _free(**window) == [4]
            raise RuntimeError

    with pytest.raises(RuntimeError):
        write_read_fail()
    assert _free(**window) == [8]


@pytest.mark.django_db(transaction=True)
def test_a_write_outside_django_is_seen_at_once(nodes, soon, computed):
    window = {"start_at": soon, "end_at": soon + timedelta(hours=1)}
    _generation_settled(selectors._availability_watch())
    assert _free(**window) == _free(**window) == [8]
    assert len(computed) == 1  # cached
    connection.ensure_connection()
    with connection.connection.cursor() as raw:  # psycopg directly: no Django cursor sees it
        raw.execute("UPDATE scheduling_node SET status = 'down' WHERE id = %s", [nodes[1].pk])
    assert _free_after_write(**window) == [4]  # PostgreSQL's trigger told the listener


@pytest.mark.django_db(transaction=True)
def test_cache_off(nodes, soon, settings, computed):
    settings.BERTH_AVAILABILITY_CACHE_S = 0
    window = {"start_at": soon, "end_at": soon + timedelta(hours=1)}
    assert _free(**window) == _free(**window) == [8]
    assert len(computed) == 2


def test_create_resolves_names_to_full_rows(member, project, nodes, soon, monkeypatch):
    """The one-query name lookup hands the service the same rows the ORM would."""
    from scheduling.api import bookings as bookings_api

    seen = {}
    original = bookings_api.services.booking_create

    def spy(user, **kwargs):
        seen.update(kwargs)
        return original(user, **kwargs)

    monkeypatch.setattr(bookings_api.services, "booking_create", spy)
    cluster = nodes[0].cluster
    cluster.settings = {"policy": "easy"}
    cluster.save()
    body = _booking_body(project, soon, gpu_count=1, cluster=cluster.name)
    assert token_client(member).post("/api/v1/bookings/", body, format="json").status_code == 201
    for name, model in (
        ("project", type(project)),
        ("gpu_type", type(nodes[0].gpu_type)),
        ("cluster", type(cluster)),
    ):
        fresh = model.objects.get(pk=seen[name].pk)
        assert {f.attname: getattr(seen[name], f.attname) for f in model._meta.concrete_fields} == {
            f.attname: getattr(fresh, f.attname) for f in model._meta.concrete_fields
        }
    assert seen["cluster"].settings == {"policy": "easy"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("project", "nope"), ("gpu_type", "H999"), ("cluster", "nowhere"), ("cluster", "off")],
)
def test_create_refuses_unknown_names(member_client, project, nodes, soon, field, value):
    from tests.factories import ClusterFactory

    ClusterFactory(name="off", is_active=False)
    body = _booking_body(project, soon, gpu_count=1, **{field: value})
    response = member_client.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()["fields"]) == [field]
    assert "does not exist" in response.json()["fields"][field][0]


@pytest.mark.parametrize(
    "accept", [None, "*/*", "application/json", "application/json; indent=2", "text/html"]
)
def test_content_negotiation_shortcut_answers_as_drf(member_client, nodes, soon, accept, monkeypatch):
    from rest_framework.negotiation import DefaultContentNegotiation

    from scheduling.api.inventory import AvailabilityApi

    params = {"gpu_type": "A100", "start": soon.isoformat(), "end": (soon + timedelta(hours=1)).isoformat()}
    extra = {"HTTP_ACCEPT": accept} if accept is not None else {}
    fast = member_client.get("/api/v1/availability/", params, **extra)
    monkeypatch.setattr(AvailabilityApi, "content_negotiation_class", DefaultContentNegotiation)
    drf = member_client.get("/api/v1/availability/", params, **extra)
    assert (fast.status_code, fast["Content-Type"], fast.content) == (
        drf.status_code,
        drf["Content-Type"],
        drf.content,
    )
    assert fast.status_code == (406 if accept == "text/html" else 200)


def test_create_writes_every_audit_event_as_before(member_client, member, project, nodes, soon):
    """The allocations and their events go in one statement: the events are what
    ``allocation_events_record`` writes (one per allocation, ``allocation_state`` after)."""
    from scheduling.models import AuditEvent
    from scheduling.services import allocation_state

    body = _booking_body(project, soon, gpu_count=6)
    created = member_client.post("/api/v1/bookings/", body, format="json").json()
    events = list(AuditEvent.objects.order_by("id"))
    assert [e.verb for e in events] == ["booking.create"] + ["allocation.create"] * 6
    assert events[0].entity_id == created["id"]
    assert events[0].after["gpu_ids"] == created["gpu_ids"]
    allocations = {a.pk: a for a in Allocation.objects.filter(booking_id=created["id"])}
    assert sorted(e.entity_id for e in events[1:]) == sorted(allocations)
    for event in events:
        assert (event.actor_id, event.actor_label, event.before) == (member.pk, "api", None)
    for event in events[1:]:
        assert event.after == allocation_state(allocations[event.entity_id])
    assert [e.after["gpu_id"] for e in events[1:]] == events[0].after["gpu_ids"]  # in pick order


def test_list_pages_show_what_the_detail_shows(member_client, project, nodes, soon):
    ids = []
    for i in range(5):
        body = {
            "project": project.slug,
            "gpu_type": "A100",
            "gpu_count": 1 + i % 3,
            "start_at": (soon + timedelta(hours=i)).isoformat(),
            "end_at": (soon + timedelta(hours=i + 1)).isoformat(),
        }
        ids.append(member_client.post("/api/v1/bookings/", body, format="json").json()["id"])
    assert member_client.post(f"/api/v1/bookings/{ids[1]}/cancel/").status_code == 200  # GPUs released
    seen, url = [], "/api/v1/bookings/?page_size=2"
    while url:
        page = member_client.get(url).json()
        seen += page["results"]
        url = page["next"]
    assert [b["id"] for b in seen] == sorted(ids, reverse=True)
    for item in seen:
        assert item == member_client.get(f"/api/v1/bookings/{item['id']}/").json()
    assert next(b for b in seen if b["id"] == ids[1])["gpus"] == []
