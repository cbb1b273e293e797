"""Reference data and availability: GPU types, clusters, free GPUs over time."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling import alternatives, selectors
from scheduling.api.common import JsonNegotiation, errors, validate
from scheduling.models import Cluster, GpuType


def _iso_boundaries(availability: selectors.Availability) -> list[str]:
    """The step boundaries as DRF's DateTimeField renders them (``...Z``), each formatted once
    (a slot's end is the next slot's start) and without a time-zone conversion per value."""
    base = availability.start_at.astimezone(UTC).replace(tzinfo=None)
    step = timedelta(seconds=availability.step_s)
    out = [(base + i * step).isoformat() + "Z" for i in range(len(availability.free))]
    out.append(availability.end_at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z")
    return out


class GpuTypeListApi(APIView):
    class OutputSerializer(serializers.Serializer[Any]):
        name = serializers.CharField()
        memory_gib = serializers.FloatField()
        precisions = serializers.ListField(child=serializers.CharField())
        relative_speed = serializers.FloatField()
        value = serializers.FloatField()

    @extend_schema(operation_id="gpu_types_list", responses={200: OutputSerializer(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer(selectors.gpu_type_list(), many=True).data)


class ClusterCapacitySerializer(serializers.Serializer[Any]):
    gpu_type = serializers.CharField()
    gpu_count = serializers.IntegerField()
    up_gpu_count = serializers.IntegerField()


class AvailabilitySlotSerializer(serializers.Serializer[Any]):
    start_at = serializers.DateTimeField()
    end_at = serializers.DateTimeField()
    free_gpus = serializers.IntegerField()


class ClusterListApi(APIView):
    class OutputSerializer(serializers.Serializer[Any]):
        name = serializers.CharField()
        backend = serializers.ChoiceField(choices=Cluster.Backend.choices)
        is_degraded = serializers.BooleanField()
        status_message = serializers.CharField()
        capacity = ClusterCapacitySerializer(many=True)

    @extend_schema(operation_id="clusters_list", responses={200: OutputSerializer(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        capacity = selectors.cluster_capacity()
        data = [
            {
                "name": c.name,
                "backend": c.backend,
                "is_degraded": c.is_degraded,
                "status_message": c.status_message,
                "capacity": ClusterCapacitySerializer(capacity.get(c.pk, []), many=True).data,
            }
            for c in selectors.cluster_list()
        ]
        return Response(data)


class AvailabilityApi(APIView):
    content_negotiation_class = JsonNegotiation

    class FilterSerializer(serializers.Serializer[Any]):
        gpu_type = serializers.CharField(max_length=40)
        start = serializers.DateTimeField()
        end = serializers.DateTimeField()
        step = serializers.IntegerField(
            min_value=1, max_value=31 * 86_400, default=3600, help_text="Step in seconds."
        )
        cluster = serializers.CharField(max_length=60, required=False)
        project = serializers.SlugField(
            max_length=60,
            required=False,
            help_text="Project slug: also answer how many GPUs its quota lets it book over [start, end).",
        )

    class QuotaSerializer(serializers.Serializer[Any]):
        project = serializers.CharField()
        max_gpus = serializers.IntegerField(
            allow_null=True, help_text="Guaranteed + borrowable; null: no limit."
        )
        booked_peak = serializers.IntegerField(
            help_text="Most GPUs its open bookings hold at once in the window."
        )
        bookable_gpus = serializers.IntegerField(
            allow_null=True, help_text="What the quota leaves it in the window; null: no limit."
        )

    class OutputSerializer(serializers.Serializer[Any]):
        gpu_type = serializers.CharField()
        cluster = serializers.CharField(allow_null=True)
        capacity = serializers.IntegerField()
        step_s = serializers.IntegerField()
        slots = AvailabilitySlotSerializer(many=True)
        quota = serializers.DictField(
            required=False, help_text="With ?project=: its quota room (see QuotaSerializer's fields)."
        )

    @extend_schema(
        operation_id="availability_retrieve",
        description=(
            "Free GPUs of one type per step over [start, end). A GPU counts as free in a step only "
            "if nothing holds it at any instant of the step."
        ),
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **errors(400, 401)},
    )
    def get(self, request: Request) -> Response:
        params = validate(self.FilterSerializer, request.query_params)
        availability = selectors.availability_get(
            gpu_type_name=params["gpu_type"],
            start_at=params["start"],
            end_at=params["end"],
            step_s=params["step"],
            cluster_name=params.get("cluster"),
        )
        # Built by hand rather than through serializers: this endpoint is the hot path.
        bounds = _iso_boundaries(availability)
        body: dict[str, Any] = {
            "gpu_type": availability.gpu_type,
            "cluster": availability.cluster,
            "capacity": availability.capacity,
            "step_s": availability.step_s,
            "slots": [
                {"start_at": bounds[i], "end_at": bounds[i + 1], "free_gpus": free}
                for i, free in enumerate(availability.free)
            ],
        }
        if params.get("project"):
            project = selectors.project_for_member(request.user, slug=params["project"])
            gpu_type = GpuType.objects.get(name=availability.gpu_type)
            quota = alternatives.booking_quota_get(
                project=project, gpu_type=gpu_type, start_at=params["start"], end_at=params["end"]
            )
            body["quota"] = {
                "project": quota.project,
                "max_gpus": quota.max_gpus,
                "booked_peak": quota.booked_peak,
                "bookable_gpus": quota.bookable_gpus,
            }
        return Response(body)
