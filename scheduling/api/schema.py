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
