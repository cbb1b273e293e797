"""Django admin for stored forecasts and what-ifs (capacity studies): read-only, written by the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from forecasting.models import CapacityStudy, ForecastPoint, ForecastRun


class _ReadOnly:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ForecastPointInline(_ReadOnly, admin.TabularInline):  # type: ignore[type-arg]  # not generic at run time
    model = ForecastPoint
    extra = 0
    fields = ["ts", "yhat", "lower80", "upper80"]
    readonly_fields = ["ts", "yhat", "lower80", "upper80"]
    can_delete = False


@admin.register(ForecastRun)
class ForecastRunAdmin(_ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # not generic at run time
    list_display = ["issued_at", "cluster", "kind", "key", "model_name", "history_hours", "fit_s"]
    list_filter = ["kind", "model_name", "cluster"]
    search_fields = ["key", "cluster__name"]
    date_hierarchy = "issued_at"
    list_select_related = ["cluster"]
    inlines = [ForecastPointInline]


@admin.register(CapacityStudy)
class CapacityStudyAdmin(_ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # not generic at run time
    list_display = ["created_at", "cluster", "gpu_type", "gpu_delta", "policy", "status", "progress"]
    list_filter = ["status", "cluster"]
    search_fields = ["cluster__name", "gpu_type__name", "message"]
    list_select_related = ["cluster", "gpu_type"]
