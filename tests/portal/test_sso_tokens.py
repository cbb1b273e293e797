"""Single sign-on against the real loopback provider, continued: logout, and ID tokens from another
issuer or client.  Split from test_sso.py (house rule: files under 600 lines); the provider and
the sign-in helper are that module's."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, tzinfo
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from django.contrib.auth.models import User

from portal.accounts.models import Membership, OidcIdentity
from tests.factories import UserFactory
from tests.oidc_provider.fixtures import (
    OTHER_CLIENT_ID,
    OTHER_CLIENT_SECRET,
    OTHER_REDIRECT_URI,
    Provider,
    ProviderBrowser,
)
from tests.portal import test_sso as base

# Shared fixtures and helpers (assigned, not imported, so that test arguments do not shadow an import).
sso = base.sso
projects = base.projects
sign_in = base.sign_in
roles = base.roles
ROOT = base.ROOT


# ---- logout ----


@pytest.mark.django_db
def test_logout_ends_the_provider_session(client, sso, projects):
    browser = ProviderBrowser()
    sign_in(client, "alice", browser=browser)
    assert browser.has_provider_session(sso)
    page = client.post("/logout/")
    assert page.status_code == 200
    assert "_auth_user_id" not in client.session
    text = page.content.decode()
    assert "You are signed out of Berth" in text
    target = page.context["provider_logout"]
    assert target.startswith(f"{sso.issuer}/logout/?id_token_hint=")
    assert "post_logout_redirect_uri=http%3A%2F%2Ftestserver%2Flogin%2F" in target
    assert f'content="0;url={target.replace("&", "&amp;")}"' in text
    ended = browser.http.get(target, allow_redirects=False, timeout=10)
    assert ended.status_code == 302
    assert ended.headers["Location"] == "http://testserver/login/"
    assert not browser.has_provider_session(sso)


@pytest.mark.django_db
def test_password_logout_stays_local(client, sso):
    UserFactory(username="local")
    client.post("/login/", {"username": "local", "password": "pw-not-secret"})
    page = client.post("/logout/")
    assert page.status_code == 302
    assert page["Location"] == "/login/"


@pytest.mark.django_db
def test_id_token_from_another_issuer_is_refused(client, settings, sso):
    # Endpoints given one by one (no discovery), and an issuer the provider's tokens do not name.
    settings.BERTH_OIDC_ISSUER = "http://127.0.0.1:9/another-realm"
    settings.BERTH_OIDC_AUTHORIZATION_ENDPOINT = f"{sso.issuer}/authorize/"
    settings.BERTH_OIDC_TOKEN_ENDPOINT = f"{sso.issuer}/token/"
    settings.BERTH_OIDC_USERINFO_ENDPOINT = f"{sso.issuer}/userinfo/"
    settings.BERTH_OIDC_JWKS_URI = f"{sso.issuer}/.well-known/jwks.json"
    page = sign_in(client, "alice")
    assert page.status_code == 400
    assert "could not be verified" in page.content.decode()
    assert "_auth_user_id" not in client.session
    assert not User.objects.filter(username="alice").exists()
    assert not OidcIdentity.objects.exists()
    settings.BERTH_OIDC_ISSUER = sso.issuer  # the same endpoints with the right issuer sign in
    assert sign_in(client, "alice").status_code == 302


def _token_for_another_client(sso: Provider, *, username: str, nonce: str) -> dict[str, Any]:
    """The provider's real token answer to *another* application registered there (code flow with
    PKCE, the person at the real login and consent pages): its ID token is signed with the
    provider's key, names the provider as issuer and carries ``nonce``, but its ``aud`` is that
    application's client id."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = urlencode(
        {
            "response_type": "code",
            "client_id": OTHER_CLIENT_ID,
            "redirect_uri": OTHER_REDIRECT_URI,
            "scope": "openid email profile groups",
            "state": "other-app-state",
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
    )
    back = ProviderBrowser().authorize(f"{sso.issuer}/authorize/?{query}", username=username)
    assert back.startswith(OTHER_REDIRECT_URI), back
    answer = requests.post(
        f"{sso.issuer}/token/",
        data={
            "grant_type": "authorization_code",
            "code": parse_qs(urlsplit(back).query)["code"][0],
            "redirect_uri": OTHER_REDIRECT_URI,
            "code_verifier": verifier,
        },
        auth=(OTHER_CLIENT_ID, OTHER_CLIENT_SECRET),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text[:300]
    tokens: dict[str, Any] = answer.json()
    return tokens


def _claims(id_token: str) -> dict[str, Any]:
    """The (unverified) payload of a JWT, to show what the provider put in it."""
    part = id_token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


@contextmanager
def _token_endpoint(answer: dict[str, Any]) -> Iterator[tuple[str, list[bytes]]]:
    """A token endpoint on loopback that answers every code exchange with ``answer`` (a token
    substitution: the tokens Berth receives were issued to someone else)."""
    seen: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/o/token/", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.django_db
def test_id_token_issued_for_another_client_is_refused(client, settings, sso, projects):
    """An ID token the real provider signed, for this person, with Berth's nonce, but for another
    application (``aud`` without Berth's client id) is refused: a clear failure page, nobody signed
    in, no account or identity created.  The same kind of token passes once Berth's client id is the
    one it names, so the audience is what refused it."""
    start = client.get("/oidc/login/")
    query = parse_qs(urlsplit(start["Location"]).query)
    foreign = _token_for_another_client(sso, username="alice", nonce=query["nonce"][0])
    claims = _claims(foreign["id_token"])
    assert (claims["aud"], claims["iss"], claims["nonce"]) == (OTHER_CLIENT_ID, sso.issuer, query["nonce"][0])
    with _token_endpoint(foreign) as (url, seen):
        settings.BERTH_OIDC_TOKEN_ENDPOINT = url
        page = client.get(f"/oidc/callback/?code=any-code&state={query['state'][0]}")
    assert len(seen) == 1  # Berth did exchange its code there and got the foreign tokens
    assert page.status_code == 400
    text = page.content.decode()
    assert "could not be verified" in text
    assert "Start again" in text
    _assert_no_sign_in(client, "alice")
    assert not Membership.objects.exists()
    assert "Signed in as" not in client.get("/", follow=True).content.decode()

    # Control: a Berth registered as that application accepts the same kind of token.
    settings.BERTH_OIDC_CLIENT_ID = OTHER_CLIENT_ID
    start = client.get("/oidc/login/")
    query = parse_qs(urlsplit(start["Location"]).query)
    foreign = _token_for_another_client(sso, username="alice", nonce=query["nonce"][0])
    with _token_endpoint(foreign) as (url, _):
        settings.BERTH_OIDC_TOKEN_ENDPOINT = url
        page = client.get(f"/oidc/callback/?code=any-code&state={query['state'][0]}")
    assert page.status_code == 302
    assert int(client.session["_auth_user_id"]) == User.objects.get(username="alice").pk


@pytest.mark.django_db
def test_id_token_with_several_audiences_needs_berth_among_them(client, settings, sso):
    """``aud`` as a list: refused when Berth's client id is not in it (the token is signed with the
    provider's own key, read from the key file the test provider uses, with Berth's nonce)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding

    key = serialization.load_pem_private_key((sso.spec_path.parent / "key.pem").read_bytes(), password=None)
    jwks = requests.get(f"{sso.issuer}/.well-known/jwks.json", timeout=10).json()
    kid = jwks["keys"][0]["kid"]

    def _b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def _rs256(header: dict[str, Any], claims: dict[str, Any]) -> str:
        """A compact JWS signed RS256 (RSASSA-PKCS1-v1_5 with SHA-256) with the provider's key."""
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signed = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signed)}"

    def attempt(audience: list[str]):
        start = client.get("/oidc/login/")
        query = parse_qs(urlsplit(start["Location"]).query)
        now = int(time.time())
        id_token = _rs256(
            {"alg": "RS256", "typ": "JWT", "kid": kid},
            {
                "iss": sso.issuer, "sub": "77", "aud": audience, "iat": now, "exp": now + 300,
                "nonce": query["nonce"][0], "preferred_username": "grace", "email": "grace@uni.example",
            },
        )  # fmt: skip
        with _token_endpoint({"id_token": id_token, "access_token": "", "token_type": "Bearer"}) as (url, _):
            settings.BERTH_OIDC_TOKEN_ENDPOINT = url
            settings.BERTH_OIDC_USERINFO_ENDPOINT = ""
            return client.get(f"/oidc/callback/?code=any-code&state={query['state'][0]}")

    page = attempt(["other-app", "third-app"])
    assert page.status_code == 400
    assert "could not be verified" in page.content.decode()
    assert not User.objects.filter(username="grace").exists()
    assert "_auth_user_id" not in client.session
    page = attempt(["other-app", "berth-portal"])
    assert page.status_code == 302
    assert User.objects.filter(username="grace").exists()


# ---- the provider's clock against Berth's ----


def _berth_clock_moved(monkeypatch: pytest.MonkeyPatch, offset: timedelta) -> None:
    """Berth's clock, as PyJWT reads it to check ``iat``/``nbf``/``exp``, moved by ``offset``
    against the provider's (another process on the real clock)."""
    import jwt.api_jwt

    real = jwt.api_jwt.datetime

    class Moved(real):  # type: ignore[misc,valid-type]
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return real.now(tz) + offset

    monkeypatch.setattr(jwt.api_jwt, "datetime", Moved)


@pytest.mark.django_db
def test_a_provider_clock_a_little_ahead_still_signs_in(client, settings, sso, projects, monkeypatch):
    """The provider's clock 20 s ahead of Berth's: its ID token is "issued" 20 s in Berth's
    future.  Within BERTH_OIDC_CLOCK_SKEW_S that signs in (it was a 500, ImmatureSignatureError,
    with any provider clock a second ahead); with no leeway it is a page that names the clocks."""
    _berth_clock_moved(monkeypatch, -timedelta(seconds=20))
    page = sign_in(client, "alice")
    assert page.status_code == 302
    assert int(client.session["_auth_user_id"]) == User.objects.get(username="alice").pk

    client.logout()
    settings.BERTH_OIDC_CLOCK_SKEW_S = 0
    page = sign_in(client, "bob")
    assert page.status_code == 400
    assert "server clock is wrong" in page.content.decode()
    assert "_auth_user_id" not in client.session
    assert not User.objects.filter(username="bob").exists()


@pytest.mark.django_db
def test_an_expired_id_token_is_a_page_not_a_500(client, sso, projects, monkeypatch):
    """Berth's clock two days ahead of the provider's: the ID token has expired by Berth's clock."""
    _berth_clock_moved(monkeypatch, timedelta(days=2))
    page = sign_in(client, "alice")
    assert page.status_code == 400
    text = page.content.decode()
    assert "server clock is wrong" in text
    assert "Start again" in text
    _assert_no_sign_in(client, "alice")


def _assert_no_sign_in(client, username: str) -> None:
    """The refused sign-in left no session, no account and no linked identity."""
    assert "_auth_user_id" not in client.session
    assert not User.objects.filter(username=username).exists()
    assert not OidcIdentity.objects.exists()
