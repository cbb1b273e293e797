"""Every write of the notifications app: emitting events, preferences, webhooks, delivery outcomes.

`event_emit` is the one entry point the scheduling services and the engine round call when
something a person should hear about happens.  It writes one `Delivery` per channel and
recipient *in the caller's transaction* (so a rolled-back change notifies nobody) and
enqueues the sending task with ``transaction.on_commit`` (so a request or a round never
waits on SMTP or a webhook receiver).  The delivery key makes emitting idempotent.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from notifications.models import Delivery, EventKind, Preference, Webhook
from portal.accounts.models import Membership, Project

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one person's work.

    ``key`` names this occurrence (``job:12:started:1``: job 12's first start) so that the same
    occurrence emitted twice yields the same deliveries.  ``data`` is the webhook's JSON body
    (``event``, ``key`` and ``at`` are added); ``text`` is the mail body.
    """

    kind: str
    key: str
    user_id: int
    project_id: int | None
    subject: str
    text: str
    at: datetime
    data: Mapping[str, Any] = field(default_factory=dict)


def _preference(user_id: int) -> Preference | None:
    return Preference.objects.filter(user_id=user_id).first()


def preference_get(*, user: User) -> Preference:
    """The user's preferences (defaults when never saved; not written until changed)."""
    return _preference(user.pk) or Preference(user=user)


def _delivery_key(event_key: str, channel: str, recipient: str) -> str:
    return f"{event_key}|{channel}|{recipient}"[:300]


_deferred: ContextVar[list[Event] | None] = ContextVar("notifications_deferred", default=None)


@contextmanager
def events_deferred() -> Iterator[None]:
    """Collect every `event_emit` inside the block and record them together at its end, in a few
    queries whatever their number (an engine round that starts or finishes hundreds of jobs)."""
    outer = _deferred.get()
    if outer is not None:  # already deferring: the outer block records them
        yield
        return
    token = _deferred.set([])
    try:
        yield
        pending = _deferred.get() or []
    finally:
        _deferred.reset(token)
    events_emit(pending)


def event_emit(event: Event) -> list[int]:
    """Record the deliveries of ``event`` and send them after the commit; returns the new delivery ids
    (none yet inside `events_deferred`, which records it at the block's end).

    Recipients: the owner by mail when their preferences want this kind (and they have an
    address); the owner's own active webhooks subscribed to the kind; the active webhooks of
    the event's project subscribed to it.  Deliveries that exist already (same key) are left
    alone, so re-emitting sends nothing twice.
    """
    pending = _deferred.get()
    if pending is not None:
        pending.append(event)
        return []
    return events_emit([event])


def _delivery_rows(
    event: Event, user: User, pref: Preference | None, hooks: Sequence[Webhook]
) -> list[Delivery]:
    payload = {"event": event.kind, "key": event.key, "at": event.at.isoformat(), **event.data}
    rows: list[Delivery] = []
    wants_mail = pref is None or (pref.is_email_enabled and event.kind in pref.email_events)
    if wants_mail and user.email:
        rows.append(
            Delivery(
                key=_delivery_key(event.key, Delivery.Channel.EMAIL, user.email),
                event_key=event.key,
                event=event.kind,
                channel=Delivery.Channel.EMAIL,
                user_id=user.pk,
                recipient=user.email,
                subject=event.subject[:300],
                payload={**payload, "text": event.text},
                created_at=event.at,
            )
        )
    for hook in hooks:
        is_own = hook.owner_id == user.pk and hook.project_id is None
        is_project = event.project_id is not None and hook.project_id == event.project_id
        if event.kind not in hook.events or not (is_own or is_project):
            continue
        rows.append(
            Delivery(
                key=_delivery_key(event.key, Delivery.Channel.WEBHOOK, str(hook.pk)),
                event_key=event.key,
                event=event.kind,
                channel=Delivery.Channel.WEBHOOK,
                user_id=hook.owner_id,
                webhook=hook,
                recipient=hook.url,
                subject=event.subject[:300],
                payload=payload,
                created_at=event.at,
            )
        )
    return rows


def events_emit(events: Sequence[Event]) -> list[int]:
    """`event_emit` for many events at once: a fixed number of queries, whatever their number."""
    if not events:
        return []
    user_ids = {e.user_id for e in events}
    project_ids = {e.project_id for e in events if e.project_id is not None}
    users = {u.pk: u for u in User.objects.filter(pk__in=user_ids, is_active=True).only("id", "email")}
    if not users:
        return []
    prefs = {p.user_id: p for p in Preference.objects.filter(user_id__in=list(users))}
    hooks = list(
        Webhook.objects.filter(
            is_active=True, owner__is_active=True, events__overlap=list({e.kind for e in events})
        )
        .filter(Q(owner_id__in=list(users), project__isnull=True) | Q(project_id__in=list(project_ids)))
        .order_by("pk")
    )
    rows: dict[str, Delivery] = {}
    for event in events:
        user = users.get(event.user_id)
        if user is not None:
            for row in _delivery_rows(event, user, prefs.get(user.pk), hooks):
                rows.setdefault(row.key, row)
    if not rows:
        return []
    existing = set(Delivery.objects.filter(key__in=list(rows)).values_list("key", flat=True))
    fresh = [r for key, r in rows.items() if key not in existing]
    # A concurrent emitter may insert the same key between the read and the write: ignore it.
    Delivery.objects.bulk_create(fresh, ignore_conflicts=True)
    ids = list(Delivery.objects.filter(key__in=[r.key for r in fresh]).values_list("id", flat=True))
    if ids:
        transaction.on_commit(lambda: _enqueue(ids))
    return ids


def _enqueue(ids: Sequence[int]) -> None:
    from notifications.tasks import delivery_send

    for delivery_id in ids:
        try:
            delivery_send.delay(delivery_id)
        except Exception:  # the broker is down: the sweep task sends it later
            logger.warning(
                "could not enqueue delivery %s; the sweep will send it", delivery_id, exc_info=True
            )


# ---- delivery outcomes (called by the sending task) ----


def delivery_record_attempt(
    *,
    delivery_id: int,
    is_ok: bool,
    response_status: int | None,
    error: str,
    next_attempt_at: datetime | None,
    now: datetime | None = None,
) -> Delivery:
    """Write the outcome of one sending attempt: sent, retrying (with the next time) or failed."""
    now = now or timezone.now()
    with transaction.atomic():
        delivery = Delivery.objects.select_for_update().get(pk=delivery_id)
        delivery.attempts += 1
        delivery.last_attempt_at = now
        delivery.response_status = response_status
        delivery.last_error = error[:1000]
        if is_ok:
            delivery.status = Delivery.Status.SENT
            delivery.sent_at = now
            delivery.next_attempt_at = None
        elif next_attempt_at is not None:
            delivery.status = Delivery.Status.RETRYING
            delivery.next_attempt_at = next_attempt_at
        else:
            delivery.status = Delivery.Status.FAILED
            delivery.next_attempt_at = None
        delivery.save()
    return delivery


# ---- preferences and webhooks (owner-scoped writes) ----


def _check_events(events: Sequence[str], *, field_name: str) -> list[str]:
    unknown = sorted(set(events) - set(EventKind.values))
    if unknown:
        raise ValidationError({field_name: [f"Unknown event(s): {', '.join(unknown)}."]})
    return sorted(set(events))


def preference_update(
    *,
    user: User,
    is_email_enabled: bool | None = None,
    email_events: Sequence[str] | None = None,
    booking_start_lead_min: int | None = None,
    booking_end_lead_min: int | None = None,
) -> Preference:
    """Change the user's notification preferences (only the given fields)."""
    errors: dict[str, list[str]] = {}
    for name, value in (
        ("booking_start_lead_min", booking_start_lead_min),
        ("booking_end_lead_min", booking_end_lead_min),
    ):
        if value is not None and not 0 <= value <= 10_080:
            errors[name] = ["Give 0 to 10080 minutes (a week)."]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        pref, _ = Preference.objects.select_for_update().get_or_create(user=user)
        if is_email_enabled is not None:
            pref.is_email_enabled = is_email_enabled
        if email_events is not None:
            pref.email_events = _check_events(email_events, field_name="email_events")
        if booking_start_lead_min is not None:
            pref.booking_start_lead_min = booking_start_lead_min
        if booking_end_lead_min is not None:
            pref.booking_end_lead_min = booking_end_lead_min
        pref.save()
    return pref


def _check_project(user: User, project: Project | None) -> None:
    if project is None:
        return
    is_manager = Membership.objects.filter(user=user, project=project, role=Membership.Role.MANAGER).exists()
    if not (is_manager or user.is_staff):
        raise PermissionDenied("Only a manager of the project can add a webhook for all of its work.")


def _check_url(url: str) -> str:
    """A receiver URL Berth will POST to: http(s) only and, unless ``BERTH_WEBHOOK_ALLOW_PRIVATE``
    (on outside production), https and not a loopback, private or link-local address, so a webhook
    cannot be aimed at the portal's own network."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError({"url": ["Give an http(s) URL."]})
    if settings.BERTH_WEBHOOK_ALLOW_PRIVATE:
        return url
    if parts.scheme != "https":
        raise ValidationError({"url": ["Webhooks must use https."]})
    host = parts.hostname.lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    is_internal = host == "localhost" or host.endswith((".localhost", ".local", ".internal"))
    if address is not None:
        is_internal = not address.is_global
    if is_internal:
        raise ValidationError({"url": ["Webhooks cannot point at a loopback, private or internal address."]})
    return url


def webhook_create(
    *, owner: User, url: str, events: Sequence[str] | None = None, project: Project | None = None
) -> Webhook:
    """A webhook for the owner's own work, or (a project manager) for all work of ``project``.

    Its secret is generated here (32 random bytes, hex) and returned on the row.
    """
    _check_project(owner, project)
    return Webhook.objects.create(
        owner=owner,
        project=project,
        url=_check_url(url),
        secret=secrets.token_hex(32),
        events=_check_events(events, field_name="events") if events is not None else list(EventKind.values),
    )


def webhook_update(
    webhook: Webhook,
    *,
    url: str | None = None,
    events: Sequence[str] | None = None,
    is_active: bool | None = None,
) -> Webhook:
    if url is not None:
        webhook.url = _check_url(url)
    if events is not None:
        webhook.events = _check_events(events, field_name="events")
    if is_active is not None:
        webhook.is_active = is_active
    webhook.save()
    return webhook


def webhook_delete(webhook: Webhook) -> None:
    webhook.delete()


def webhook_secret_rotate(webhook: Webhook) -> Webhook:
    webhook.secret = secrets.token_hex(32)
    webhook.save(update_fields=["secret"])
    return webhook
