"""Sending one delivery: a mail through Django's mail API, or a signed JSON POST to a webhook.

The webhook body is the delivery's payload as compact JSON (UTF-8, keys sorted); the header
``X-Berth-Signature: sha256=<hex>`` is HMAC-SHA256 of exactly those bytes under the webhook's
secret, so a receiver verifies it before parsing.  ``X-Berth-Event`` names the event kind and
``X-Berth-Delivery`` the delivery id (the same on every retry: receivers can deduplicate).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage

from notifications.models import Delivery

SIGNATURE_HEADER = "X-Berth-Signature"


@dataclass(frozen=True, slots=True)
class SendResult:
    is_ok: bool
    response_status: int | None = None
    error: str = ""
    is_retryable: bool = True


def webhook_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, body: bytes) -> str:
    """The ``X-Berth-Signature`` value for ``body``: ``sha256=`` + hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def send_email(delivery: Delivery) -> SendResult:
    text = str(delivery.payload.get("text") or delivery.subject)
    message = EmailMessage(
        subject=delivery.subject,
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[delivery.recipient],
        headers={"X-Berth-Event": delivery.event, "X-Berth-Delivery": str(delivery.pk)},
    )
    try:
        message.send(fail_silently=False)
    except Exception as exc:  # SMTP refusals, connection errors: all worth a retry
        return SendResult(is_ok=False, error=f"{type(exc).__name__}: {exc}"[:1000])
    return SendResult(is_ok=True)


def send_webhook(delivery: Delivery) -> SendResult:
    webhook = delivery.webhook
    if webhook is None or not webhook.is_active:
        return SendResult(is_ok=False, error="The webhook was removed or disabled.", is_retryable=False)
    body = webhook_body(dict(delivery.payload))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Berth-Webhook/1",
        SIGNATURE_HEADER: signature(webhook.secret, body),
        "X-Berth-Event": delivery.event,
        "X-Berth-Delivery": str(delivery.pk),
    }
    try:
        response = httpx.post(
            webhook.url,
            content=body,
            headers=headers,
            timeout=settings.BERTH_WEBHOOK_TIMEOUT_S,
            follow_redirects=False,
        )
    except httpx.HTTPError as exc:
        return SendResult(is_ok=False, error=f"{type(exc).__name__}: {exc}"[:1000])
    if 200 <= response.status_code < 300:
        return SendResult(is_ok=True, response_status=response.status_code)
    # 4xx other than 408/429 means the receiver will not take it as sent; still retried a few
    # times (a receiver deploying answers 404 for a moment), and logged for the owner.
    return SendResult(
        is_ok=False,
        response_status=response.status_code,
        error=f"HTTP {response.status_code}: {response.text[:300]}",
    )


def send(delivery: Delivery) -> SendResult:
    if delivery.channel == Delivery.Channel.EMAIL:
        return send_email(delivery)
    return send_webhook(delivery)
