"""Writes for projects, memberships and quotas (used by admin tooling, the demo lab and tests)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

from portal.accounts.models import Membership, OidcIdentity, Project, Quota
from portal.accounts.sso import (
    OidcConfig,
    OidcError,
    OidcSignInRefusedError,
    desired_memberships,
    groups_from_claims,
    username_from_claims,
)
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


@transaction.atomic
def memberships_sync_from_groups(
    *, user: User, groups: list[str], config: OidcConfig
) -> list[dict[str, str]]:
    """Make the user's memberships of the projects single sign-on manages follow their groups.

    Adds granted memberships, removes those of managed projects no group grants any more (a
    manager's too), and in role-managed projects sets the role the groups give.  Projects
    single sign-on does not manage are left alone.  Returns the changes, each also an audit event.
    """
    from django.utils import timezone

    from scheduling.services import audit_event_record

    existing_slugs = set(Project.objects.values_list("slug", flat=True))
    granted, managed, role_managed = desired_memberships(groups, config=config, existing_slugs=existing_slugs)
    current = {
        m.project.slug: m
        for m in Membership.objects.select_for_update().select_related("project").filter(user_id=user.pk)
    }
    projects = {p.slug: p for p in Project.objects.filter(slug__in=set(granted) - set(current))}
    changes: list[dict[str, str]] = []
    for slug, role in sorted(granted.items()):
        membership = current.get(slug)
        if membership is None:
            membership = Membership.objects.create(user=user, project=projects[slug], role=role)
            changes.append({"project": slug, "change": "added", "role": role})
        elif slug in role_managed and membership.role != role:
            changes.append({"project": slug, "change": "role", "role": role, "was": membership.role})
            membership.role = role
            membership.save(update_fields=["role"])
    for slug, membership in sorted(current.items()):
        if slug in managed and slug not in granted:
            changes.append({"project": slug, "change": "removed", "role": membership.role})
            membership.delete()
    now = timezone.now()
    for change in changes:
        audit_event_record(
            actor=user,
            actor_label="user",
            verb=f"membership.sso_{change['change']}",
            entity_type="user",
            entity_id=user.pk,
            before=None,
            after={**change, "source": "sso"},
            at=now,
        )
    return changes


def _oidc_link_existing(*, claims: Mapping[str, Any], config: OidcConfig, username: str) -> User | None:
    """An existing account a first sign-in may take over (``BERTH_OIDC_LINK_EXISTING``).

    Staff and superuser accounts are never linked automatically: an administrator links them
    in the admin (OidcIdentity), so a provider account cannot become a Berth admin by name.
    """
    candidates = User.objects.filter(is_staff=False, is_superuser=False, oidc_identities__isnull=True)
    if config.link_existing == "username":
        return candidates.filter(username=username).first()
    if config.link_existing == "email":
        email = claims.get("email")
        if not isinstance(email, str) or not email or claims.get("email_verified") is not True:
            return None
        matches = list(candidates.filter(email__iexact=email)[:2])
        return matches[0] if len(matches) == 1 else None
    return None


@transaction.atomic
def oidc_user_sign_in(*, issuer: str, claims: Mapping[str, Any], config: OidcConfig) -> User:
    """The Berth user a verified set of claims signs in, with memberships mapped from its groups.

    Found by ``(issuer, sub)``; at a first sign-in linked to an existing account (if allowed) or
    created (if allowed) under the username claim.  Name and e-mail follow the claims at every
    sign-in; the username does not change once made.  Raises ``OidcError`` with a sentence for
    the person when the claims are incomplete or the account may not sign in.
    """
    from django.utils import timezone

    from scheduling.services import audit_event_record

    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise OidcError("The provider did not say who you are (no 'sub' claim).")
    groups = groups_from_claims(claims, claim=config.groups_claim)
    identity = (
        OidcIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=subject)
        .first()
    )
    created = False
    if identity is None:
        username = username_from_claims(claims, claim=config.username_claim)
        user = _oidc_link_existing(claims=claims, config=config, username=username)
        if user is None:
            if User.objects.filter(username=username).exists():
                raise OidcSignInRefusedError(
                    f"A Berth account named {username!r} already exists and is not linked to this "
                    "sign-in. Sign in with its password, or ask an administrator to link it."
                )
            if not config.create_users:
                raise OidcSignInRefusedError(
                    "You have no Berth account yet, and this Berth does not create accounts at sign-in. "
                    "Ask an administrator for one."
                )
            user = User.objects.create_user(username)
            user.set_unusable_password()
            created = True
        identity = OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    user = identity.user
    if not user.is_active:
        raise OidcSignInRefusedError("Your Berth account is disabled. Ask an administrator.")
    for field, claim, max_length in (
        ("email", "email", 254),
        ("first_name", "given_name", 150),
        ("last_name", "family_name", 150),
    ):
        value = claims.get(claim)
        if isinstance(value, str):
            setattr(user, field, value[:max_length])
    user.save()
    now = timezone.now()
    identity.groups = groups
    identity.last_login_at = now
    identity.save(update_fields=["groups", "last_login_at"])
    changes = memberships_sync_from_groups(user=user, groups=groups, config=config)
    audit_event_record(
        actor=user,
        actor_label="user",
        verb="auth.sso_login",
        entity_type="user",
        entity_id=user.pk,
        before=None,
        after={"issuer": issuer, "created": created, "groups": groups[:50], "memberships": changes},
        at=now,
    )
    return user
