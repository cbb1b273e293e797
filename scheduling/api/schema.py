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
        """Also document the 429 of the per-user write throttle on every throttled unsafe method."""
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
        return bodies
