"""Preferences page and API, webhooks and the delivery log: who may see and change what."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.models import Delivery, EventKind, Preference, Webhook
from notifications.services import webhook_create
from portal.accounts.models import Membership
from tests.factories import MembershipFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _delivery(user: Any, *, webhook: Webhook | None = None, key: str = "k") -> Delivery:
    return Delivery.objects.create(
        key=key,
        event_key=key,
        event=EventKind.JOB_STARTED,
        channel=Delivery.Channel.WEBHOOK if webhook else Delivery.Channel.EMAIL,
        user=user,
        webhook=webhook,
        recipient=webhook.url if webhook else user.email,
        subject="Berth: job 1 started",
        created_at=timezone.now(),
    )


def test_preferences_api_reads_defaults_then_saves_only_what_is_given() -> None:
    user = UserFactory()
    client = _api(user)
    got = client.get("/api/v1/notifications/preferences/").json()
    assert got["is_email_enabled"] is True
    assert set(got["email_events"]) == set(EventKind.values)
    assert got["booking_start_lead_min"] == 15
    assert not Preference.objects.filter(user=user).exists()  # defaults are not written on read

    saved = client.put("/api/v1/notifications/preferences/", {"booking_start_lead_min": 45}, format="json")
    assert saved.status_code == 200
    pref = Preference.objects.get(user=user)
    assert pref.booking_start_lead_min == 45
    assert pref.booking_end_lead_min == 10
    assert set(pref.email_events) == set(EventKind.values)
    for bad in (
        {"booking_end_lead_min": -1},
        {"booking_end_lead_min": 20_000},
        {"is_email_enabled": "maybe"},
    ):
        response = client.put("/api/v1/notifications/preferences/", bad, format="json")
        assert response.status_code == 400, bad
        assert next(iter(bad)) in response.json()["fields"]
    assert APIClient().get("/api/v1/notifications/preferences/").status_code == 401


def test_preferences_page_saves_and_shows_form_errors(client: Client) -> None:
    user = UserFactory(email="ada@lab.example")
    client.force_login(user)
    page = client.get("/account/notifications/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "ada@lab.example" in text
    assert "X-Berth-Signature" in text

    bad = client.post(
        "/account/notifications/",
        {"booking_start_lead_min": "abc", "booking_end_lead_min": "10"},
        HTTP_HX_REQUEST="true",
    )
    assert bad.status_code == 422
    assert "Enter a whole number" in bad.content.decode()
    ok = client.post(
        "/account/notifications/",
        {
            "email_events": ["job.failed", "job.preempted"],
            "booking_start_lead_min": "30",
            "booking_end_lead_min": "5",
        },
    )
    assert ok.status_code == 303
    pref = Preference.objects.get(user=user)
    assert pref.is_email_enabled is False  # an unticked box
    assert sorted(pref.email_events) == ["job.failed", "job.preempted"]
    assert (pref.booking_start_lead_min, pref.booking_end_lead_min) == (30, 5)


def test_preferences_page_needs_sign_in_and_csrf() -> None:
    anonymous = Client()
    assert anonymous.get("/account/notifications/").status_code == 302
    user = UserFactory()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(
        "/account/notifications/", {"booking_start_lead_min": "1", "booking_end_lead_min": "1"}
    )
    assert response.status_code == 403
    assert not Preference.objects.filter(user=user).exists()


def test_webhook_page_shows_the_secret_once_and_only_managers_add_project_webhooks(client: Client) -> None:
    project = ProjectFactory(slug="vision")
    member = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    manager = MembershipFactory(project=project, role=Membership.Role.MANAGER).user

    client.force_login(manager)
    added = client.post(
        "/account/notifications/webhooks/",
        {"url": "https://hooks.example.org/berth", "project": project.pk},
        HTTP_HX_REQUEST="true",
    )
    assert added.status_code == 200
    hook = Webhook.objects.get(owner=manager)
    assert hook.project == project
    assert hook.secret in added.content.decode()
    assert hook.secret not in client.get("/account/notifications/").content.decode()

    client.force_login(member)
    refused = client.post(
        "/account/notifications/webhooks/",
        {"url": "https://hooks.example.org/x", "project": project.pk},
        HTTP_HX_REQUEST="true",
    )
    assert refused.status_code == 422  # a member cannot pick the project: not among the choices
    assert not Webhook.objects.filter(owner=member).exists()
    # Another user's webhook cannot be removed (404), the owner's can.
    assert client.post(f"/account/notifications/webhooks/{hook.pk}/delete/").status_code == 404
    assert Webhook.objects.filter(pk=hook.pk).exists()
    client.force_login(manager)
    assert client.post(f"/account/notifications/webhooks/{hook.pk}/delete/").status_code == 303
    assert not Webhook.objects.filter(pk=hook.pk).exists()


def test_webhook_api_owner_scope_project_rights_and_secret_rotation() -> None:
    project = ProjectFactory(slug="vision")
    member = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    manager = MembershipFactory(project=project, role=Membership.Role.MANAGER).user
    outsider = UserFactory()

    created = _api(member).post(
        "/api/v1/notifications/webhooks/",
        {"url": "https://hooks.example.org/m", "events": ["job.finished", "job.failed"]},
        format="json",
    )
    assert created.status_code == 201
    body = created.json()
    assert len(body["secret"]) == 64
    assert body["project"] is None
    hook_id = body["id"]
    assert "secret" not in _api(member).get(f"/api/v1/notifications/webhooks/{hook_id}/").json()

    forbidden = _api(member).post(
        "/api/v1/notifications/webhooks/",
        {"url": "https://h.example.org/p", "project": "vision"},
        format="json",
    )
    assert forbidden.status_code == 403
    as_manager = _api(manager).post(
        "/api/v1/notifications/webhooks/",
        {"url": "https://h.example.org/p", "project": "vision"},
        format="json",
    )
    assert as_manager.status_code == 201
    assert as_manager.json()["project"] == "vision"
    bad = _api(member).post(
        "/api/v1/notifications/webhooks/", {"url": "ftp://x", "events": ["nope"]}, format="json"
    )
    assert bad.status_code == 400
    assert {"url", "events"} <= set(bad.json()["fields"])

    rotated = _api(member).post(f"/api/v1/notifications/webhooks/{hook_id}/rotate-secret/")
    assert rotated.status_code == 200
    assert rotated.json()["secret"] != body["secret"]
    assert Webhook.objects.get(pk=hook_id).secret == rotated.json()["secret"]

    other = _api(outsider)
    assert other.get("/api/v1/notifications/webhooks/").json()["results"] == []
    for method, suffix in (("get", ""), ("patch", ""), ("delete", ""), ("post", "rotate-secret/")):
        response = getattr(other, method)(
            f"/api/v1/notifications/webhooks/{hook_id}/{suffix}", {}, format="json"
        )
        assert response.status_code == 404, (method, suffix)
    assert Webhook.objects.get(pk=hook_id).secret == rotated.json()["secret"]

    paused = _api(member).patch(
        f"/api/v1/notifications/webhooks/{hook_id}/", {"is_active": False}, format="json"
    )
    assert paused.json()["is_active"] is False
    assert _api(member).delete(f"/api/v1/notifications/webhooks/{hook_id}/").status_code == 204


def test_production_refuses_webhooks_aimed_at_internal_addresses(settings: Any) -> None:
    settings.BERTH_WEBHOOK_ALLOW_PRIVATE = False
    client = _api(UserFactory())
    for url in (
        "http://hooks.example.org/x",
        "https://127.0.0.1/x",
        "https://10.1.2.3/x",
        "https://[::1]/x",
        "https://localhost/x",
        "https://169.254.169.254/latest",
    ):
        response = client.post("/api/v1/notifications/webhooks/", {"url": url}, format="json")
        assert response.status_code == 400, url
        assert "url" in response.json()["fields"]
    ok = client.post("/api/v1/notifications/webhooks/", {"url": "https://hooks.example.org/x"}, format="json")
    assert ok.status_code == 201


def test_delivery_log_is_the_owners_only_and_filters() -> None:
    user = UserFactory()
    other = UserFactory()
    hook = webhook_create(owner=user, url="https://hooks.example.org/a")
    mine_mail = _delivery(user, key="a")
    mine_hook = _delivery(user, webhook=hook, key="b")
    Delivery.objects.filter(pk=mine_hook.pk).update(
        status=Delivery.Status.FAILED, attempts=6, response_status=500
    )
    _delivery(other, key="c")

    rows = _api(user).get("/api/v1/notifications/deliveries/").json()["results"]
    assert {r["id"] for r in rows} == {mine_mail.pk, mine_hook.pk}
    failed = _api(user).get("/api/v1/notifications/deliveries/", {"status": "failed"}).json()["results"]
    assert [(r["id"], r["attempts"], r["response_status"]) for r in failed] == [(mine_hook.pk, 6, 500)]
    by_hook = _api(user).get("/api/v1/notifications/deliveries/", {"webhook": hook.pk}).json()["results"]
    assert [r["id"] for r in by_hook] == [mine_hook.pk]
    assert _api(user).get("/api/v1/notifications/deliveries/", {"status": "bogus"}).status_code == 400
    assert _api(other).get("/api/v1/notifications/deliveries/", {"webhook": hook.pk}).json()["results"] == []

    page = Client()
    page.force_login(user)
    log = page.get("/account/notifications/", {"part": "deliveries"}, HTTP_HX_REQUEST="true").content.decode()
    assert f'id="delivery-{mine_hook.pk}"' in log
    assert "HTTP 500" in log
