"""The audit log (staff only)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling import selectors
from scheduling.api.common import PaginatedApi, errors
from scheduling.models import AuditEvent


class AuditEventListApi(PaginatedApi):
    permission_classes = [permissions.IsAdminUser]

    class FilterSerializer(serializers.Serializer[Any]):
        entity_type = serializers.CharField(max_length=40, required=False)
        entity_id = serializers.IntegerField(min_value=0, max_value=2**63 - 1, required=False)

    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        at = serializers.DateTimeField()
        actor = serializers.CharField(source="actor.username", allow_null=True, default=None)
        actor_label = serializers.ChoiceField(choices=AuditEvent.Actor.choices)
        verb = serializers.CharField()
        entity_type = serializers.CharField()
        entity_id = serializers.IntegerField()
        before = serializers.JSONField(allow_null=True)
        after = serializers.JSONField(allow_null=True)

    @extend_schema(
        operation_id="audit_events_list",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer(many=True), **errors(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        events = selectors.audit_event_list(
            request.user,
            entity_type=filters.validated_data.get("entity_type"),
            entity_id=filters.validated_data.get("entity_id"),
        )
        return self.paginate(request, events, self.OutputSerializer)
