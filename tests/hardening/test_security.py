"""Production settings, security headers, sign-in rate limit and lockout, token revocation, write throttle."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.security import login_failures_clear
from scheduling.models import AuditEvent
from tests.conftest import token_client
from tests.factories import UserFactory
from tests.hardening.conftest import clear_local_cache

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_cache():
    """Rate-limit and lockout counters live in the cache: every test starts from zero."""
    clear_local_cache()
    yield
    clear_local_cache()


def test_production_settings_pass_check_deploy():
    env = {
        **os.environ,
        "DJANGO_ENV": "production",
        "DJANGO_SECRET_KEY": "x" * 64 + "-a-long-random-production-secret-0123456789",
        "DATABASE_URL": "postgres://berth:berth@127.0.0.1:55433/berth",
        "DJANGO_ALLOWED_HOSTS": "berth.example.org",
    }
    env.pop("DJANGO_DEBUG", None)
    # The browser tests set this for the whole test session (Playwright's loop beside the ORM);
    # a deployment never has it, and check --deploy rightly refuses it.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key():
    env = {**os.environ, "DJANGO_ENV": "production", "DATABASE_URL": "postgres://x:y@127.0.0.1:1/z"}
    env.pop("DJANGO_SECRET_KEY", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/login/", "/api/v1/me/", "/api/docs/"])
def test_security_headers_on_pages_and_api(client, url):
    response = client.get(url)
    directives = {
        name: values
        for name, *values in (part.split() for part in response["Content-Security-Policy"].split(";"))
    }
    assert directives["script-src"] == ["'self'"]  # no inline script, no other origin
    assert directives["default-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert "no-store" in response["Cache-Control"]


@pytest.mark.django_db
def test_static_files_keep_their_caching(client):
    response = client.get("/static/css/berth.css")
    assert response.status_code == 200
    assert "no-store" not in response.get("Cache-Control", "")


@pytest.mark.django_db
def test_pages_have_no_inline_scripts(client, staff):
    """CSP allows scripts from 'self' only: no page may depend on an inline <script>."""
    staff.set_password("pw")
    staff.save()
    client.force_login(staff)
    urls = ["/", "/bookings/new/", "/bookings/", "/jobs/", "/jobs/new/", "/availability/", "/account/tokens/"]
    urls += ["/ops/", "/ops/utilization/", "/ops/fairness/", "/ops/idle/", "/ops/capacity/", "/ops/quotas/"]
    urls += ["/ops/policy/", "/ops/audit/", "/api/docs/", "/admin/"]
    for url in urls:
        body = client.get(url).content.decode()
        for chunk in body.split("<script")[1:]:
            tag = chunk.split(">", 1)[0]
            # json_script data blocks are not executed: CSP does not apply to them.
            assert "src=" in tag or 'type="application/json"' in tag, f"inline script on {url}"


def test_hsts_and_secure_cookies_in_production_settings():
    env = {
        **os.environ,
        "DJANGO_ENV": "production",
        "DJANGO_SECRET_KEY": "s" * 60,
        "DATABASE_URL": "postgres://berth:berth@127.0.0.1:55433/berth",
    }
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_SSL_REDIRECT, s.DEBUG, s.CACHES['default']['BACKEND'].rsplit('.', 1)[-1])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == ["31536000", "True", "True", "True", "False", "RedisCache"]


# ---- sign-in lockout and rate limits ----


@pytest.mark.django_db
def test_lockout_after_repeated_failures_blocks_even_the_right_password(settings):
    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 3
    user = UserFactory(username="alice")
    api = APIClient()
    for _ in range(3):
        bad = api.post("/api/v1/auth/token/", {"username": "alice", "password": "wrong"}, format="json")
        assert bad.status_code == 400
    locked = api.post(
        "/api/v1/auth/token/", {"username": "alice", "password": "pw-not-secret"}, format="json"
    )
    # Told so (not "wrong password"), after the password hash ran (no fast path to time).
    assert locked.status_code == 403
    assert "locked" in locked.json()["message"]
    # The login form shares the counter: the right password is refused there too, and says why.
    form = Client().post("/login/", {"username": "alice", "password": "pw-not-secret"})
    assert form.status_code == 200
    assert "_auth_user_id" not in form.client.session
    assert "sign-in is locked" in form.content.decode()
    event = AuditEvent.objects.get(verb="auth.lockout")
    assert event.entity_id == user.pk
    assert event.after["ip"] == "127.0.0.1"
    # Another address is not locked out; neither is the time-limited lock permanent.
    other = APIClient(REMOTE_ADDR="10.0.0.9")
    ok = other.post("/api/v1/auth/token/", {"username": "alice", "password": "pw-not-secret"}, format="json")
    assert ok.status_code == 200
    login_failures_clear(username="alice", ip="127.0.0.1")  # as the lock's expiry would
    again = api.post("/api/v1/auth/token/", {"username": "alice", "password": "pw-not-secret"}, format="json")
    assert again.status_code == 200


@pytest.mark.django_db
def test_a_locked_out_attempt_still_hashes_the_password(settings, monkeypatch):
    """The refusal costs what a real check costs (the hasher runs), so timing tells nothing."""
    from django.contrib.auth.hashers import get_hasher

    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 1
    UserFactory(username="gail")
    api = APIClient()
    api.post("/api/v1/auth/token/", {"username": "gail", "password": "wrong"}, format="json")
    hasher = type(get_hasher())
    calls = []
    original = hasher.encode
    monkeypatch.setattr(hasher, "encode", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    locked = api.post("/api/v1/auth/token/", {"username": "gail", "password": "pw-not-secret"}, format="json")
    assert locked.status_code == 403
    assert calls  # spying on the hasher only counts its calls; the hash itself is real


@pytest.mark.django_db
def test_successful_form_login_clears_the_failure_count(settings):
    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 3
    UserFactory(username="bob")
    browser = Client()
    for _ in range(2):
        browser.post("/login/", {"username": "bob", "password": "wrong"})
    assert browser.post("/login/", {"username": "bob", "password": "pw-not-secret"}).status_code == 302
    browser.post("/logout/")
    for _ in range(2):
        browser.post("/login/", {"username": "bob", "password": "wrong"})
    assert browser.post("/login/", {"username": "bob", "password": "pw-not-secret"}).status_code == 302


@pytest.mark.django_db
def test_login_form_is_rate_limited_per_address(settings):
    settings.BERTH_LOGIN_RATE = "4/min"
    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 100
    browser = Client()
    codes = [browser.post("/login/", {"username": f"u{i}", "password": "x"}).status_code for i in range(6)]
    assert codes[:4] == [200] * 4
    assert codes[4:] == [429, 429]
    assert (
        Client(REMOTE_ADDR="10.1.1.1").post("/login/", {"username": "z", "password": "x"}).status_code == 200
    )


@pytest.mark.django_db
def test_api_writes_are_throttled_per_user_and_reads_are_not(member, nodes, soon):
    from rest_framework.settings import api_settings

    from portal.security import WriteRateThrottle

    rates = {**api_settings.DEFAULT_THROTTLE_RATES, "api-write": "2/min"}
    original = WriteRateThrottle.THROTTLE_RATES
    WriteRateThrottle.THROTTLE_RATES = rates
    try:
        api = token_client(member)
        codes = [api.post("/api/v1/jobs/", {"name": "x"}, format="json").status_code for _ in range(3)]
        assert codes == [400, 400, 429]
        refused = api.post("/api/v1/jobs/", {"name": "x"}, format="json")
        assert 0 < int(refused["Retry-After"]) <= 60
        assert refused.json()["message"]
        assert api.get("/api/v1/bookings/").status_code == 200
        assert token_client(UserFactory()).post("/api/v1/jobs/", {}, format="json").status_code == 400
    finally:
        WriteRateThrottle.THROTTLE_RATES = original


# ---- token revocation ----


@pytest.mark.django_db
def test_revoked_token_stops_working_at_once(member):
    api = token_client(member)
    assert api.get("/api/v1/me/").status_code == 200
    assert api.delete("/api/v1/me/token/").status_code == 204
    assert api.get("/api/v1/me/").status_code == 401
    assert not Token.objects.filter(user=member).exists()
    event = AuditEvent.objects.get(verb="auth.token_revoke")
    assert event.actor_id == member.pk
    # Signing in again issues a different token.
    fresh = APIClient().post(
        "/api/v1/auth/token/", {"username": member.username, "password": "pw-not-secret"}, format="json"
    )
    assert fresh.status_code == 200
    assert fresh.json()["token"] != api._credentials["HTTP_AUTHORIZATION"].split()[1]


@pytest.mark.django_db
def test_token_revoke_needs_authentication():
    assert APIClient().delete("/api/v1/me/token/").status_code == 401


@pytest.mark.django_db
def test_lockout_and_throttle_counters_work_on_redis(settings):
    """Production keeps the counters in Redis (shared by all web processes): the same rules hold."""
    # A Redis db of its own and a unique key prefix; never cache.clear() here: on Redis that is
    # FLUSHDB, which would wipe whatever else shares the db.  The keys expire by themselves.
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0").rsplit("/", 1)[0]
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"{base}/15",
            "KEY_PREFIX": f"berth-test-{os.getpid()}-{time.time_ns()}",
        }
    }
    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 2
    UserFactory(username="carol")
    api = APIClient()
    for _ in range(2):
        api.post("/api/v1/auth/token/", {"username": "carol", "password": "wrong"}, format="json")
    ok = {"username": "carol", "password": "pw-not-secret"}
    assert api.post("/api/v1/auth/token/", ok, format="json").status_code == 403  # locked out, and told so
    assert AuditEvent.objects.filter(verb="auth.lockout").count() == 1
    assert APIClient(REMOTE_ADDR="10.0.0.2").post("/api/v1/auth/token/", ok, format="json").status_code == 200


@pytest.mark.parametrize("key", ["change-me", "change-me-" + "x" * 40, "short-secret"])
def test_production_refuses_a_placeholder_secret_key(key):
    env = {
        **os.environ,
        "DJANGO_ENV": "production",
        "DATABASE_URL": "postgres://x:y@127.0.0.1:1/z",
        "DJANGO_SECRET_KEY": key,
    }
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'portal.settings'); "
            "django.setup()",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is a placeholder" in result.stderr
