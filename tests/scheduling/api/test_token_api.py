"""Getting an API token with a username and password."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework import throttling
from rest_framework.test import APIClient

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/auth/token/"


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    cache.clear()
    yield
    cache.clear()


def test_password_for_token_then_token_works():
    UserFactory(username="ada", password="correct horse")
    client = APIClient(enforce_csrf_checks=True)
    response = client.post(URL, {"username": "ada", "password": "correct horse"}, format="json")
    assert response.status_code == 200
    token = response.json()["token"]
    # The same token on every exchange.
    assert (
        client.post(URL, {"username": "ada", "password": "correct horse"}, format="json").json()["token"]
        == token
    )
    scripted = APIClient()
    scripted.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert scripted.get("/api/v1/me/").json()["username"] == "ada"


@pytest.mark.parametrize(
    "body", [{"username": "ada", "password": "wrong"}, {"username": "nobody", "password": "x"}, {}]
)
def test_bad_credentials_are_400(body):
    UserFactory(username="ada", password="correct horse")
    response = APIClient().post(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]


def test_attempts_are_throttled(monkeypatch):
    # The configured rate is 20/min; a smaller one keeps the test short.
    monkeypatch.setattr(throttling.ScopedRateThrottle, "THROTTLE_RATES", {"auth-token": "3/min"})
    client = APIClient()
    codes = [
        client.post(URL, {"username": "x", "password": "y"}, format="json").status_code for _ in range(5)
    ]
    assert codes == [400, 400, 400, 429, 429]
