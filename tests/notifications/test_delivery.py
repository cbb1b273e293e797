"""Deliveries end to end on loopback: a real SMTP server (aiosmtpd) receives the mail, a real HTTP
receiver (http.server in a thread) checks the HMAC signature, answers 500 once and takes the retry.

The sending task's body (`delivery_attempt`) is called directly, in order, so the test controls
when the retry happens; Celery's own retry scheduling is what `delivery_send` adds on top."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.events import job_event_emit
from notifications.models import Delivery, EventKind
from notifications.services import webhook_create
from notifications.tasks import delivery_attempt
from scheduling.models import Job
from tests.factories import JobFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp(settings: Any) -> Iterator[_Inbox]:
    inbox = _Inbox()
    with socket.socket() as probe:  # a free port (aiosmtpd's start-up check cannot use port 0)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    yield inbox
    controller.stop()


class _Receiver:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.statuses = [500]  # answers, in order; 200 once they are used up


@pytest.fixture
def receiver() -> Iterator[tuple[_Receiver, str]]:
    state = _Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.calls.append((dict(self.headers.items()), body))
            code = state.statuses.pop(0) if state.statuses else 200
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok" if code == 200 else b"boom")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_preemption_notice_mails_and_signs_a_webhook_retried_after_500(
    smtp: _Inbox, receiver: tuple[_Receiver, str], settings: Any
) -> None:
    state, url = receiver
    settings.BERTH_NOTIFY_BACKOFF_S = 1.0
    user = UserFactory(email="ada@example.org")
    job = JobFactory(user=user, status=Job.Status.RUNNING, is_preemptible=True, started_at=timezone.now())
    hook = webhook_create(owner=user, url=url)
    from scheduling.models import Preemption

    now = timezone.now()
    preemption = Preemption.objects.create(
        job=job, signalled_at=now, kill_at=now + timezone.timedelta(seconds=120), reason="booking 7 starts"
    )
    with transaction.atomic():
        job_event_emit(job, kind=EventKind.JOB_PREEMPTED, at=now, preemption=preemption, lost_gpu_s=7200.0)
        job_event_emit(job, kind=EventKind.JOB_PREEMPTED, at=now, preemption=preemption, lost_gpu_s=7200.0)
    deliveries = {d.channel: d for d in Delivery.objects.filter(user=user)}
    assert set(deliveries) == {"email", "webhook"}  # emitted twice, one delivery per channel

    mail = delivery_attempt(deliveries["email"].pk)
    assert mail is not None
    assert mail.status == Delivery.Status.SENT
    assert len(smtp.messages) == 1
    assert smtp.messages[0].rcpt_tos == ["ada@example.org"]
    text = " ".join(smtp.messages[0].content.decode().split())
    assert "Grace: 2 min" in text
    assert "2.00 GPU-hours" in text

    first = delivery_attempt(deliveries["webhook"].pk)
    assert first is not None
    assert first.status == Delivery.Status.RETRYING
    assert first.response_status == 500
    assert first.next_attempt_at is not None
    second = delivery_attempt(deliveries["webhook"].pk)
    assert second is not None
    assert second.status == Delivery.Status.SENT
    assert second.attempts == 2
    assert delivery_attempt(deliveries["webhook"].pk) is None  # sent: never again

    assert len(state.calls) == 2
    for headers, body in state.calls:
        expected = "sha256=" + hmac.new(hook.secret.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Berth-Signature"], expected)
    payload = json.loads(state.calls[1][1])
    assert payload["event"] == "job.preempted"
    assert payload["preemption"]["grace_s"] == 120.0
    assert payload["preemption"]["lost_gpu_s"] == 7200.0
    assert payload["job"]["id"] == job.pk

    # The owner sees the log with both attempts; another user sees neither the log nor the webhook.
    owner = APIClient()
    owner.force_authenticate(user)
    rows = owner.get("/api/v1/notifications/deliveries/").json()["results"]
    hook_row = next(r for r in rows if r["channel"] == "webhook")
    assert hook_row["attempts"] == 2
    assert hook_row["status"] == "sent"
    other = APIClient()
    other.force_authenticate(UserFactory())
    assert other.get("/api/v1/notifications/deliveries/").json()["results"] == []
    assert other.get(f"/api/v1/notifications/webhooks/{hook.pk}/").status_code == 404
    assert owner.get(f"/api/v1/notifications/webhooks/{hook.pk}/").status_code == 200


def test_preferences_api_validates_and_turns_mail_off() -> None:
    user = UserFactory(email="bob@example.org")
    client = APIClient()
    client.force_authenticate(user)
    bad = client.put("/api/v1/notifications/preferences/", {"email_events": ["nope"]}, format="json")
    assert bad.status_code == 400
    assert "email_events" in bad.json()["fields"]
    ok = client.put("/api/v1/notifications/preferences/", {"email_events": ["job.failed"]}, format="json")
    assert ok.status_code == 200
    assert ok.json()["email_events"] == ["job.failed"]
    job = JobFactory(user=user, status=Job.Status.COMPLETED, exit_code=0)
    with transaction.atomic():
        job_event_emit(job, kind=EventKind.JOB_FINISHED, at=timezone.now())
    assert not Delivery.objects.filter(user=user).exists()  # finished is not among the wanted events
