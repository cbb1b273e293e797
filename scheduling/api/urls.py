"""REST API v1 (mounted at /api/v1/ by portal.urls)."""

from __future__ import annotations

from django.urls import path, re_path

from scheduling.api.accounts import (
    MeApi,
    ProjectDetailApi,
    ProjectListApi,
    TokenCreateApi,
    TokenRevokeApi,
)
from scheduling.api.audit import AuditEventListApi
from scheduling.api.bookings import (
    BookingAccessApi,
    BookingCancelApi,
    BookingDetailApi,
    BookingEndApi,
    BookingExtendApi,
    BookingListCreateApi,
)
from scheduling.api.common import NotFoundApi
from scheduling.api.inventory import AvailabilityApi, ClusterListApi, GpuTypeListApi
from scheduling.api.jobs import JobCancelApi, JobDetailApi, JobListCreateApi, JobLogsApi

app_name = "api"

urlpatterns = [
    path("bookings/", BookingListCreateApi.as_view(), name="booking-list"),
    path("bookings/<int:booking_id>/", BookingDetailApi.as_view(), name="booking-detail"),
    path("bookings/<int:booking_id>/cancel/", BookingCancelApi.as_view(), name="booking-cancel"),
    path("bookings/<int:booking_id>/extend/", BookingExtendApi.as_view(), name="booking-extend"),
    path("bookings/<int:booking_id>/end/", BookingEndApi.as_view(), name="booking-end"),
    path("bookings/<int:booking_id>/access/", BookingAccessApi.as_view(), name="booking-access"),
    path("jobs/", JobListCreateApi.as_view(), name="job-list"),
    path("jobs/<int:job_id>/", JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel/", JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/logs/", JobLogsApi.as_view(), name="job-logs"),
    path("availability/", AvailabilityApi.as_view(), name="availability"),
    path("clusters/", ClusterListApi.as_view(), name="cluster-list"),
    path("gpu-types/", GpuTypeListApi.as_view(), name="gpu-type-list"),
    path("projects/", ProjectListApi.as_view(), name="project-list"),
    path("projects/<slug:slug>/", ProjectDetailApi.as_view(), name="project-detail"),
    path("me/", MeApi.as_view(), name="me"),
    path("me/token/", TokenRevokeApi.as_view(), name="me-token"),
    path("auth/token/", TokenCreateApi.as_view(), name="auth-token"),
    path("audit-events/", AuditEventListApi.as_view(), name="audit-event-list"),
    # Last: any other path under /api/v1/ is a JSON 404, not Django's HTML page.
    # [\s\S], not ".": a path may contain a newline; and no inline flags, which break reverse().
    re_path(r"^[\s\S]*$", NotFoundApi.as_view(), name="not-found"),
]
