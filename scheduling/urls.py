"""Browser pages and log in / log out (mounted at "" by portal/urls.py; WhiteNoise serves static files)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from portal.accounts.views import BerthLoginView, BerthLogoutView
from scheduling import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.dashboard, name="home"),
    path("bookings/new/", views.booking_new, name="booking-new"),
    path("bookings/availability/", views.booking_availability, name="booking-availability"),
    path("availability/", views.availability_timeline, name="availability"),
    path("availability/export.csv", views.availability_csv, name="availability-csv"),
    path("bookings/", views.my_bookings, name="my-bookings"),
    path("bookings/<int:booking_id>/", views.booking_detail, name="booking-detail"),
    path("bookings/<int:booking_id>/cancel/", views.booking_cancel_view, name="booking-cancel"),
    path("bookings/<int:booking_id>/end/", views.booking_end_view, name="booking-end"),
    path("bookings/<int:booking_id>/extend/", views.booking_extend_view, name="booking-extend"),
    path("jobs/", views.my_jobs, name="my-jobs"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/new/prediction/", views.job_prediction, name="job-prediction"),
    path("account/tokens/", views.api_tokens, name="api-tokens"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel_view, name="job-cancel"),
    path("login/", BerthLoginView.as_view(), name="login"),
    path("logout/", BerthLogoutView.as_view(), name="logout"),
]
