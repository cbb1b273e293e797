"""Notifications API (mounted at /api/v1/notifications/): preferences, webhooks CRUD, delivery log."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications import selectors, services
from notifications.models import Delivery, EventKind
from portal.accounts.models import Project
from scheduling.api.common import PaginatedApi, errors, request_user


class PreferenceSerializer(serializers.Serializer[Any]):
    is_email_enabled = serializers.BooleanField(required=False)
    email_events = serializers.ListField(
        child=serializers.ChoiceField(choices=EventKind.choices), required=False, max_length=32
    )
    booking_start_lead_min = serializers.IntegerField(min_value=0, max_value=10_080, required=False)
    booking_end_lead_min = serializers.IntegerField(min_value=0, max_value=10_080, required=False)


def _preference_data(pref: Any) -> dict[str, Any]:
    return {
        "is_email_enabled": pref.is_email_enabled,
        "email_events": list(pref.email_events),
        "booking_start_lead_min": pref.booking_start_lead_min,
        "booking_end_lead_min": pref.booking_end_lead_min,
        "events": [{"name": value, "label": label} for value, label in EventKind.choices],
    }


class PreferenceApi(APIView):
    @extend_schema(
        operation_id="notification_preferences_retrieve", responses={200: PreferenceSerializer, **errors(401)}
    )
    def get(self, request: Request) -> Response:
        return Response(_preference_data(services.preference_get(user=request_user(request))))

    @extend_schema(
        operation_id="notification_preferences_update",
        request=PreferenceSerializer,
        responses={200: PreferenceSerializer, **errors(400, 401)},
    )
    def put(self, request: Request) -> Response:
        serializer = PreferenceSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        pref = services.preference_update(user=request_user(request), **serializer.validated_data)
        return Response(_preference_data(pref))


class WebhookOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    url = serializers.URLField()
    project = serializers.CharField(source="project.slug", allow_null=True, default=None)
    events = serializers.ListField(child=serializers.CharField())
    is_active = serializers.BooleanField()
    created_at = serializers.DateTimeField()


class WebhookCreatedSerializer(WebhookOutputSerializer):
    secret = serializers.CharField(help_text="The HMAC-SHA256 key of X-Berth-Signature; shown only now.")


class WebhookInputSerializer(serializers.Serializer[Any]):
    url = serializers.URLField(max_length=500)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EventKind.choices), required=False, max_length=32
    )
    project = serializers.SlugRelatedField(
        slug_field="slug", queryset=Project.objects.all(), required=False, allow_null=True
    )


class WebhookUpdateSerializer(serializers.Serializer[Any]):
    url = serializers.URLField(max_length=500, required=False)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EventKind.choices), required=False, max_length=32
    )
    is_active = serializers.BooleanField(required=False)


class WebhookListCreateApi(PaginatedApi):
    @extend_schema(
        operation_id="webhooks_list", responses={200: WebhookOutputSerializer(many=True), **errors(400, 401)}
    )
    def get(self, request: Request) -> Response:
        return self.paginate(
            request, selectors.webhook_list(user=request_user(request)), WebhookOutputSerializer
        )

    @extend_schema(
        operation_id="webhooks_create",
        request=WebhookInputSerializer,
        responses={201: WebhookCreatedSerializer, **errors(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        serializer = WebhookInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        hook = services.webhook_create(owner=request_user(request), **serializer.validated_data)
        return Response(WebhookCreatedSerializer(hook).data, status=status.HTTP_201_CREATED)


class WebhookDetailApi(APIView):
    @extend_schema(
        operation_id="webhooks_retrieve", responses={200: WebhookOutputSerializer, **errors(401, 404)}
    )
    def get(self, request: Request, webhook_id: int) -> Response:
        hook = selectors.webhook_get(user=request_user(request), webhook_id=webhook_id)
        return Response(WebhookOutputSerializer(hook).data)

    @extend_schema(
        operation_id="webhooks_update",
        request=WebhookUpdateSerializer,
        responses={200: WebhookOutputSerializer, **errors(400, 401, 404)},
    )
    def patch(self, request: Request, webhook_id: int) -> Response:
        hook = selectors.webhook_get(user=request_user(request), webhook_id=webhook_id)
        serializer = WebhookUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        hook = services.webhook_update(hook, **serializer.validated_data)
        return Response(WebhookOutputSerializer(hook).data)

    @extend_schema(operation_id="webhooks_destroy", responses={204: None, **errors(401, 404)})
    def delete(self, request: Request, webhook_id: int) -> Response:
        services.webhook_delete(selectors.webhook_get(user=request_user(request), webhook_id=webhook_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateSecretApi(APIView):
    @extend_schema(
        operation_id="webhooks_rotate_secret",
        request=None,
        responses={200: WebhookCreatedSerializer, **errors(401, 404)},
    )
    def post(self, request: Request, webhook_id: int) -> Response:
        hook = selectors.webhook_get(user=request_user(request), webhook_id=webhook_id)
        return Response(WebhookCreatedSerializer(services.webhook_secret_rotate(hook)).data)


class DeliveryOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    event = serializers.ChoiceField(choices=EventKind.choices)
    event_key = serializers.CharField()
    channel = serializers.ChoiceField(choices=Delivery.Channel.choices)
    webhook = serializers.IntegerField(source="webhook_id", allow_null=True)
    recipient = serializers.CharField()
    subject = serializers.CharField()
    status = serializers.ChoiceField(choices=Delivery.Status.choices)
    attempts = serializers.IntegerField()
    response_status = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    sent_at = serializers.DateTimeField(allow_null=True)


class DeliveryListApi(PaginatedApi):
    class FilterSerializer(serializers.Serializer[Any]):
        webhook = serializers.IntegerField(required=False, min_value=1)
        status = serializers.ChoiceField(choices=Delivery.Status.choices, required=False)

    @extend_schema(
        operation_id="notification_deliveries_list",
        parameters=[FilterSerializer],
        responses={200: DeliveryOutputSerializer(many=True), **errors(400, 401)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        qs = selectors.delivery_list(
            user=request_user(request),
            webhook_id=filters.validated_data.get("webhook"),
            status=filters.validated_data.get("status"),
        )
        return self.paginate(request, qs, DeliveryOutputSerializer)
