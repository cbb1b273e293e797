from __future__ import annotations

from django.urls import path

from notifications import views

urlpatterns = [
    path("account/notifications/", views.preferences, name="notification-preferences"),
    path("account/notifications/webhooks/", views.webhook_create_view, name="notification-webhook-create"),
    path(
        "account/notifications/webhooks/<int:webhook_id>/delete/",
        views.webhook_delete_view,
        name="notification-webhook-delete",
    ),
]
