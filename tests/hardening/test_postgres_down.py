"""PostgreSQL unreachable: the API answers 503 JSON with Retry-After, pages a plain maintenance
page, in production settings and under DEBUG alike, and no setting or traceback is shown.

A real gunicorn serves the portal with ``DATABASE_URL`` on a loopback port nothing listens on
(connection refused, as when the server is stopped); the fault suite (tests/faults/) stops and
restarts a real PostgreSQL under a running web tier.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports, all bound at once while they are picked: two
    calls one after the other can be given the same port (the first socket is closed by then),
    and a ``DATABASE_URL`` on gunicorn's own port makes its single worker wait on itself."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _request(
    url: str, *, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
):
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})  # noqa: S310 (loopback http)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:  # noqa: S310
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@pytest.fixture(params=["production", "debug"])
def server(request):
    port, db_port = _free_ports(2)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": f"postgres://berth:berth@127.0.0.1:{db_port}/berth",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "ERROR",
        "REDIS_URL": "redis://user:redis-secret-do-not-show@127.0.0.1:1/0",
    }
    if request.param == "production":
        env.update(
            DJANGO_ENV="production",
            DJANGO_DEBUG="0",
            DJANGO_SECURE_SSL_REDIRECT="0",
            DJANGO_SECRET_KEY="test-only-" + "k" * 50,
        )
    else:
        env.update(DJANGO_ENV="development", DJANGO_DEBUG="1")
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    proc = subprocess.Popen(
        [
            str(GUNICORN),
            "portal.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--timeout",
            "30",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=20)


def _assert_no_secret(text: str) -> None:
    for leak in ("redis-secret-do-not-show", "Traceback", "REDIS_URL", "OperationalError", "SECRET_KEY"):
        assert leak not in text


def test_api_is_503_json_with_retry_after(server):
    for method, path, body, headers in [
        ("GET", "/api/v1/me/", None, {"Authorization": "Token 0123456789abcdef0123456789abcdef01234567"}),
        ("GET", "/api/v1/bookings/", None, {"Cookie": "sessionid=abcdefghijklmnopqrstuvwxyz012345"}),
        (
            "POST",
            "/api/v1/auth/token/",
            b'{"username": "a", "password": "b"}',
            {"Content-Type": "application/json"},
        ),
    ]:
        status, response_headers, text = _request(server + path, method=method, body=body, headers=headers)
        assert status == 503, (path, status, text[:300])
        assert response_headers["Content-Type"].startswith("application/json")
        assert int(response_headers["Retry-After"]) > 0
        data = json.loads(text)
        assert set(data) == {"message", "fields"}
        _assert_no_secret(text)


def test_pages_are_a_plain_maintenance_page(server):
    # A session cookie: the page must read the session (anonymous visitors are redirected to
    # the login form, which renders without the database).
    cookie = {"Cookie": "sessionid=abcdefghijklmnopqrstuvwxyz012345"}
    for path in ("/", "/bookings/", "/ops/"):
        status, headers, text = _request(server + path, headers=cookie)
        assert status == 503, (path, status, text[:300])
        assert headers["Content-Type"].startswith("text/html")
        assert int(headers["Retry-After"]) > 0
        assert "briefly unavailable" in text
        _assert_no_secret(text)
