"""Bookings: list, create, retrieve, cancel, extend, end early."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.security import refused_booking_record, refused_bookings_retry_after
from scheduling import queries, selectors, services
from scheduling.api.common import (
    AwareDateTimeField,
    JsonNegotiation,
    PaginatedApi,
    csv_values,
    drf_datetime,
    errors,
    request_user,
    short,
    validate,
)
from scheduling.api.idempotency import delegates_idempotent, idempotent
from scheduling.models import Allocation, AuditEvent, Booking

_MAX_GPUS = 4096  # an absurd count is a field error before it reaches the database


class BookingGpuSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    node = serializers.CharField(source="node.name")
    index = serializers.IntegerField()


class BookingOutputSerializer(serializers.Serializer[Any]):
    """The schema of a booking; ``booking_data`` renders it (same output, without DRF fields)."""

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
    gpu_ids = serializers.ListField(child=serializers.IntegerField())
    gpus = BookingGpuSerializer(many=True, help_text="Where to connect: the held GPUs and their nodes.")
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)

    def to_representation(self, instance: Booking) -> dict[str, Any]:
        return booking_data(instance)


def _held_gpus(booking: Booking) -> list[tuple[int, str, int]]:
    """(gpu id, node name, index) of the GPUs the booking holds, by GPU id."""
    held = getattr(booking, "held_gpus", None)  # set by services.booking_create
    if held is not None:
        return list(held)
    allocations = getattr(booking, "held_allocations", None)  # prefetched by the selector
    if allocations is None:
        allocations = list(booking.allocations.exclude(state="released").select_related("gpu__node"))
    return sorted((a.gpu_id, a.gpu.node.name, a.gpu.index) for a in allocations)


def booking_data(booking: Booking, *, names: tuple[str, str, str, str] | None = None) -> dict[str, Any]:
    """A booking as the API shows it (``BookingOutputSerializer``'s schema), built by hand:
    DRF's field-by-field serialization was most of the CPU of a booking list.

    ``names``: its user's username, project slug, cluster name and GPU type name when the caller
    has them (the create path: the rows it resolved), instead of reading the relations."""
    username, project, cluster, gpu_type = names or (
        booking.user.username,
        booking.project.slug,
        booking.cluster.name,
        booking.gpu_type.name,
    )
    return _render(
        {
            "id": booking.pk,
            "user__username": username,
            "project__slug": project,
            "cluster__name": cluster,
            "gpu_type__name": gpu_type,
            "gpu_count": booking.gpu_count,
            "start_at": booking.start_at,
            "end_at": booking.end_at,
            "status": booking.status,
            "note": booking.note,
            "created_at": booking.created_at,
            "ended_at": booking.ended_at,
        },
        _held_gpus(booking),
    )


# What a list page reads per booking: plain values, no model instances (building ~8 of them
# per booking, with its user, project, cluster, type and GPUs, was most of a page's CPU).
_LIST_VALUES = (
    "id",
    "user__username",
    "project__slug",
    "cluster__name",
    "gpu_type__name",
    "gpu_count",
    "start_at",
    "end_at",
    "status",
    "note",
    "created_at",
    "ended_at",
)


def _render(row: dict[str, Any], held: list[tuple[int, str, int]]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "user": row["user__username"],
        "project": row["project__slug"],
        "cluster": row["cluster__name"],
        "gpu_type": row["gpu_type__name"],
        "gpu_count": row["gpu_count"],
        "start_at": drf_datetime(row["start_at"]),
        "end_at": drf_datetime(row["end_at"]),
        "status": str(row["status"]),
        "note": str(row["note"]),
        "gpu_ids": [g for g, _, _ in held],
        "gpus": [{"id": g, "node": node, "index": index} for g, node, index in held],
        "created_at": drf_datetime(row["created_at"]),
        "ended_at": drf_datetime(row["ended_at"]),
    }


def _held_by_booking(booking_ids: list[int]) -> dict[int, list[tuple[int, str, int]]]:
    """(gpu id, node name, index) of the GPUs each booking holds, by GPU id, in one query."""
    held: dict[int, list[tuple[int, str, int]]] = {b: [] for b in booking_ids}
    rows = (
        Allocation.objects.filter(booking_id__in=booking_ids)
        .exclude(state=Allocation.State.RELEASED)
        .order_by("gpu_id")
        .values_list("booking_id", "gpu_id", "gpu__node__name", "gpu__index")
    )
    for booking_id, gpu_id, node, index in rows:
        held[booking_id].append((gpu_id, node, index))
    return held


def _booking_response(user: Any, booking_id: int, code: int = status.HTTP_200_OK) -> Response:
    booking = selectors.booking_get(user, booking_id=booking_id)
    return Response(booking_data(booking), status=code)


def _resolve_refs(data: dict[str, Any]) -> dict[str, Any]:
    """Replace the project, GPU type and cluster names in ``data`` by their rows, in one query
    (`scheduling.queries.booking_refs_get`).

    Unknown names (and inactive clusters) are 400s with the messages DRF's slug fields give.
    The rows are what the service reads of each (`queries.ProjectRef` and its kin); no model
    instance is built from them.
    """
    refs = queries.booking_refs_get(
        project_slug=data["project"], gpu_type_name=data["gpu_type"], cluster_name=data.get("cluster")
    )
    found: dict[str, tuple[Any, str]] = {
        "project": (refs.project, "slug"),
        "gpu_type": (refs.gpu_type, "name"),
        "cluster": (refs.cluster, "name"),
    }
    errors: dict[str, list[str]] = {}
    out = dict(data)
    for field, (row, key) in found.items():
        if field not in data:
            continue
        if row is None:
            errors[field] = [f"Object with {key}={short(data[field])} does not exist."]
            continue
        out[field] = row
    if errors:
        raise serializers.ValidationError(errors)
    return out


class BookingListCreateApi(PaginatedApi):
    content_negotiation_class = JsonNegotiation

    class FilterSerializer(serializers.Serializer[Any]):
        status = serializers.CharField(
            required=False, allow_blank=True, help_text="Comma-separated statuses."
        )
        project = serializers.SlugField(required=False, allow_blank=True, help_text="Project slug.")
        mine = serializers.BooleanField(required=False, default=False, help_text="Only my own bookings.")

    class InputSerializer(serializers.Serializer[Any]):
        # Names, resolved to rows by ``_resolve_refs`` in one query (three slug fields cost three).
        project = serializers.CharField(trim_whitespace=False, help_text="Project slug.")
        gpu_type = serializers.CharField(trim_whitespace=False, help_text="GPU type name.")
        cluster = serializers.CharField(
            trim_whitespace=False, required=False, help_text="Active cluster name (default: any)."
        )
        gpu_count = serializers.IntegerField(min_value=1, max_value=_MAX_GPUS)
        start_at = AwareDateTimeField()
        end_at = AwareDateTimeField()
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
        paginator = self.pagination_class()
        page: list[dict[str, Any]] | None = paginator.paginate_queryset(
            bookings.prefetch_related(None).values(*_LIST_VALUES), request, view=self
        )
        held = _held_by_booking([row["id"] for row in page or []])
        return paginator.get_paginated_response([_render(row, held[row["id"]]) for row in page or []])

    @extend_schema(
        operation_id="bookings_create",
        request=InputSerializer,
        responses={201: OutputSerializer, **errors(400, 401, 403, 409, 413)},
    )
    @delegates_idempotent
    def post(self, request: Request) -> Response:
        user = request_user(request)
        wait_s = refused_bookings_retry_after(user.pk)
        if wait_s is not None:
            raise exceptions.Throttled(
                wait=wait_s, detail="Too many refused bookings; look at availability, then retry later."
            )
        try:
            return self._create(request)
        except services.BookingConflictError:
            # Outside the write's transaction (an idempotent write rolls back on the 409).
            refused_booking_record(user.pk)
            raise

    @idempotent
    def _create(self, request: Request) -> Response:
        data = _resolve_refs(validate(self.InputSerializer, request.data))
        user = request_user(request)
        booking = services.booking_create(user, **data, actor_label=AuditEvent.Actor.API)
        # No read back: the names come from the rows resolved above (the cluster, when none was
        # named, is the active cluster instance the service placed the booking on), the GPUs
        # from the service.
        cluster = data.get("cluster") or booking.cluster
        names = (user.username, data["project"].slug, cluster.name, data["gpu_type"].name)
        return Response(booking_data(booking, names=names), status=status.HTTP_201_CREATED)


def _booking_act(request: Request, booking_id: int, action: Callable[..., Booking]) -> Response:
    """Run one booking service (cancel, end early) on a booking the user can see; answer the booking."""
    booking = selectors.booking_get(request.user, booking_id=booking_id)
    action(booking, user=request_user(request), actor_label=AuditEvent.Actor.API)
    return _booking_response(request.user, booking_id)


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
    @idempotent
    def delete(self, request: Request, booking_id: int) -> Response:
        return _booking_act(request, booking_id, services.booking_cancel)


class BookingCancelApi(APIView):
    @extend_schema(
        operation_id="bookings_cancel",
        request=None,
        responses={200: BookingOutputSerializer, **errors(400, 401, 403, 404)},
    )
    @idempotent
    def post(self, request: Request, booking_id: int) -> Response:
        return _booking_act(request, booking_id, services.booking_cancel)


class BookingExtendApi(APIView):
    class InputSerializer(serializers.Serializer[Any]):
        end_at = AwareDateTimeField()

    @extend_schema(
        operation_id="bookings_extend",
        request=InputSerializer,
        responses={200: BookingOutputSerializer, **errors(400, 401, 403, 404, 409)},
    )
    @idempotent
    def post(self, request: Request, booking_id: int) -> Response:
        booking = selectors.booking_get(request.user, booking_id=booking_id)
        # A booking that cannot be extended at all says so before its new end is asked for.
        services.booking_require_extendable(booking)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
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
    @idempotent
    def post(self, request: Request, booking_id: int) -> Response:
        return _booking_act(request, booking_id, services.booking_end_early)


class BookingAccessApi(APIView):
    class OutputSerializer(serializers.Serializer[Any]):
        booking = serializers.IntegerField()
        status = serializers.ChoiceField(choices=Booking.Status.choices)
        backend = serializers.CharField()
        summary = serializers.CharField()
        commands = serializers.ListField(child=serializers.CharField(), help_text="Ready to paste.")
        template = serializers.CharField(allow_blank=True, help_text="A file to apply (Kubernetes pod).")
        reservation = serializers.CharField(allow_blank=True)
        namespace = serializers.CharField(allow_blank=True)
        nodes = serializers.DictField(child=serializers.ListField(child=serializers.IntegerField()))

    @extend_schema(
        operation_id="bookings_access",
        description="How to get on the booking's GPUs on its cluster's backend (srun line, pod template).",
        responses={200: OutputSerializer, **errors(401, 404)},
    )
    def get(self, request: Request, booking_id: int) -> Response:
        from scheduling.access import booking_access

        booking = selectors.booking_get(request.user, booking_id=booking_id)
        return Response(
            {"booking": booking.pk, "status": booking.status, **booking_access(booking).as_dict()}
        )
