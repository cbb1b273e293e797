"""Batch jobs: list, submit, retrieve, cancel."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts.models import Project
from scheduling import alternatives, selectors, services
from scheduling.api.common import PaginatedApi, SlugRelatedField, csv_values, errors, request_user
from scheduling.api.idempotency import idempotent
from scheduling.backends.base import BackendError
from scheduling.models import AuditEvent, Cluster, GpuType, Job

_PRIORITY_BY_NAME = {p.label.lower(): p.value for p in Job.Priority}
_PRIORITY_NAME = {v: k for k, v in _PRIORITY_BY_NAME.items()}


class PayloadSerializer(serializers.Serializer[Any]):
    """What the backend runs; give a command or a script (and optionally a container image)."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not (attrs.get("command") or "").strip() and not (attrs.get("script") or "").strip():
            raise serializers.ValidationError({"command": ["Give a command or a script to run."]})
        return attrs

    command = serializers.CharField(max_length=4000, required=False, allow_blank=True)
    script = serializers.CharField(max_length=64_000, required=False, allow_blank=True)
    image = serializers.CharField(max_length=500, required=False, allow_blank=True)
    env = serializers.DictField(
        child=serializers.CharField(max_length=4000, allow_blank=True), required=False, default=dict
    )


class JobOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    user = serializers.CharField(source="user.username")
    project = serializers.CharField(source="project.slug")
    cluster = serializers.CharField(source="cluster.name")
    kind = serializers.ChoiceField(choices=Job.Kind.choices)
    gpu_count = serializers.IntegerField()
    gpu_type = serializers.CharField(source="gpu_type.name", allow_null=True, default=None)
    min_memory_gib = serializers.FloatField()
    precisions = serializers.ListField(child=serializers.CharField())
    requested_s = serializers.IntegerField(allow_null=True)
    predicted_p50_s = serializers.FloatField(allow_null=True)
    predicted_p90_s = serializers.FloatField(allow_null=True)
    is_preemptible = serializers.BooleanField()
    is_checkpointable = serializers.BooleanField()
    checkpoint_interval_s = serializers.IntegerField(allow_null=True)
    priority = serializers.SerializerMethodField()
    status = serializers.ChoiceField(choices=Job.Status.choices)
    submitted_at = serializers.DateTimeField(help_text="When it was (re)queued last.")
    first_submitted_at = serializers.DateTimeField(
        allow_null=True, help_text="When the user submitted it (kept across requeues after a preemption)."
    )
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    attempt = serializers.IntegerField()
    pending_reason = serializers.ChoiceField(choices=Job.PendingReason.choices)
    pending_sentence = serializers.CharField()
    eta_p50_at = serializers.DateTimeField(allow_null=True)
    eta_p90_at = serializers.DateTimeField(allow_null=True)
    status_message = serializers.CharField()
    payload = PayloadSerializer()

    def get_priority(self, job: Job) -> str:
        return _PRIORITY_NAME.get(job.priority, "normal")


def _job_response(user: Any, job_id: int, code: int = status.HTTP_200_OK) -> Response:
    return Response(JobOutputSerializer(selectors.job_get(user, job_id=job_id)).data, status=code)


class JobListCreateApi(PaginatedApi):
    class FilterSerializer(serializers.Serializer[Any]):
        status = serializers.CharField(
            required=False, allow_blank=True, help_text="Comma-separated statuses."
        )
        project = serializers.SlugField(required=False, allow_blank=True, help_text="Project slug.")
        mine = serializers.BooleanField(required=False, default=False, help_text="Only my own jobs.")

    class InputSerializer(serializers.Serializer[Any]):
        name = serializers.CharField(max_length=200)
        project = SlugRelatedField(slug_field="slug", queryset=Project.objects.all())
        cluster = SlugRelatedField(
            slug_field="name", queryset=Cluster.objects.filter(is_active=True), required=False
        )
        gpu_type = SlugRelatedField(
            slug_field="name", queryset=GpuType.objects.all(), required=False, allow_null=True
        )
        kind = serializers.ChoiceField(choices=Job.Kind.choices, default=Job.Kind.BATCH)
        gpu_count = serializers.IntegerField(min_value=1, max_value=4096)
        min_memory_gib = serializers.FloatField(min_value=0, max_value=100_000, default=0.0)
        precisions = serializers.ListField(
            child=serializers.CharField(max_length=16), max_length=16, required=False, default=list
        )
        requested_s = serializers.IntegerField(
            min_value=1, max_value=2**31 - 1, required=False, allow_null=True
        )
        is_preemptible = serializers.BooleanField(default=False)
        is_checkpointable = serializers.BooleanField(default=False)
        checkpoint_interval_s = serializers.IntegerField(
            min_value=1, max_value=2**31 - 1, required=False, allow_null=True
        )
        priority = serializers.ChoiceField(choices=sorted(_PRIORITY_BY_NAME), default="normal")
        payload = PayloadSerializer(
            help_text="What to run: a command or a script (required, as in the form)."
        )

    OutputSerializer = JobOutputSerializer

    class CreatedSerializer(JobOutputSerializer):
        warnings = serializers.ListField(
            child=serializers.CharField(),
            help_text="Why the job, though accepted, cannot start under today's inventory and "
            "quotas, and what would unblock it; empty when it can start.",
        )

    @extend_schema(
        operation_id="jobs_list",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer(many=True), **errors(400, 401)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        jobs = selectors.job_list(
            request.user,
            status=csv_values(filters.validated_data.get("status"), allowed=Job.Status.values, name="status"),
            project_slug=filters.validated_data.get("project"),
            mine_only=filters.validated_data["mine"],
        )
        return self.paginate(request, jobs, self.OutputSerializer)

    @extend_schema(
        operation_id="jobs_create",
        request=InputSerializer,
        responses={201: CreatedSerializer, **errors(400, 401, 403, 413)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        data["priority"] = _PRIORITY_BY_NAME[data["priority"]]
        job = services.job_submit(request_user(request), **data, actor_label=AuditEvent.Actor.API)
        job = selectors.job_get(request.user, job_id=job.pk)
        body = {**JobOutputSerializer(job).data, "warnings": alternatives.job_warnings(job)}
        return Response(body, status=status.HTTP_201_CREATED)


def _job_cancel(request: Request, job_id: int) -> Response:
    """Cancel a job the user can see (DELETE and POST .../cancel/ alike); answer the job after it."""
    job = selectors.job_get(request.user, job_id=job_id)
    services.job_cancel(job, user=request_user(request), actor_label=AuditEvent.Actor.API)
    return _job_response(request.user, job_id)


class JobDetailApi(APIView):
    @extend_schema(operation_id="jobs_retrieve", responses={200: JobOutputSerializer, **errors(401, 404)})
    def get(self, request: Request, job_id: int) -> Response:
        return _job_response(request.user, job_id)

    @extend_schema(
        operation_id="jobs_destroy",
        description="Cancel the job (same as POST .../cancel/).",
        responses={200: JobOutputSerializer, **errors(400, 401, 403, 404)},
    )
    @idempotent
    def delete(self, request: Request, job_id: int) -> Response:
        return _job_cancel(request, job_id)


class JobCancelApi(APIView):
    @extend_schema(
        operation_id="jobs_cancel",
        request=None,
        responses={200: JobOutputSerializer, **errors(400, 401, 403, 404)},
    )
    @idempotent
    def post(self, request: Request, job_id: int) -> Response:
        return _job_cancel(request, job_id)


class JobLogsApi(APIView):
    class FilterSerializer(serializers.Serializer[Any]):
        tail = serializers.IntegerField(
            min_value=1,
            max_value=selectors.JOB_OUTPUT_MAX_LINES,
            default=200,
            help_text="Lines from the end.",
        )

    class OutputSerializer(serializers.Serializer[Any]):
        job = serializers.IntegerField()
        status = serializers.ChoiceField(choices=Job.Status.choices)
        exit_code = serializers.IntegerField(allow_null=True)
        stdout = serializers.CharField(allow_blank=True)
        stderr = serializers.CharField(allow_blank=True)
        # A field named like Field.source: DRF takes it from the declared fields, mypy cannot tell.
        source = serializers.CharField(allow_blank=True, help_text="Where the text came from.")  # type: ignore[assignment]
        is_truncated = serializers.BooleanField(help_text="Older lines were cut.")

    @extend_schema(
        operation_id="jobs_logs",
        description=(
            "The tail of the job's output (stdout/stderr) and its exit code, read from the cluster: "
            "the owner's only. 503 with Retry-After while the cluster cannot be reached."
        ),
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **errors(400, 401, 404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        try:
            job, out = selectors.job_output_get(
                request_user(request), job_id=job_id, tail_lines=filters.validated_data["tail"]
            )
        except BackendError as exc:
            return Response(
                {"message": f"The cluster cannot be reached right now: {exc}", "fields": {}},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
                headers={"Retry-After": "30"},
            )
        return Response(
            {
                "job": job.pk,
                "status": job.status,
                "exit_code": out.exit_code,
                "stdout": out.stdout,
                "stderr": out.stderr,
                "source": out.source,
                "is_truncated": out.is_truncated,
            }
        )
