"""WSGI middleware: request bodies sent with ``Transfer-Encoding: chunked`` are read, not dropped.

Django reads ``CONTENT_LENGTH`` bytes of ``wsgi.input`` and nothing else; a chunked body has no
length, so Django saw it as empty (a token request answered "username: required", a booking
"every field required").  Servers that de-chunk the body and mark the stream as ending there
(``wsgi.input_terminated``, set by gunicorn) hand us a readable stream: the middleware reads it,
up to ``DATA_UPLOAD_MAX_MEMORY_SIZE``, and passes Django the bytes with their length.  Anything
else answers in the API's error shape ``{"message", "fields"}``:

* a chunked body on a server that cannot de-chunk it (no ``wsgi.input_terminated``, e.g.
  ``runserver``): 411 Length Required;
* more than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes: 413;
* a malformed chunk stream: 400.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_REASONS = {400: "Bad Request", 411: "Length Required", 413: "Request Entity Too Large"}


def _error(start_response: StartResponse, status: int, message: str) -> list[bytes]:
    body = json.dumps({"message": message, "fields": {}}).encode()
    start_response(
        f"{status} {_REASONS[status]}",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ],
    )
    return [body]


class ChunkedBodyMiddleware:
    """Wrap a WSGI application; see the module docstring."""

    def __init__(self, app: WsgiApp, *, max_bytes: Callable[[], int] | None = None) -> None:
        self.app = app
        self._max_bytes = max_bytes or _upload_limit

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        encoding = environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if "chunked" not in encoding or environ.get("CONTENT_LENGTH"):
            return self.app(environ, start_response)
        if not environ.get("wsgi.input_terminated"):
            return _error(
                start_response,
                411,
                "This server cannot read a chunked request body; send it with a Content-Length.",
            )
        limit = self._max_bytes()
        try:
            body = environ["wsgi.input"].read(limit + 1)
        except Exception:  # the server's de-chunking failed: a malformed chunk size or a cut stream
            logger.info("malformed chunked request body", exc_info=True)
            return _error(start_response, 400, "The chunked request body is malformed.")
        if len(body) > limit:
            return _error(start_response, 413, f"The request body is larger than {limit} bytes.")
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)


def _upload_limit() -> int:
    from django.conf import settings

    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0) or 2_621_440
