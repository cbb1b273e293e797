"""Projects, their members and their GPU quotas.

A project is the unit of fair share: its members book and run work against it, its
managers see and manage all of its work, and a `Quota` per GPU type says how many GPUs it
is guaranteed (never preempted) and how many more it may borrow (always preemptible).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Project(models.Model):
    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True)
    description = models.TextField(blank=True, default="")
    # Relative share of the cluster in fair-share ordering (1.0 = one ordinary share).
    fair_share_weight = models.FloatField(default=1.0)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(fair_share_weight__gt=0), name="project_weight_positive"),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_unique_user_project"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"

    @property
    def is_manager(self) -> bool:
        return self.role == self.Role.MANAGER


class Quota(models.Model):
    """How many GPUs of one type a project is guaranteed and may borrow on top.

    ``borrow_limit_gpus`` is ``None`` for "no limit on borrowing"; borrowed GPUs always run
    as preemptible work (DESIGN §3.4).
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    gpu_type = models.ForeignKey("scheduling.GpuType", on_delete=models.CASCADE, related_name="quotas")
    guaranteed_gpus = models.PositiveIntegerField(default=0)
    borrow_limit_gpus = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["project__name", "gpu_type__name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "gpu_type"], name="quota_unique_project_gpu_type"),
        ]

    def __str__(self) -> str:
        return f"{self.project}: {self.guaranteed_gpus} x {self.gpu_type} (+{self.borrow_limit_gpus})"

    @property
    def max_gpus(self) -> int | None:
        """Guaranteed plus borrowable GPUs, or ``None`` when borrowing is unlimited."""
        return quota_max_gpus(self.guaranteed_gpus, self.borrow_limit_gpus)


def quota_max_gpus(guaranteed_gpus: int, borrow_limit_gpus: int | None) -> int | None:
    """A quota's ceiling: guaranteed plus borrowable GPUs, ``None`` when borrowing is unlimited
    (``Quota.max_gpus`` and ``scheduling.queries.QuotaRow.max_gpus``)."""
    if borrow_limit_gpus is None:
        return None
    return guaranteed_gpus + borrow_limit_gpus


class RateCounter(models.Model):
    """A sign-in or write counter kept in PostgreSQL while the cache (Redis) is unreachable.

    ``portal.security`` counts in Redis; when Redis is down it counts here instead, with the
    same semantics (one row per key, ``count`` since the window began, expiring at
    ``expires_at``), so the lockout and the write throttle keep working through an outage.
    """

    key = models.CharField(max_length=200, primary_key=True)
    count = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.count} until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class OidcIdentity(models.Model):
    """The link between a Berth user and one subject at one OpenID Connect provider.

    Users signing in through single sign-on are found by ``(issuer, subject)``, never by a
    username or e-mail the provider could reuse or let people change (portal.accounts.oidc).
    ``groups`` is the groups claim of the latest sign-in, as the memberships were mapped from it.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    groups = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["issuer", "subject"]
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidcidentity_unique_issuer_subject"),
        ]

    def __str__(self) -> str:
        return f"{self.user} as {self.subject} at {self.issuer}"
