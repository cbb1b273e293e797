"""The CLI's writes carry an ``Idempotency-Key`` and are retried with the same key when the
answer is lost or is a 503 (against a real loopback HTTP server that fails on purpose)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from berth_cli.client import Api
from berth_cli.errors import EXIT_UNAVAILABLE, BerthCliError


class _Flaky:
    """Answers the n-th write as ``script[n]``: "drop" (read it, close without answering),
    "503" (with Retry-After: 7) or "201"; records every request's method, path and key."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.seen: list[tuple[str, str, str | None, Any]] = []


@pytest.fixture
def flaky(request: pytest.FixtureRequest) -> Iterator[tuple[str, _Flaky]]:
    state = _Flaky(list(request.param))

    class Handler(BaseHTTPRequestHandler):
        def _write(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            state.seen.append((self.command, self.path, self.headers.get("Idempotency-Key"), body))
            what = state.script[min(len(state.seen), len(state.script)) - 1]
            if what == "drop":
                self.close_connection = True
                self.connection.close()
                return
            code, payload = (503, {"message": "db down", "fields": {}}) if what == "503" else (201, {"id": 7})
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if code == 503:
                self.send_header("Retry-After", "7")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_DELETE = _write

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("flaky", [["drop", "503", "201"]], indirect=True)
def test_a_lost_answer_and_a_503_are_retried_with_the_same_key(flaky: tuple[str, _Flaky]) -> None:
    url, state = flaky
    slept: list[float] = []
    api = Api(url, "token", sleep=slept.append, retries=3)
    assert api.post("/bookings/", {"gpu_count": 1}) == {"id": 7}
    assert [(m, p) for m, p, _, _ in state.seen] == [("POST", "/api/v1/bookings/")] * 3
    keys = {key for _, _, key, _ in state.seen}
    assert len(keys) == 1
    assert None not in keys
    assert all(body == {"gpu_count": 1} for *_, body in state.seen)
    assert slept == [1.0, 7.0]  # backoff after the lost answer, then the server's Retry-After
    # The next write is a new write: a new key.
    assert api.delete("/jobs/1/") == {"id": 7}
    assert state.seen[-1][2] not in keys


@pytest.mark.parametrize("flaky", [["503"]], indirect=True)
def test_a_write_still_unavailable_after_the_retries_exits_5(flaky: tuple[str, _Flaky]) -> None:
    url, state = flaky
    slept: list[float] = []
    with pytest.raises(BerthCliError) as raised:
        Api(url, "token", sleep=slept.append, retries=2).post("/jobs/", {"name": "x"})
    assert raised.value.exit_code == EXIT_UNAVAILABLE
    assert "Retry in 7 s" in raised.value.message
    assert len(state.seen) == 3
    assert len({key for _, _, key, _ in state.seen}) == 1
    assert slept == [7.0, 7.0]


@pytest.mark.parametrize("flaky", [["201"]], indirect=True)
def test_berth_retries_sets_how_often_a_write_is_retried(
    flaky: tuple[str, _Flaky], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, state = flaky
    monkeypatch.setenv("BERTH_RETRIES", "0")
    api = Api(url, "token")
    assert api.retries == 0
    assert api.post("/jobs/", {}) == {"id": 7}
    assert state.seen[0][2] is not None
