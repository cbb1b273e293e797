"""Notification preferences, webhooks and the delivery log.

A `Delivery` is one message of one event on one channel to one recipient.  Its ``key`` is
unique: the event's key (``job:12:started:1``), the channel and the recipient, so emitting
the same event twice (a round run again after a crash, a beat scan overlapping the last)
never sends twice.  Rows are written in the transaction that makes the state change and
sent by a Celery task after the commit (``notifications.tasks``).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class EventKind(models.TextChoices):
    BOOKING_STARTING = "booking.starting", "Booking starts soon"
    BOOKING_STARTED = "booking.started", "Booking started (how to get on its GPUs)"
    BOOKING_ENDING = "booking.ending", "Booking ends soon"
    BOOKING_RECLAIMED = "booking.reclaimed", "Lent work is reclaimed for a booking"
    BOOKING_AT_RISK = "booking.at_risk", "Booking refused or late at its start"
    JOB_PREEMPTED = "job.preempted", "Preemption notice (grace, lost work)"
    JOB_STARTED = "job.started", "Job started"
    JOB_FINISHED = "job.finished", "Job finished"
    JOB_FAILED = "job.failed", "Job failed"
    JOB_CANNOT_START = "job.cannot_start", "Job cannot start"


def _all_events() -> list[str]:
    return list(EventKind.values)


class Preference(models.Model):
    """What one user wants to hear about, and how far ahead."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    is_email_enabled = models.BooleanField(default=True)
    email_events = ArrayField(models.CharField(max_length=32), default=_all_events, blank=True)
    # "Booking starts in N minutes" and "booking ends in N minutes".
    booking_start_lead_min = models.PositiveIntegerField(default=15)
    booking_end_lead_min = models.PositiveIntegerField(default=10)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(booking_start_lead_min__lte=10_080), name="preference_start_lead_at_most_week"
            ),
            models.CheckConstraint(
                condition=Q(booking_end_lead_min__lte=10_080), name="preference_end_lead_at_most_week"
            ),
        ]

    def __str__(self) -> str:
        return f"Notification preferences of {self.user}"


class Webhook(models.Model):
    """An HTTPS endpoint that receives events as signed JSON: the owner's own work, or (a project
    manager's webhook) all work of one project."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="webhooks", null=True, blank=True
    )
    url = models.URLField(max_length=500)
    # HMAC-SHA256 key of the X-Berth-Signature header; shown to the owner once, at creation.
    secret = models.CharField(max_length=128)
    events = ArrayField(models.CharField(max_length=32), default=_all_events, blank=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "is_active"], name="webhook_project_active")]

    def __str__(self) -> str:
        return f"Webhook {self.pk} → {self.url}"


class Delivery(models.Model):
    class Channel(models.TextChoices):
        EMAIL = "email", "E-mail"
        WEBHOOK = "webhook", "Webhook"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RETRYING = "retrying", "Retrying"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"  # gave up after the last attempt

    key = models.CharField(max_length=300, unique=True)  # event key | channel | recipient
    event_key = models.CharField(max_length=200)
    event = models.CharField(max_length=32, choices=EventKind.choices)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    # Whose log it is: the recipient of a mail, the owner of the webhook.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    webhook = models.ForeignKey(
        Webhook, on_delete=models.CASCADE, related_name="deliveries", null=True, blank=True
    )
    recipient = models.CharField(max_length=500)  # an address or the webhook's URL
    subject = models.CharField(max_length=300)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["user", "-created_at"], name="delivery_user_created"),
            models.Index(fields=["status", "next_attempt_at"], name="delivery_status_next"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.event} to {self.recipient} ({self.status})"
