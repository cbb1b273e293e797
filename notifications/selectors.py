"""Reads of the notifications app, scoped to their owner (another user's webhook or delivery is a 404)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404

from notifications.models import Delivery, Webhook


def webhook_list(*, user: User) -> QuerySet[Webhook]:
    return Webhook.objects.filter(owner=user).select_related("project").order_by("-created_at", "-id")


def webhook_get(*, user: User, webhook_id: int) -> Webhook:
    webhook = webhook_list(user=user).filter(pk=webhook_id).first()
    if webhook is None:
        raise Http404("No such webhook.")
    return webhook


def delivery_list(
    *, user: User, webhook_id: int | None = None, status: str | None = None
) -> QuerySet[Delivery]:
    """The user's delivery log: mails sent to them and calls of their webhooks, newest first."""
    qs = Delivery.objects.filter(user=user).order_by("-created_at", "-id")
    if webhook_id is not None:
        qs = qs.filter(webhook_id=webhook_id)
    if status:
        qs = qs.filter(status=status)
    return qs
