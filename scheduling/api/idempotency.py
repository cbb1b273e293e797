"""``Idempotency-Key`` on the API's writes: a retried write is answered, not written again.

A client that lost the answer to a write (its connection, or PostgreSQL, died at the COMMIT)
cannot know whether the write is stored.  Sent with an ``Idempotency-Key`` header (any
1-255 visible ASCII characters, e.g. a UUID, new for each write), the write is done in one
transaction with a row holding the key and the answer; a retry with the same key then:

* finds the row (the write was stored): answers the stored status and body again, with
  ``Idempotent-Replayed: true``, and writes nothing;
* finds no row (the write was not stored): does the write, as the first try would have;
* finds the row of a different request (another method, path or body): 422 with a field
  message on ``Idempotency-Key``: keys are not reused for different writes.

Two concurrent requests with one key cannot both write: the second one's insert of the key
waits on the first one's uncommitted row (the ``(user, key)`` unique constraint), then sees
it and replays its answer (or, if the first rolled back, does the write itself).

Only successful answers (2xx) are stored: an error wrote nothing, so a retry with the same key
runs again (a 409 may succeed later).  Keys are per user and expire after
``BERTH_IDEMPOTENCY_TTL_S`` (24 h); ``scheduling.tasks.idempotency_keys_clean`` deletes
expired rows hourly, and an expired key is treated as new.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.common import request_user, short
from scheduling.models import IdempotencyKey

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255

_Handler = TypeVar("_Handler", bound=Callable[..., Response])


class IdempotencyKeyReusedError(exceptions.APIException):
    """The key was used for another request: 422 with a field message (not a 400: the body is valid)."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "This Idempotency-Key was used for a different request."
    default_code = "idempotency_key_reused"

    def __init__(self, message: str) -> None:
        super().__init__(self.default_detail)
        self.fields = {HEADER: [message]}  # portal.api.exception_handler answers them


def _valid_key(raw: str) -> str:
    if not 1 <= len(raw) <= MAX_KEY_LENGTH or not all("\x21" <= c <= "\x7e" for c in raw):
        raise serializers.ValidationError(
            {HEADER: [f"Give 1 to {MAX_KEY_LENGTH} visible ASCII characters (a UUID, for example)."]}
        )
    return raw


def _fingerprint(request: Request) -> str:
    """sha256 of the method, the path with its query and the body as canonical JSON."""
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    text = "\n".join((request.method or "", request.get_full_path(), body))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _claim(user_id: int, key: str, fingerprint: str, request: Request) -> int | tuple[str, int, str]:
    """Inside the write's transaction: the id of the new key row, or the stored
    ``(fingerprint, status, body)`` of the request that used the key first.

    A concurrent first use makes the insert wait on the ``(user, key)`` unique index until that
    transaction ends: committed, the insert fails and its row is read; rolled back, the insert
    goes through (``get_or_create`` inserts in a savepoint, so the write's transaction goes on).
    """
    now = timezone.now()
    expired = now - timedelta(seconds=settings.BERTH_IDEMPOTENCY_TTL_S)
    IdempotencyKey.objects.filter(user_id=user_id, key=key, created_at__lt=expired).delete()
    for _ in range(3):  # a row deleted between the failed insert and the read is claimed again
        try:
            row, created = IdempotencyKey.objects.get_or_create(
                user_id=user_id,
                key=key,
                defaults={
                    "fingerprint": fingerprint,
                    "method": request.method or "",
                    "path": request.path[:2000],
                    "status_code": 0,
                    "body": "",
                    "created_at": now,
                },
            )
        except IntegrityError:
            continue
        return row.pk if created else (row.fingerprint, row.status_code, row.body)
    raise exceptions.APIException("The Idempotency-Key could not be claimed; retry.")


def idempotent(handler: _Handler) -> _Handler:
    """Decorate an API view's write method (``post``, ``delete``, ...) to honour ``Idempotency-Key``.

    Without the header the method runs as before.  With it, the method runs inside a
    transaction that also stores the key with the answer (see the module docstring).
    """

    @functools.wraps(handler)
    def wrapper(view: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        raw = request.headers.get(HEADER)
        if raw is None:
            return handler(view, request, *args, **kwargs)
        key = _valid_key(raw)
        user = request_user(request)
        fingerprint = _fingerprint(request)
        with transaction.atomic():
            claimed = _claim(user.pk, key, fingerprint, request)
            if isinstance(claimed, tuple):
                stored_fingerprint, code, body = claimed
                if stored_fingerprint != fingerprint:
                    raise IdempotencyKeyReusedError(
                        f"The key {short(key)} was used for a different request (method, path or "
                        "body) in the last "
                        f"{settings.BERTH_IDEMPOTENCY_TTL_S // 3600} h; send a new key for a new write."
                    )
                return Response(json.loads(body), status=code, headers={REPLAYED_HEADER: "true"})
            response = handler(view, request, *args, **kwargs)
            if not status.is_success(response.status_code):
                transaction.set_rollback(True)  # an error answer is not kept (nor anything it did)
                return response
            IdempotencyKey.objects.filter(pk=claimed).update(
                status_code=response.status_code, body=json.dumps(response.data, cls=DjangoJSONEncoder)
            )
        response[REPLAYED_HEADER] = "false"
        return response

    wrapper.is_idempotent = True  # type: ignore[attr-defined]  # read by scheduling.api.schema
    return wrapper  # type: ignore[return-value]


def delegates_idempotent(handler: _Handler) -> _Handler:
    """Mark a write method whose work is an ``@idempotent`` method it calls (for the schema)."""
    handler.is_idempotent = True  # type: ignore[attr-defined]
    return handler


def is_idempotent(handler: object) -> bool:
    return bool(getattr(handler, "is_idempotent", False))
