"""/api/v1/notifications/ (mounted by portal.urls before the scheduling API's catch-all)."""

from __future__ import annotations

from django.urls import path

from notifications.api.views import (
    DeliveryListApi,
    PreferenceApi,
    WebhookDetailApi,
    WebhookListCreateApi,
    WebhookRotateSecretApi,
)

app_name = "notifications-api"

urlpatterns = [
    path("preferences/", PreferenceApi.as_view(), name="preferences"),
    path("webhooks/", WebhookListCreateApi.as_view(), name="webhook-list"),
    path("webhooks/<int:webhook_id>/", WebhookDetailApi.as_view(), name="webhook-detail"),
    path("webhooks/<int:webhook_id>/rotate-secret/", WebhookRotateSecretApi.as_view(), name="webhook-rotate"),
    path("deliveries/", DeliveryListApi.as_view(), name="delivery-list"),
]
