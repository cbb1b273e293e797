"""Request bodies sent with ``Transfer-Encoding: chunked`` (issue 13, item 9) against a real gunicorn.

Django's test client cannot send a chunked body, so a real gunicorn (the server the portal
ships with) serves the test database; the requests are raw ``http.client`` ones.  A chunked
token request must be read (not seen as empty), too large a chunked body is a JSON 413 and a
malformed chunk stream a JSON 400.  The middleware's refusal on servers that cannot de-chunk
(no ``wsgi.input_terminated``) is checked on the WSGI callable itself.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from portal.chunked import ChunkedBodyMiddleware
from tests.factories import UserFactory

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")
PASSWORD = "chunked-body-password-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def gunicorn(transactional_db: None) -> Iterator[int]:
    db = settings.DATABASES["default"]
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_ENV": "production",
        "DJANGO_DEBUG": "0",
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "DJANGO_SECRET_KEY": "test-only-" + "c" * 50,
        "DATA_UPLOAD_MAX_MEMORY_SIZE": "4096",
        "LOG_LEVEL": "ERROR",
    }
    proc = subprocess.Popen(
        [str(GUNICORN), "portal.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(timeout=20)


def _chunked(port: int, path: str, chunks: list[bytes]) -> tuple[int, str, str]:
    """POST ``chunks`` with Transfer-Encoding: chunked (http.client frames each chunk)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request(
        "POST", path, body=iter(chunks), headers={"Content-Type": "application/json"}, encode_chunked=True
    )
    response = conn.getresponse()
    out = response.status, response.getheader("Content-Type", ""), response.read().decode()
    conn.close()
    return out


def _raw(port: int, data: bytes) -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


def test_a_chunked_token_request_is_read(gunicorn: int) -> None:
    user = UserFactory(username="chunky", password=PASSWORD)
    body = json.dumps({"username": user.username, "password": PASSWORD}).encode()
    status, content_type, text = _chunked(gunicorn, "/api/v1/auth/token/", [body[:7], body[7:20], body[20:]])
    assert status == 200, text
    assert content_type.startswith("application/json")
    assert len(json.loads(text)["token"]) >= 20
    # A wrong password is refused on the password (the body was read), not as an empty body.
    wrong = json.dumps({"username": user.username, "password": "nope"}).encode()
    status, _, text = _chunked(gunicorn, "/api/v1/auth/token/", [wrong])
    assert status in (400, 401, 403), text
    assert "required" not in text


def test_a_chunked_body_over_the_limit_is_a_json_413(gunicorn: int) -> None:
    chunks = [b'{"username": "' + b"a" * 3000] * 2
    status, content_type, text = _chunked(gunicorn, "/api/v1/auth/token/", chunks)
    assert status == 413, text
    assert content_type.startswith("application/json")
    assert set(json.loads(text)) == {"message", "fields"}


def test_a_malformed_chunk_stream_is_a_json_400(gunicorn: int) -> None:
    request = (
        b"POST /api/v1/auth/token/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    )
    status, text = _raw(gunicorn, request)
    assert status == 400, text
    assert "Traceback" not in text


def test_servers_that_cannot_dechunk_get_a_json_411() -> None:
    seen: list[dict[str, object]] = []

    def app(environ, start_response):
        seen.append(environ)
        start_response("200 OK", [])
        return [b""]

    started: list[str] = []
    wrapped = ChunkedBodyMiddleware(app, max_bytes=lambda: 100)
    body = b"".join(
        wrapped(
            {"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": None},
            lambda status, headers: started.append(status),
        )
    )
    assert started == ["411 Length Required"]
    assert set(json.loads(body)) == {"message", "fields"}
    assert not seen
