"""Bookings: list, create, retrieve, cancel, extend, end early."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts.models import Project
from scheduling import selectors, services
from scheduling.api.common import PaginatedApi, csv_values, errors, request_user
from scheduling.models import Allocation, AuditEvent, Booking, Cluster, GpuType

_MAX_GPUS = 4096  # an absurd count is a field error before it reaches the database


class BookingGpuSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    node = serializers.CharField(source="node.name")
    index = serializers.IntegerField()


class BookingOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    user = serializers.CharField(source="user.username")
    project = serializers.CharField(source="project.slug")
    cluster = serializers.CharField(source="cluster.name")
    gpu_type = serializers.CharField(source="gpu_type.name")
    gpu_count = serializers.IntegerField()
    start_at = serializers.DateTimeField()
    end_at = serializers.DateTimeField()
    status = serializers.ChoiceField(choices=Booking.Status.choices)
    note = serializers.CharField()
    gpu_ids = serializers.SerializerMethodField()
    gpus = serializers.SerializerMethodField(help_text="Where to connect: the held GPUs and their nodes.")
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)

    def _held(self, booking: Booking) -> list[Allocation]:
        held = getattr(booking, "held_allocations", None)
        if held is None:  # not loaded through the selector
            held = list(booking.allocations.exclude(state="released").select_related("gpu__node"))
            booking.held_allocations = held  # type: ignore[attr-defined]
        return sorted(held, key=lambda a: a.gpu_id)

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_gpu_ids(self, booking: Booking) -> list[int]:
        return [a.gpu_id for a in self._held(booking)]

    @extend_schema_field(BookingGpuSerializer(many=True))
    def get_gpus(self, booking: Booking) -> list[dict[str, Any]]:
        return [dict(BookingGpuSerializer(a.gpu).data) for a in self._held(booking)]


def _booking_response(user: Any, booking_id: int, code: int = status.HTTP_200_OK) -> Response:
    booking = selectors.booking_get(user, booking_id=booking_id)
    return Response(BookingOutputSerializer(booking).data, status=code)


class BookingListCreateApi(PaginatedApi):
    class FilterSerializer(serializers.Serializer[Any]):
        status = serializers.CharField(
            required=False, allow_blank=True, help_text="Comma-separated statuses."
        )
        project = serializers.SlugField(required=False, allow_blank=True, help_text="Project slug.")
        mine = serializers.BooleanField(required=False, default=False, help_text="Only my own bookings.")

    class InputSerializer(serializers.Serializer[Any]):
        project = serializers.SlugRelatedField(slug_field="slug", queryset=Project.objects.all())
        gpu_type = serializers.SlugRelatedField(slug_field="name", queryset=GpuType.objects.all())
        cluster = serializers.SlugRelatedField(
            slug_field="name", queryset=Cluster.objects.filter(is_active=True), required=False
        )
        gpu_count = serializers.IntegerField(min_value=1, max_value=_MAX_GPUS)
        start_at = serializers.DateTimeField()
        end_at = serializers.DateTimeField()
        note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    OutputSerializer = BookingOutputSerializer

    @extend_schema(
        operation_id="bookings_list",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer(many=True), **errors(400, 401)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        bookings = selectors.booking_list(
            request.user,
            status=csv_values(
                filters.validated_data.get("status"), allowed=Booking.Status.values, name="status"
            ),
            project_slug=filters.validated_data.get("project"),
            mine_only=filters.validated_data["mine"],
        )
        return self.paginate(request, bookings, self.OutputSerializer)

    @extend_schema(
        operation_id="bookings_create",
        request=InputSerializer,
        responses={201: OutputSerializer, **errors(400, 401, 403, 409, 413)},
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        booking = services.booking_create(
            request_user(request), **serializer.validated_data, actor_label=AuditEvent.Actor.API
        )
        return _booking_response(request.user, booking.pk, status.HTTP_201_CREATED)


class BookingDetailApi(APIView):
    OutputSerializer = BookingOutputSerializer

    @extend_schema(operation_id="bookings_retrieve", responses={200: OutputSerializer, **errors(401, 404)})
    def get(self, request: Request, booking_id: int) -> Response:
        return _booking_response(request.user, booking_id)

    @extend_schema(
        operation_id="bookings_destroy",
        description="Cancel the booking (same as POST .../cancel/).",
        responses={200: OutputSerializer, **errors(400, 401, 403, 404)},
    )
    def delete(self, request: Request, booking_id: int) -> Response:
        booking = selectors.booking_get(request.user, booking_id=booking_id)
        services.booking_cancel(booking, user=request_user(request), actor_label=AuditEvent.Actor.API)
        return _booking_response(request.user, booking_id)


class BookingCancelApi(APIView):
    @extend_schema(
        operation_id="bookings_cancel",
        request=None,
        responses={200: BookingOutputSerializer, **errors(400, 401, 403, 404)},
    )
    def post(self, request: Request, booking_id: int) -> Response:
        booking = selectors.booking_get(request.user, booking_id=booking_id)
        services.booking_cancel(booking, user=request_user(request), actor_label=AuditEvent.Actor.API)
        return _booking_response(request.user, booking_id)


class BookingExtendApi(APIView):
    class InputSerializer(serializers.Serializer[Any]):
        end_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="bookings_extend",
        request=InputSerializer,
        responses={200: BookingOutputSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, booking_id: int) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        booking = selectors.booking_get(request.user, booking_id=booking_id)
        services.booking_extend(
            booking,
            user=request_user(request),
            end_at=serializer.validated_data["end_at"],
            actor_label=AuditEvent.Actor.API,
        )
        return _booking_response(request.user, booking_id)


class BookingEndApi(APIView):
    @extend_schema(
        operation_id="bookings_end",
        description="End a running booking now; its GPUs are free again from now on.",
        request=None,
        responses={200: BookingOutputSerializer, **errors(400, 401, 403, 404)},
    )
    def post(self, request: Request, booking_id: int) -> Response:
        booking = selectors.booking_get(request.user, booking_id=booking_id)
        services.booking_end_early(booking, user=request_user(request), actor_label=AuditEvent.Actor.API)
        return _booking_response(request.user, booking_id)
