"""The HTTP client: one place that turns the API's answers into data or a ``BerthCliError``."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import click
import httpx

from berth_cli import __version__
from berth_cli.errors import (
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    BerthCliError,
)

API_PREFIX = "/api/v1"
TIMEOUT_S = 30.0
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A write whose answer was lost (no connection, time-out, 503) is sent again this many times,
# with the same Idempotency-Key: the server answers a stored write instead of doing it twice.
RETRIES = 3
RETRY_WAIT_MAX_S = 10.0  # a longer Retry-After is cut to this between two tries


def _retries() -> int:
    try:
        return max(0, int(os.environ.get("BERTH_RETRIES", RETRIES)))
    except ValueError:
        return RETRIES


def _note(message: str) -> None:
    click.echo(message, err=True)


def _field_lines(fields: Any, prefix: str = "") -> list[str]:
    """``{"gpu_count": ["Too many."], "payload": {"command": [...]}}`` as ``gpu_count: Too many.``."""
    lines: list[str] = []
    if isinstance(fields, dict):
        for name, value in fields.items():
            lines += _field_lines(value, f"{prefix}{name}." if isinstance(value, dict) else f"{prefix}{name}")
    elif isinstance(fields, list):
        for item in fields:
            if isinstance(item, (dict, list)):
                lines += _field_lines(item, prefix)
            else:
                lines.append(f"{prefix}: {item}" if prefix else str(item))
    elif fields:
        lines.append(f"{prefix}: {fields}" if prefix else str(fields))
    return lines


def error_for(response: httpx.Response) -> BerthCliError:
    """The CLI error (message and exit code) for an API error response."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {"detail": body}
    code = response.status_code
    message = str(body.get("message") or response.reason_phrase or f"HTTP {code}")
    details = _field_lines(body.get("fields") or {})
    if details and not (len(details) == 1 and details[0].endswith(message)):
        message = message + "\n  " + "\n  ".join(details)
    body = {"status": code, **body}
    if code == 409:
        return BerthCliError(message, exit_code=EXIT_CONFLICT, body=body)
    if code == 401:
        return BerthCliError(
            f"{message} Sign in with `berth login` (or set BERTH_TOKEN).", exit_code=EXIT_NOT_FOUND, body=body
        )
    if code in (403, 404):
        return BerthCliError(message, exit_code=EXIT_NOT_FOUND, body=body)
    if code == 429 or code >= 500:
        retry = response.headers.get("Retry-After")
        hint = f" Retry in {retry} s." if retry else " Try again later."
        return BerthCliError(
            f"The server is unavailable (HTTP {code}): {message}.{hint}".replace("..", "."),
            exit_code=EXIT_UNAVAILABLE,
            body=body,
        )
    if 400 <= code < 500:
        return BerthCliError(message, exit_code=EXIT_USAGE, body=body)
    return BerthCliError(f"Unexpected answer HTTP {code}.", exit_code=EXIT_FAILED, body=body)


def _retry_after(response: httpx.Response, *, default: float) -> float:
    try:
        wait_s = float(response.headers.get("Retry-After", default))
    except ValueError:
        wait_s = default
    return min(RETRY_WAIT_MAX_S, max(0.0, wait_s))


class Api:
    """A session against one Berth server (``url`` without the /api/v1 suffix)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout_s: float = TIMEOUT_S,
        retries: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = _retries() if retries is None else retries
        self.sleep = sleep
        headers = {"Accept": "application/json", "User-Agent": f"berth-cli/{__version__}"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self._http = httpx.Client(base_url=self.url + API_PREFIX, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The decoded JSON of a 2xx answer (``None`` for 204); else raises ``BerthCliError``.

        A write carries a new ``Idempotency-Key`` and is retried with that same key when its
        answer is lost (connection error, time-out) or is a 503: the server replays the stored
        answer if the first try was written, so a retry never books or submits twice.
        """
        method = method.upper()
        if method not in WRITE_METHODS:
            return self._answer(self._send(method, path, **kwargs))
        headers = {**kwargs.pop("headers", {}), "Idempotency-Key": str(uuid.uuid4())}
        attempts = 1 + self.retries
        for attempt in range(1, attempts + 1):
            is_last = attempt == attempts
            try:
                response = self._send(method, path, headers=headers, **kwargs)
            except BerthCliError as exc:
                if is_last:
                    raise
                wait_s = min(RETRY_WAIT_MAX_S, 2.0 ** (attempt - 1))
                _note(f"{exc.message.splitlines()[0]} Retrying in {wait_s:g} s ({attempt}/{attempts}).")
                self.sleep(wait_s)
                continue
            if response.status_code != 503 or is_last:
                return self._answer(response)
            wait_s = _retry_after(response, default=2.0 ** (attempt - 1))
            _note(f"The server is unavailable (HTTP 503); retrying in {wait_s:g} s ({attempt}/{attempts}).")
            self.sleep(wait_s)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise BerthCliError(
                f"The server at {self.url} did not answer in time ({exc.__class__.__name__}).",
                exit_code=EXIT_UNAVAILABLE,
            ) from exc
        except httpx.TransportError as exc:
            raise BerthCliError(
                f"Cannot reach the Berth server at {self.url}: {exc}. "
                "Is it running? Set the address with BERTH_URL or `berth login --url`.",
                exit_code=EXIT_UNAVAILABLE,
            ) from exc

    def _answer(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_for(response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise BerthCliError(
                f"The server at {self.url} answered something that is not the Berth API "
                f"(HTTP {response.status_code}, {response.headers.get('content-type', 'no type')}).",
                exit_code=EXIT_UNAVAILABLE,
            ) from exc

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def pages(self, path: str, *, limit: int, **params: Any) -> Iterator[dict[str, Any]]:
        """Items of a cursor-paginated list, following ``next`` until ``limit`` items."""
        page_size = max(1, min(limit, 200))
        data = self.get(path, page_size=page_size, **params)
        count = 0
        while True:
            for item in data.get("results", []):
                if count >= limit:
                    return
                count += 1
                yield item
            next_url = data.get("next")
            if not next_url or count >= limit:
                return
            data = self.request("GET", next_url)
