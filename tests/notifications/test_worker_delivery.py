"""A real Celery worker sends what a committed state change emitted: the mail over SMTP to aiosmtpd on
loopback, the webhook to a loopback receiver that answers 500 once, and Celery's own retry (with the
backoff, 1 s here) delivers it on the second attempt.  A rolled-back change sends nothing.

The worker is `tests.integration.test_worker`'s (prefork, the test database, a private broker db),
started with the SMTP port and a 1 s backoff in its environment."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.db import connection, transaction
from django.utils import timezone

from notifications import tasks
from notifications.events import job_event_emit
from notifications.models import Delivery, EventKind
from notifications.services import webhook_create
from portal.celery import app
from scheduling.models import Job
from tests.factories import JobFactory, UserFactory
from tests.integration import test_worker
from tests.integration.loop import BROKER_REDIS_URL

pytestmark = [pytest.mark.celery, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope)
        return "250 OK"


@pytest.fixture(scope="module")
def smtp() -> Iterator[tuple[_Inbox, int]]:
    inbox = _Inbox()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


@pytest.fixture(scope="module")
def notify_worker(smtp: tuple[_Inbox, int], request: pytest.FixtureRequest) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
        env.setenv("EMAIL_HOST", "127.0.0.1")
        env.setenv("EMAIL_PORT", str(smtp[1]))
        env.setenv("BERTH_NOTIFY_BACKOFF_S", "1")
        env.setenv("BERTH_WEBHOOK_ALLOW_PRIVATE", "1")
        yield request.getfixturevalue("worker")


worker = test_worker.worker


@pytest.fixture
def receiver() -> Iterator[tuple[list[tuple[float, dict[str, str], bytes]], str]]:
    calls: list[tuple[float, dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            calls.append((time.monotonic(), dict(self.headers.items()), body))
            code = 500 if len(calls) == 1 else 200
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield calls, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def _wait(predicate: Callable[[], object], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        connection.close()  # see the worker's commits
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_worker_sends_after_commit_and_retries_the_webhook_after_a_500(
    notify_worker: Any,
    smtp: tuple[_Inbox, int],
    receiver: tuple[list[Any], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inbox, _ = smtp
    calls, url = receiver

    def to_the_test_broker(delivery_id: int) -> None:  # the worker consumes a private broker db
        with app.connection_for_write(BROKER_REDIS_URL) as conn:
            tasks.delivery_send.apply_async(args=[delivery_id], connection=conn)

    monkeypatch.setattr(tasks.delivery_send, "delay", to_the_test_broker)
    user = UserFactory(email="ada@lab.example")
    hook = webhook_create(owner=user, url=url)
    job = JobFactory(user=user, status=Job.Status.FAILED, exit_code=2, status_message="exited with status 2")

    def emit_then_roll_back() -> None:
        with transaction.atomic():
            job_event_emit(job, kind=EventKind.JOB_FAILED, at=timezone.now())
            raise RuntimeError("the change is rolled back")

    with pytest.raises(RuntimeError):
        emit_then_roll_back()
    assert not Delivery.objects.exists()

    t_commit = time.monotonic()
    with transaction.atomic():
        job_event_emit(job, kind=EventKind.JOB_FAILED, at=timezone.now())
    assert time.monotonic() - t_commit < 2.0  # the commit does not wait for SMTP or the receiver

    def all_sent() -> bool:
        return set(Delivery.objects.values_list("status", flat=True)) == {Delivery.Status.SENT}

    _wait(all_sent, timeout_s=60, what="the worker to send the mail and the webhook")
    assert len(inbox.messages) == 1
    assert inbox.messages[0].rcpt_tos == ["ada@lab.example"]
    assert b"failed (exit code 2)" in inbox.messages[0].content
    hook_row = Delivery.objects.get(channel=Delivery.Channel.WEBHOOK)
    assert hook_row.attempts == 2
    assert hook_row.response_status == 200
    assert len(calls) == 2
    assert calls[1][0] - calls[0][0] >= 0.9  # Celery's retry waited the backoff
    for _, headers, body in calls:
        expected = "sha256=" + hmac.new(hook.secret.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Berth-Signature"], expected)
        assert headers["X-Berth-Delivery"] == str(hook_row.pk)
