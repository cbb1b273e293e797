"""OpenAPI schema generation tuned to the HackSoft layout of our API views."""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.openapi import AutoSchema as _AutoSchema


class AutoSchema(_AutoSchema):
    """Names components nested in an API class after it: ``BookingListCreateApi.InputSerializer``
    becomes ``BookingListCreateInput`` (every view has its own ``InputSerializer``/``OutputSerializer``,
    which would otherwise all collide as ``Input``/``Output``)."""

    def get_serializer_name(self, serializer: Any, direction: Literal["request", "response"]) -> str:
        name = super().get_serializer_name(serializer, direction)
        parts = type(serializer).__qualname__.split(".")
        if len(parts) >= 2 and parts[-2].endswith("Api"):
            return parts[-2].removesuffix("Api") + name
        return name

    def _is_idempotent_write(self) -> bool:
        from scheduling.api.idempotency import is_idempotent

        return is_idempotent(getattr(self.view, self.method.lower(), None))

    def get_override_parameters(self) -> list[Any]:
        """The ``Idempotency-Key`` request header (and ``Idempotent-Replayed`` answer header) on
        every write that honours it (``scheduling.api.idempotency``)."""
        from drf_spectacular.types import OpenApiTypes
        from drf_spectacular.utils import OpenApiParameter

        from scheduling.api.idempotency import HEADER, MAX_KEY_LENGTH, REPLAYED_HEADER

        parameters: list[Any] = list(super().get_override_parameters())
        if self._is_idempotent_write():
            parameters += [
                OpenApiParameter(
                    HEADER,
                    OpenApiTypes.STR,
                    location=OpenApiParameter.HEADER,
                    required=False,
                    description=(
                        f"A new key (1-{MAX_KEY_LENGTH} visible ASCII characters, e.g. a UUID) per "
                        "write. Retrying with the same key after a lost answer (connection error, "
                        "503, time-out) never writes twice: if the first try was stored, its answer "
                        f"is returned again with `{REPLAYED_HEADER}: true`. The same key with another "
                        "method, path or body is a 422. Only successful answers are stored; keys "
                        "are per user and expire after 24 hours."
                    ),
                ),
                OpenApiParameter(
                    REPLAYED_HEADER,
                    OpenApiTypes.STR,
                    location=OpenApiParameter.HEADER,
                    response=[200, 201],
                    description=(
                        "`true` when the answer is the stored one of an earlier request with the same "
                        "`Idempotency-Key` (nothing was written again); `false` on a first try."
                    ),
                ),
            ]
        return parameters

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        """Also document the errors any operation can answer, in the one error shape: 429 of the
        per-user write throttle on every throttled unsafe method; 413 (body too large) and 415
        (not JSON) wherever a body is read; 414 (URL too long, from the web server) and 503
        (database unreachable, with ``Retry-After``) everywhere; 422 (a reused
        ``Idempotency-Key``) on the writes that take one."""
        from drf_spectacular.utils import OpenApiResponse

        from portal.security import WriteRateThrottle
        from scheduling.api.common import ErrorSerializer

        bodies: dict[str, Any] = super()._get_response_bodies(direction)
        if (
            self.method.upper() in {"POST", "PUT", "PATCH", "DELETE"}
            and "429" not in bodies
            and any(isinstance(t, WriteRateThrottle) for t in self.view.get_throttles())
        ):
            bodies["429"] = self._get_response_for_code(  # type: ignore[no-untyped-call]
                OpenApiResponse(ErrorSerializer, description="Too many writes; retry later."),
                "429",
                direction=direction,
            )
        common = {
            "414": "The URL is too long.",
            "503": "Briefly unavailable (the database is unreachable); retry after `Retry-After` seconds.",
        }
        if self.method.upper() in {"POST", "PUT", "PATCH"}:
            common["413"] = "The request body is too large."
            common["415"] = "The body is not JSON (send `Content-Type: application/json`)."
        if self._is_idempotent_write():
            common["422"] = "The `Idempotency-Key` was used for a different request (`fields` says so)."
        for code, description in common.items():
            if code not in bodies:
                bodies[code] = self._get_response_for_code(  # type: ignore[no-untyped-call]
                    OpenApiResponse(ErrorSerializer, description=description), code, direction=direction
                )
        return bodies
