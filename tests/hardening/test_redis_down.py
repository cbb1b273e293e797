"""Redis unreachable: API writes, the token exchange and the login form keep working, and the
lockout and write throttle keep counting (in PostgreSQL, ``portal.security``).

"Redis down" here is a real refused connection: the cache points at a loopback port nothing
listens on (the fault suite, tests/faults/, stops and restarts a real Redis server).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.core.cache import caches
from django.test import Client
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from portal.accounts.models import RateCounter
from portal.security import is_locked_out
from scheduling.models import Booking, Job
from tests.conftest import token_client
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def redis_down(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{_closed_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    yield
    caches["default"].close()


def _fallbacks() -> float:
    return sum(
        REGISTRY.get_sample_value("berth_cache_fallback_total", {"operation": op}) or 0.0
        for op in ("hit", "read", "clear")
    )


def test_writes_work_and_count_in_postgres(redis_down, member, project, nodes, soon):
    api = token_client(member)
    before = _fallbacks()
    body = {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": 1,
        "start_at": soon.isoformat(),
        "end_at": (soon + timedelta(hours=1)).isoformat(),
    }
    booked = api.post("/api/v1/bookings/", body, format="json")
    assert booked.status_code == 201, booked.content
    job = api.post(
        "/api/v1/jobs/",
        {
            "name": "j",
            "project": project.slug,
            "gpu_count": 1,
            "gpu_type": "A100",
            "requested_s": 600,
            "payload": {"command": "python train.py"},
        },
        format="json",
    )
    assert job.status_code == 201, job.content
    cancelled = api.post(f"/api/v1/jobs/{job.json()['id']}/cancel/")
    assert cancelled.status_code == 200, cancelled.content
    assert Booking.objects.count() == 1
    assert Job.objects.get().status == Job.Status.CANCELLED
    # The throttle counted every write, in the database, and the metric says so.
    counters = list(RateCounter.objects.filter(key__contains="api-write"))
    assert [c.count for c in counters] == [3]
    assert _fallbacks() >= before + 3


def test_throttle_still_refuses_above_its_rate(redis_down, settings, member, project, nodes):
    from portal.security import WriteRateThrottle

    original_rates = WriteRateThrottle.THROTTLE_RATES
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "api-write": "2/min"},
    }
    from rest_framework.settings import api_settings

    WriteRateThrottle.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES
    try:
        api = token_client(member)
        body = {
            "name": "j",
            "project": project.slug,
            "gpu_count": 1,
            "gpu_type": "A100",
            "requested_s": 600,
            "payload": {"command": "python train.py"},
        }
        codes = [api.post("/api/v1/jobs/", body, format="json").status_code for _ in range(3)]
    finally:
        WriteRateThrottle.THROTTLE_RATES = original_rates
    assert codes == [201, 201, 429]


def test_token_exchange_and_login_form_work(redis_down):
    UserFactory(username="dora")
    ok = {"username": "dora", "password": "pw-not-secret"}
    response = APIClient().post("/api/v1/auth/token/", ok, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["token"]
    form = Client().post("/login/", ok)
    assert form.status_code == 302


def test_lockout_counts_in_postgres_and_clears_on_success(redis_down, settings):
    settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS = 3
    UserFactory(username="erin")
    browser = Client()
    for _ in range(2):
        assert browser.post("/login/", {"username": "erin", "password": "wrong"}).status_code == 200
    assert not is_locked_out("erin", "127.0.0.1")
    # A success clears the count (in the database too).
    assert browser.post("/login/", {"username": "erin", "password": "pw-not-secret"}).status_code == 302
    for _ in range(3):
        Client().post("/login/", {"username": "erin", "password": "wrong"})
    assert is_locked_out("erin", "127.0.0.1")
    refused = APIClient().post(
        "/api/v1/auth/token/", {"username": "erin", "password": "pw-not-secret"}, format="json"
    )
    assert refused.status_code == 403
    assert not is_locked_out("erin", "10.9.9.9")


def _dashboard(user) -> str:
    from scheduling.selectors_ui import engine_status_cache_clear

    engine_status_cache_clear()
    browser = Client()
    browser.force_login(user)
    response = browser.get("/")
    assert response.status_code == 200
    return response.content.decode()


def test_dashboard_says_the_engine_is_paused_while_the_broker_is_down(settings, member, cluster):
    from django.utils import timezone

    from scheduling.models import EngineRound

    EngineRound.objects.create(cluster=cluster, started_at=timezone.now(), duration_ms=5.0)
    assert 'id="engine-paused"' not in _dashboard(member)
    settings.BERTH_ENGINE_REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    page = _dashboard(member)
    assert 'id="engine-paused"' in page
    assert "broker is unreachable" in page


def test_dashboard_says_the_engine_is_paused_when_rounds_stop(member, cluster):
    from django.utils import timezone

    from scheduling.models import EngineRound

    EngineRound.objects.create(cluster=cluster, started_at=timezone.now() - timedelta(minutes=10))
    page = _dashboard(member)
    assert 'id="engine-paused"' in page
    assert "no round since" in page
