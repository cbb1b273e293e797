"""A webhook receiver for the demo lab and the tests: it checks each call's signature the way a
real receiver should, and logs what it got.

It looks the webhook's secret up by the ``X-Berth-Delivery`` id (it runs beside the portal, on
its database), recomputes HMAC-SHA256 over the raw body and compares in constant time; a call
whose signature does not match is answered 401 and logged as refused.  `webhooks_ensure` points
a webhook of each project (owned by its manager) at the receiver, so the demo's events reach it.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import close_old_connections

from notifications.channels import SIGNATURE_HEADER, signature
from notifications.models import Delivery, Webhook
from portal.accounts.models import Membership, Project

logger = logging.getLogger("berth.webhook_receiver")

MAX_BODY_BYTES = 1_000_000


@dataclass
class Received:
    """What the receiver has seen: (delivery id, event, verified) per call, newest last."""

    calls: list[tuple[int | None, str, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _secret_of(delivery_id: int) -> str | None:
    close_old_connections()
    row = Delivery.objects.filter(pk=delivery_id).select_related("webhook").first()
    return row.webhook.secret if row is not None and row.webhook is not None else None


def make_handler(
    received: Received, *, log: Callable[[str], None] = logger.info
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413, "too large")
                return
            body = self.rfile.read(length)
            raw_id = self.headers.get("X-Berth-Delivery", "")
            delivery_id = int(raw_id) if raw_id.isdigit() else None
            secret = _secret_of(delivery_id) if delivery_id is not None else None
            given = self.headers.get(SIGNATURE_HEADER, "")
            is_ok = secret is not None and hmac.compare_digest(given, signature(secret, body))
            event = self.headers.get("X-Berth-Event", "?")
            with received.lock:
                received.calls.append((delivery_id, event, is_ok))
            if not is_ok:
                log(f"webhook REFUSED delivery={raw_id or '-'} event={event}: bad or missing signature")
                self._answer(401, "bad signature")
                return
            try:
                payload: dict[str, Any] = json.loads(body)
            except ValueError:
                self._answer(400, "not JSON")
                return
            summary = {k: payload[k] for k in ("job", "booking", "preemption") if k in payload}
            log(
                f"webhook verified delivery={delivery_id} event={event} key={payload.get('key')} "
                f"signature={given[:19]}... {json.dumps(summary, sort_keys=True)[:400]}"
            )
            self._answer(200, "ok")

        def _answer(self, code: int, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per call is logged above

    return Handler


def server_make(host: str, port: int, received: Received, **kwargs: Any) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), make_handler(received, **kwargs))


def webhooks_ensure(*, url: str, projects: Iterable[Project]) -> list[Webhook]:
    """An active webhook of each project (owned by a manager of it) to ``url``; existing ones are kept."""
    from notifications.services import webhook_create

    hooks = []
    for project in projects:
        existing = Webhook.objects.filter(project=project, url=url).first()
        if existing is not None:
            if not existing.is_active:
                existing.is_active = True
                existing.save(update_fields=["is_active"])
            hooks.append(existing)
            continue
        manager = (
            Membership.objects.filter(project=project, role=Membership.Role.MANAGER)
            .select_related("user")
            .order_by("id")
            .first()
        )
        if manager is not None:
            hooks.append(webhook_create(owner=manager.user, url=url, project=project))
    return hooks
