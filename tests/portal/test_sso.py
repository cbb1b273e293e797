"""Single sign-on against a real OpenID Connect provider (django-oauth-toolkit) on loopback.

The provider runs in its own process (``tests/oidc_provider``); these tests play the person at
its real login and consent pages over HTTP (``ProviderBrowser``) and Berth through Django's
test client, so every step of the protocol is real: discovery, state, nonce, PKCE, the code
exchange, the RS256 signature against the provider's JWKS, userinfo, RP-initiated logout.
The Chromium test of the same flow is ``tests/e2e/test_sso_browser.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from html import unescape
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.accounts.models import Membership, OidcIdentity, Project
from portal.accounts.oidc import metadata_forget
from portal.accounts.sso import MANAGER, MEMBER, OidcConfig, desired_memberships, project_map_parse
from scheduling.models import AuditEvent
from tests.factories import MembershipFactory, ProjectFactory, UserFactory
from tests.oidc_provider.fixtures import (
    Provider,
    ProviderBrowser,
    free_port,
    local_path,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sso(settings, oidc_provider: Provider) -> Provider:
    for name, value in oidc_provider.berth_settings().items():
        setattr(settings, name, value)
    metadata_forget()
    yield oidc_provider
    metadata_forget()


@pytest.fixture
def projects() -> dict[str, Project]:
    return {slug: ProjectFactory(name=slug.title(), slug=slug) for slug in ("vision", "nlp", "astro")}


def sign_in(client: Client, username: str, *, browser: ProviderBrowser | None = None, next_url: str = "/"):
    """The whole flow: Berth's SSO link, the provider's pages, Berth's callback (its response)."""
    start = client.get(f"/oidc/login/?next={next_url}")
    assert start.status_code == 302, start.content[:300]
    back = (browser or ProviderBrowser()).authorize(start["Location"], username=username)
    return client.get(local_path(back))


def roles(user: User) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("project__slug", "role"))


# ---- configuration ----


def test_project_map_parse_and_refusals():
    assert project_map_parse("a=vision; /lab/b=nlp:manager;\n a=astro") == {
        "a": (project_map_parse("x=vision")["x"][0], project_map_parse("x=astro")["x"][0]),
        "/lab/b": (project_map_parse("x=nlp:manager")["x"][0],),
    }
    assert project_map_parse("x=nlp:manager")["x"][0].role == MANAGER
    for bad in ("novalue", "=vision", "g=", "g=vision:owner"):
        with pytest.raises(Exception, match="BERTH_OIDC_PROJECT_MAP"):
            project_map_parse(bad)


def _config(**kwargs) -> OidcConfig:
    base = {
        "client_id": "c",
        "client_secret": "s",
        "provider_name": "P",
        "issuer": "",
        "endpoints": {},
        "scopes": "openid",
        "sign_algo": "RS256",
        "username_claim": "preferred_username",
        "groups_claim": "groups",
        "project_map": {},
        "groups_are_project_slugs": False,
        "create_users": True,
        "link_existing": "none",
        "timeout_s": 1.0,
        "discovery_cache_s": 60,
        "verify_tls": True,
    }
    return OidcConfig(**{**base, **kwargs})


def test_desired_memberships_managed_and_role_managed_projects():
    config = _config(project_map=project_map_parse("lab=vision;leads=vision:manager;nlp-all=nlp;gone=ghost"))
    existing = {"vision", "nlp", "astro"}
    granted, managed, role_managed = desired_memberships(["lab"], config=config, existing_slugs=existing)
    assert granted == {"vision": MEMBER}
    assert managed == {"vision", "nlp"}  # the unknown slug "ghost" is ignored; astro is not managed
    assert role_managed == {"vision"}
    granted, _, _ = desired_memberships(["leads", "lab", "nlp-all"], config=config, existing_slugs=existing)
    assert granted == {"vision": MANAGER, "nlp": MEMBER}
    slugs = _config(groups_are_project_slugs=True)
    granted, managed, _ = desired_memberships(["astro", "other"], config=slugs, existing_slugs=existing)
    assert granted == {"astro": MEMBER}
    assert managed == existing


@pytest.mark.django_db
def test_sso_is_off_unless_configured(client):
    page = client.get("/login/")
    assert page.status_code == 200
    assert b"Sign in with" not in page.content
    assert client.get("/oidc/login/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


@pytest.mark.parametrize(
    ("secret", "needle"),
    [
        ("change-me", "BERTH_OIDC_CLIENT_SECRET is a placeholder"),
        ("short", "BERTH_OIDC_CLIENT_SECRET is a placeholder"),
        ("a-real-secret-of-enough-length", "over https"),
    ],
)
def test_production_refuses_placeholder_client_secret_and_plain_http(secret, needle):
    env = {
        **os.environ,
        "DJANGO_ENV": "production",
        "DATABASE_URL": "postgres://x:y@127.0.0.1:1/z",
        "DJANGO_SECRET_KEY": "k" * 50,
        "BERTH_OIDC_CLIENT_ID": "berth",
        "BERTH_OIDC_CLIENT_SECRET": secret,
        "BERTH_OIDC_ISSUER": "http://idp.example/realms/lab",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
            "'portal.settings'); django.setup()",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert needle in result.stderr


# ---- signing in ----


@pytest.mark.django_db
def test_login_page_offers_the_provider_beside_the_local_form(client, sso):
    page = client.get("/login/?next=/bookings/")
    text = page.content.decode()
    assert "Sign in with Example University" in text
    assert 'href="/oidc/login/?next=/bookings/"' in text
    assert 'name="password"' in text  # the local form is still there


@pytest.mark.django_db
def test_first_sign_in_creates_the_user_maps_groups_and_lands_where_asked(client, sso, projects):
    start = client.get("/oidc/login/?next=/bookings/")
    query = parse_qs(urlsplit(start["Location"]).query)
    assert start["Location"].startswith(f"{sso.issuer}/authorize/")
    assert query["code_challenge_method"] == ["S256"]
    assert query["scope"] == ["openid email profile groups"]
    assert "nonce" in query
    back = ProviderBrowser().authorize(start["Location"], username="alice")
    done = client.get(local_path(back))
    assert done.status_code == 302
    assert done["Location"] == "/bookings/"
    alice = User.objects.get(username="alice")
    assert int(client.session["_auth_user_id"]) == alice.pk
    assert client.session["_auth_user_backend"] == "portal.accounts.oidc.OidcBackend"
    assert (alice.email, alice.first_name, alice.has_usable_password()) == (
        "alice@uni.example",
        "Alice",
        False,
    )
    assert roles(alice) == {"vision": MEMBER}
    identity = OidcIdentity.objects.get(user=alice)
    assert identity.issuer == sso.issuer
    assert identity.groups == ["lab-vision"]
    assert identity.subject != "alice"  # the provider's subject (its user id), not the username
    assert AuditEvent.objects.filter(verb="auth.sso_login", actor=alice).count() == 1
    assert AuditEvent.objects.filter(verb="membership.sso_added", actor=alice).count() == 1
    dashboard = client.get("/").content.decode()
    assert "Signed in as <strong>alice</strong>" in dashboard
    assert "Your projects: <strong>Vision</strong>" in dashboard


@pytest.mark.django_db
def test_next_pointing_elsewhere_is_ignored(client, sso, projects):
    assert sign_in(client, "alice", next_url="https://evil.example/")["Location"] == "/"


@pytest.mark.django_db
def test_memberships_follow_the_groups_at_every_sign_in(client, sso, settings, projects):
    settings.BERTH_OIDC_PROJECT_MAP = "lab-vision=vision;lab-nlp=nlp;lab-vision-leads=vision:manager"
    sign_in(client, "bob")
    bob = User.objects.get(username="bob")
    assert roles(bob) == {"vision": MEMBER, "nlp": MEMBER}
    # An administrator adds bob to an unmanaged project and makes him manager of nlp (no
    # ":manager" mapping there: the role is the administrator's to give).
    MembershipFactory(user=bob, project=projects["astro"], role=Membership.Role.MEMBER)
    Membership.objects.filter(user=bob, project__slug="nlp").update(role=MANAGER)
    try:
        sso.set_groups("bob", ["lab-vision", "lab-vision-leads", "lab-nlp"])
        client.logout()
        sign_in(client, "bob")
        assert roles(bob) == {"vision": MANAGER, "nlp": MANAGER, "astro": MEMBER}
        # Leaving the leads group demotes (vision's role follows the groups); leaving lab-nlp
        # removes the membership, manager or not; astro is not single sign-on's to manage.
        sso.set_groups("bob", ["lab-vision"])
        client.logout()
        sign_in(client, "bob")
        assert roles(bob) == {"vision": MEMBER, "astro": MEMBER}
    finally:
        sso.set_groups("bob", ["lab-vision", "lab-nlp"])
    verbs = list(
        AuditEvent.objects.filter(actor=bob, verb__startswith="membership.sso").values_list("verb", flat=True)
    )
    assert sorted(verbs) == sorted(
        [
            "membership.sso_added",
            "membership.sso_added",
            "membership.sso_role",
            "membership.sso_role",
            "membership.sso_removed",
        ]
    )
    assert User.objects.filter(username="bob").count() == 1  # found again by subject, not re-created


@pytest.mark.django_db
def test_groups_named_like_project_slugs(client, sso, settings, projects):
    settings.BERTH_OIDC_PROJECT_MAP = ""
    settings.BERTH_OIDC_GROUPS_ARE_PROJECT_SLUGS = True
    sign_in(client, "erin")
    assert roles(User.objects.get(username="erin")) == {"vision": MEMBER}


@pytest.mark.django_db
def test_existing_local_account_is_linked_only_when_allowed(client, sso, settings):
    local = UserFactory(username="carol", email="carol@uni.example")
    refused = sign_in(client, "carol")
    assert refused.status_code == 403
    assert "already exists and is not linked" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    settings.BERTH_OIDC_LINK_EXISTING = "email"
    assert sign_in(client, "carol").status_code == 302
    assert int(client.session["_auth_user_id"]) == local.pk
    assert OidcIdentity.objects.get(user=local).issuer == sso.issuer


@pytest.mark.django_db
def test_staff_accounts_are_never_linked_by_name(client, sso, settings):
    UserFactory(username="frank", is_staff=True)
    settings.BERTH_OIDC_LINK_EXISTING = "username"
    page = sign_in(client, "frank")
    assert page.status_code == 403
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_no_account_is_created_when_creation_is_off(client, sso, settings):
    settings.BERTH_OIDC_CREATE_USERS = False
    page = sign_in(client, "carol")
    assert page.status_code == 403
    assert "does not create accounts" in page.content.decode()
    assert not User.objects.filter(username="carol").exists()


@pytest.mark.django_db
def test_a_disabled_account_cannot_sign_in(client, sso, projects):
    sign_in(client, "alice")
    User.objects.filter(username="alice").update(is_active=False)
    client.logout()
    page = sign_in(client, "alice")
    assert page.status_code == 403
    assert "disabled" in page.content.decode()


# ---- local accounts beside single sign-on ----


@pytest.mark.django_db
def test_local_accounts_and_their_lockout_still_work(client, sso, settings):
    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 2
    UserFactory(username="local")
    ok = client.post("/login/", {"username": "local", "password": "pw-not-secret"})
    assert ok.status_code == 302
    assert client.session["_auth_user_backend"] == "portal.security.LockoutBackend"
    other = Client()
    for _ in range(2):
        assert other.post("/login/", {"username": "local", "password": "wrong"}).status_code == 200
    locked = other.post("/login/", {"username": "local", "password": "pw-not-secret"})
    assert "Too many failed sign-ins" in locked.content.decode()
    assert "_auth_user_id" not in other.session
    # A forged OIDC-looking query on the password form is still just a password sign-in.
    forged = Client().post("/login/?code=x&state=y", {"username": "local", "password": "wrong"})
    assert forged.status_code == 200


# ---- failure paths: a clear page, never a 500 ----


@pytest.mark.django_db
def test_denied_consent(client, sso):
    start = client.get("/oidc/login/")
    back = ProviderBrowser().authorize(start["Location"], username="alice", allow=False)
    assert "error=access_denied" in back
    page = client.get(local_path(back))
    assert page.status_code == 403
    assert "did not let you sign in to Berth (access_denied)" in page.content.decode()
    assert "_auth_user_id" not in client.session
    assert not User.objects.filter(username="alice").exists()


@pytest.mark.django_db
def test_bad_state_and_replayed_callback(client, sso, projects):
    start = client.get("/oidc/login/")
    back = ProviderBrowser().authorize(start["Location"], username="alice")
    code = parse_qs(urlsplit(back).query)["code"][0]
    forged = client.get(f"/oidc/callback/?code={code}&state=not-the-state")
    assert forged.status_code == 400
    assert "expired or was already used" in forged.content.decode()
    assert client.get(local_path(back)).status_code == 302  # the real answer still works once
    client.logout()
    replay = client.get(local_path(back))
    assert replay.status_code == 400
    assert "_auth_user_id" not in client.session
    # No session at all (another browser), and no parameters.
    assert Client().get(local_path(back)).status_code == 400
    assert client.get("/oidc/callback/").status_code == 400


@pytest.mark.django_db
def test_a_code_the_provider_refuses(client, sso):
    start = client.get("/oidc/login/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    page = client.get(f"/oidc/callback/?code=made-up-code&state={state}")
    assert page.status_code == 400
    assert "refused to complete this sign-in" in page.content.decode()


@pytest.mark.django_db
def test_missing_username_claim(client, sso):
    page = sign_in(client, "dave")
    assert page.status_code == 400
    assert "did not send the 'preferred_username' claim" in unescape(page.content.decode())
    assert not OidcIdentity.objects.exists()


@pytest.mark.django_db
def test_groups_claim_of_the_wrong_shape(client, sso, settings):
    settings.BERTH_OIDC_GROUPS_CLAIM = "email_verified"  # a boolean at this provider
    page = sign_in(client, "alice")
    assert page.status_code == 400
    assert "is not a list of group names" in page.content.decode()


@pytest.mark.django_db
def test_provider_down_at_the_start(client, settings, sso):
    settings.BERTH_OIDC_ISSUER = f"http://127.0.0.1:{free_port()}/o"
    page = client.get("/oidc/login/")
    assert page.status_code == 503
    assert page["Retry-After"] == "60"
    assert "Example University did not answer" in page.content.decode()


@pytest.mark.django_db
def test_provider_down_at_the_code_exchange(client, settings, sso):
    start = client.get("/oidc/login/")
    back = ProviderBrowser().authorize(start["Location"], username="alice")
    settings.BERTH_OIDC_TOKEN_ENDPOINT = f"http://127.0.0.1:{free_port()}/o/token/"
    page = client.get(local_path(back))
    assert page.status_code == 503
    assert "did not answer while signing you in" in page.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_wrong_client_secret(client, settings, sso):
    start = client.get("/oidc/login/")
    back = ProviderBrowser().authorize(start["Location"], username="alice")
    settings.BERTH_OIDC_CLIENT_SECRET = "not-the-secret"
    page = client.get(local_path(back))
    assert page.status_code == 400
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_discovery_naming_another_issuer(client, settings, sso):
    settings.BERTH_OIDC_ISSUER = sso.issuer.replace("127.0.0.1", "localhost")
    page = client.get("/oidc/login/")
    assert page.status_code == 400
    assert "names another issuer" in page.content.decode()
