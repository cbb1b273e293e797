"""Single sign-on rules that need no database: the configuration, the groups claim, the mapping
of groups to project memberships, and the errors a sign-in can end in.

The settings are the ``BERTH_OIDC_*`` block of ``portal/settings``; ``docs/sso.md`` describes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MEMBER = "member"
MANAGER = "manager"
_USERNAME_RE = re.compile(r"^[\w.@+-]{1,150}$")


class OidcError(Exception):
    """A sign-in through the provider that cannot go on; ``message`` is shown to the person.

    ``status`` is the HTTP status of the page that says so.
    """

    status = 400
    title = "Single sign-on did not work"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OidcProviderUnavailableError(OidcError):
    """The identity provider did not answer, or answered with garbage (503, try again later)."""

    status = 503
    title = "The sign-in service is not reachable"


class OidcSignInRefusedError(OidcError):
    """The provider or Berth refused this person (denied consent, no account, disabled account)."""

    status = 403
    title = "Sign-in refused"


@dataclass(frozen=True, slots=True)
class ProjectGrant:
    """Membership of one project (by slug) with one role, granted by one group."""

    slug: str
    role: str = MEMBER


@dataclass(frozen=True, slots=True)
class OidcConfig:
    """The single sign-on settings of this process (``BERTH_OIDC_*``)."""

    client_id: str
    client_secret: str
    provider_name: str
    issuer: str
    endpoints: Mapping[str, str]
    scopes: str
    sign_algo: str
    username_claim: str
    groups_claim: str
    project_map: Mapping[str, tuple[ProjectGrant, ...]]
    groups_are_project_slugs: bool
    create_users: bool
    link_existing: str
    timeout_s: float
    discovery_cache_s: int
    verify_tls: bool
    clock_skew_s: int = 60

    @property
    def is_enabled(self) -> bool:
        return bool(self.client_id)

    @property
    def manages_all_projects(self) -> bool:
        """Whether the groups claim decides membership of every project (slug mode)."""
        return self.groups_are_project_slugs


def project_map_parse(text: str) -> dict[str, tuple[ProjectGrant, ...]]:
    """Parse ``BERTH_OIDC_PROJECT_MAP``: ``GROUP=SLUG[:manager]`` entries separated by ``;`` or
    new lines.  A group may appear more than once (several projects); the group is everything
    before the last ``=`` (Keycloak paths and Azure object ids both fit)."""
    grants: dict[str, list[ProjectGrant]] = {}
    for raw in re.split(r"[;\n]", text):
        entry = raw.strip()
        if not entry:
            continue
        group, sep, target = entry.rpartition("=")
        slug, _, role = target.strip().partition(":")
        role = role.strip() or MEMBER
        if not sep or not group.strip() or not slug.strip() or role not in (MEMBER, MANAGER):
            raise ImproperlyConfigured(
                f"BERTH_OIDC_PROJECT_MAP entry {entry!r} is not GROUP=SLUG or GROUP=SLUG:manager."
            )
        grants.setdefault(group.strip(), []).append(ProjectGrant(slug=slug.strip(), role=role))
    return {group: tuple(items) for group, items in grants.items()}


def oidc_config() -> OidcConfig:
    """The configuration as the settings say now (tests change settings between requests)."""
    link = settings.BERTH_OIDC_LINK_EXISTING.strip().lower() or "none"
    if link not in ("none", "username", "email"):
        raise ImproperlyConfigured("BERTH_OIDC_LINK_EXISTING is none, username or email.")
    return OidcConfig(
        client_id=settings.BERTH_OIDC_CLIENT_ID,
        client_secret=settings.BERTH_OIDC_CLIENT_SECRET,
        provider_name=settings.BERTH_OIDC_PROVIDER_NAME or "single sign-on",
        issuer=settings.BERTH_OIDC_ISSUER.rstrip("/"),
        endpoints={
            "authorization_endpoint": settings.BERTH_OIDC_AUTHORIZATION_ENDPOINT,
            "token_endpoint": settings.BERTH_OIDC_TOKEN_ENDPOINT,
            "userinfo_endpoint": settings.BERTH_OIDC_USERINFO_ENDPOINT,
            "jwks_uri": settings.BERTH_OIDC_JWKS_URI,
            "end_session_endpoint": settings.BERTH_OIDC_END_SESSION_ENDPOINT,
        },
        scopes=settings.BERTH_OIDC_SCOPES,
        sign_algo=settings.BERTH_OIDC_SIGN_ALGO,
        username_claim=settings.BERTH_OIDC_USERNAME_CLAIM,
        groups_claim=settings.BERTH_OIDC_GROUPS_CLAIM,
        project_map=project_map_parse(settings.BERTH_OIDC_PROJECT_MAP),
        groups_are_project_slugs=settings.BERTH_OIDC_GROUPS_ARE_PROJECT_SLUGS,
        create_users=settings.BERTH_OIDC_CREATE_USERS,
        link_existing=link,
        timeout_s=settings.BERTH_OIDC_TIMEOUT_S,
        discovery_cache_s=settings.BERTH_OIDC_DISCOVERY_CACHE_S,
        verify_tls=settings.BERTH_OIDC_VERIFY_TLS,
        clock_skew_s=settings.BERTH_OIDC_CLOCK_SKEW_S,
    )


def groups_from_claims(claims: Mapping[str, Any], *, claim: str) -> list[str]:
    """The groups claim as a sorted list of strings.

    An absent claim is no groups (Keycloak and Azure AD leave it out for a user in none); a
    single string is one group; anything else is a misconfigured provider and refused.
    """
    value = claims.get(claim)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return sorted(set(value))
    raise OidcError(f"The provider's {claim!r} claim is not a list of group names.")


def username_from_claims(claims: Mapping[str, Any], *, claim: str) -> str:
    """The Berth username for a first sign-in; a missing or unusable claim is refused."""
    value = claims.get(claim)
    if not isinstance(value, str) or not value.strip():
        raise OidcError(
            f"The provider did not send the {claim!r} claim, which names your Berth account. "
            "Ask the administrators to release it to Berth (a scope or claim mapping at the provider)."
        )
    if not _USERNAME_RE.match(value):
        raise OidcError(
            f"The provider's {claim!r} claim ({value[:60]!r}) is not a usable username "
            "(letters, digits and @.+-_, at most 150)."
        )
    return value


def desired_memberships(
    groups: list[str], *, config: OidcConfig, existing_slugs: set[str]
) -> tuple[dict[str, str], set[str], set[str]]:
    """What the groups grant: ``({slug: role}, managed slugs, role-managed slugs)``.

    *Managed* projects are those whose membership single sign-on decides (the mapped ones, or
    every project when groups are slugs); a managed project not granted is left.  In a
    *role-managed* project (one with a ``:manager`` mapping) the role follows the groups too;
    elsewhere the role an administrator set is kept.
    """
    managed = {grant.slug for grants in config.project_map.values() for grant in grants}
    role_managed = {
        grant.slug for grants in config.project_map.values() for grant in grants if grant.role == MANAGER
    }
    if config.manages_all_projects:
        managed |= existing_slugs
    granted: dict[str, str] = {}
    for group in groups:
        for grant in config.project_map.get(group, ()):
            if grant.role == MANAGER or grant.slug not in granted:
                granted[grant.slug] = grant.role
        if config.groups_are_project_slugs and group in existing_slugs:
            granted.setdefault(group, MEMBER)
    managed &= existing_slugs
    granted = {slug: role for slug, role in granted.items() if slug in existing_slugs}
    return granted, managed, role_managed & existing_slugs
