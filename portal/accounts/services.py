"""Writes for projects, memberships and quotas (used by admin tooling, the demo lab and tests)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

from portal.accounts.models import Membership, Project, Quota
from scheduling.models import GpuType


@transaction.atomic
def project_create(
    *, name: str, slug: str = "", fair_share_weight: float = 1.0, description: str = ""
) -> Project:
    """Create a project; ``slug`` defaults to the slugified name."""
    if fair_share_weight <= 0:
        raise ValidationError({"fair_share_weight": "Must be greater than zero."})
    slug = slug or slugify(name)
    if not slug:
        raise ValidationError({"slug": "A project needs a slug (letters, digits, dashes)."})
    if Project.objects.filter(slug=slug).exists() or Project.objects.filter(name=name).exists():
        raise ValidationError({"slug": "A project with this name or slug already exists."})
    return Project.objects.create(
        name=name, slug=slug, fair_share_weight=fair_share_weight, description=description
    )


@transaction.atomic
def membership_set(*, project: Project, user: User, role: str = Membership.Role.MEMBER) -> Membership:
    """Add the user to the project, or change their role; idempotent."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}."})
    membership, _ = Membership.objects.update_or_create(
        user_id=user.pk, project=project, defaults={"role": role}
    )
    return membership


@transaction.atomic
def quota_set(
    *, project: Project, gpu_type: GpuType, guaranteed_gpus: int, borrow_limit_gpus: int | None = None
) -> Quota:
    """Set the project's guaranteed and borrowable GPUs of one type; idempotent."""
    errors: dict[str, str] = {}
    if guaranteed_gpus < 0:
        errors["guaranteed_gpus"] = "Cannot be negative."
    if borrow_limit_gpus is not None and borrow_limit_gpus < 0:
        errors["borrow_limit_gpus"] = "Cannot be negative."
    if errors:
        raise ValidationError(errors)
    quota, _ = Quota.objects.update_or_create(
        project=project,
        gpu_type=gpu_type,
        defaults={"guaranteed_gpus": guaranteed_gpus, "borrow_limit_gpus": borrow_limit_gpus},
    )
    return quota


@transaction.atomic
def token_revoke(*, user: User, actor_label: str = "api") -> bool:
    """Delete the user's API token: requests carrying it are refused from now on (401).

    The next ``POST /api/v1/auth/token/`` issues a new one.  Returns whether a token existed;
    a revocation is an ``auth.token_revoke`` audit event either way.
    """
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from scheduling.services import audit_event_record

    deleted, _ = Token.objects.filter(user=user).delete()
    audit_event_record(
        actor=user,
        actor_label=actor_label,
        verb="auth.token_revoke",
        entity_type="user",
        entity_id=user.pk,
        before={"had_token": bool(deleted)},
        after=None,
        at=timezone.now(),
    )
    return bool(deleted)


@transaction.atomic
def token_create(*, user: User, actor_label: str = "user") -> str:
    """Issue a new API token for the user, replacing any old one (which stops working at once).

    Returns the new key.  An ``auth.token_create`` audit event records whether a token was
    replaced (never the key itself).
    """
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from scheduling.services import audit_event_record

    replaced, _ = Token.objects.filter(user=user).delete()
    token = Token.objects.create(user=user)
    audit_event_record(
        actor=user,
        actor_label=actor_label,
        verb="auth.token_create",
        entity_type="user",
        entity_id=user.pk,
        before={"had_token": bool(replaced)},
        after={"has_token": True},
        at=timezone.now(),
    )
    return str(token.key)
