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

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        """Also document the errors any operation can answer, in the one error shape: 429 of the
        per-user write throttle on every throttled unsafe method; 413 (body too large) and 415
        (not JSON) wherever a body is read; 414 (URL too long, from the web server) and 503
        (database unreachable, with ``Retry-After``) everywhere."""
        from drf_spectacular.utils import OpenApiResponse

        from portal.security import WriteRateThrottle
        from scheduling.api.common import ErrorSerializer

        bodies: dict[str, Any] = super()._get_response_bodies(direction)
        if (
            self.method.upper() in {"POST", "PUT", "PATCH", "DELETE"}
            and "429" not in bodies
            and any(isinstance(t, WriteRateThrottle) for t in self.view.get_throttles())
        ):
            bodies["429"] = self._get_response_for_code(
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
        for code, description in common.items():
            if code not in bodies:
                bodies[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=description), code, direction=direction
                )
        return bodies
