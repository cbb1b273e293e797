"""Browser pages (server-rendered, htmx): dashboard, book a GPU window, availability, my bookings,
my jobs, submit a job, API tokens.

Each view renders its full page, or only the named partial of that page when htmx asks
(``page.html#name``; the DOM id is the partial's name), and varies its cache on
``HX-Request``.  Views parse input, call one selector or service and render: every write
goes through ``scheduling.services``; bad input comes back as form errors, never a 500.

One module per page group (``book``, ``availability``, ``bookings``, ``jobs``, ``account``); the
helpers every page shares (these, the staff and the notification pages) are ``portal.htmx``.
``scheduling/urls.py`` names the views through this package.
"""

from scheduling.views.account import api_tokens, dashboard
from scheduling.views.availability import availability_csv, availability_timeline
from scheduling.views.book import booking_availability, booking_new
from scheduling.views.bookings import (
    booking_cancel_view,
    booking_detail,
    booking_end_view,
    booking_extend_view,
    my_bookings,
)
from scheduling.views.jobs import job_cancel_view, job_detail, job_new, job_prediction, my_jobs

__all__ = [
    "api_tokens",
    "availability_csv",
    "availability_timeline",
    "booking_availability",
    "booking_cancel_view",
    "booking_detail",
    "booking_end_view",
    "booking_extend_view",
    "booking_new",
    "dashboard",
    "job_cancel_view",
    "job_detail",
    "job_new",
    "job_prediction",
    "my_bookings",
    "my_jobs",
]
