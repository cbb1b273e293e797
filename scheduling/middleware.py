"""Read your own availability writes across web processes (`scheduling.selectors`, the cache)."""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

from django.conf import settings

from scheduling.selectors import STAMP_COOKIE, STAMP_HEADER, availability_read_after, availability_stamp

logger = logging.getLogger(__name__)
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class AvailabilityStampMiddleware:
    """Read your own writes across processes (see the cache comment above).

    A request that carries a stamp (header ``Berth-Availability-After`` or the cookie) reads
    availability through it; a successful write request gets a fresh stamp in both.
    """

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        raw = request.headers.get(STAMP_HEADER) or request.COOKIES.get(STAMP_COOKIE)
        stamp: float | None = None
        if raw:
            with contextlib.suppress(ValueError):
                stamp = float(raw) if math.isfinite(float(raw)) else None
        with availability_read_after(stamp):
            response = self.get_response(request)
        if request.method in _UNSAFE_METHODS and response.status_code < 400:
            try:
                fresh = availability_stamp()
            except Exception:  # the write is done; only the stamp is missing
                logger.warning("availability stamp unavailable", exc_info=True)
                return response
            value = f"{fresh:.6f}"
            response[STAMP_HEADER] = value
            response.set_cookie(
                STAMP_COOKIE,
                value,
                max_age=max(1, math.ceil(float(settings.BERTH_AVAILABILITY_CACHE_S)) + 1),
                httponly=True,
                samesite="Lax",
                secure=request.is_secure(),
            )
        return response
