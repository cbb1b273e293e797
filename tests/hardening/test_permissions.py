"""Every URL pattern, every role: the access each gets is written down here, and checked.

``EXPECTED`` has one row per named route (admin routes are checked as a group).  A new route
without a row fails ``test_every_route_has_an_expected_access_row``: whoever adds a page or an
endpoint decides who may use it.  Status codes are for a first-time request by that role
(GET, then POST with an empty body); 302 means a redirect to a login page.

The objects in the URLs belong to a *researcher* of project Vision, and a *manager* of Vision
and *staff* may act on them; ``test_no_cross_user_access`` checks that a user of another
project, and a plain member of the same project, get 404 on every read and write route.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.authtoken.models import Token

from notifications.services import webhook_create
from portal.accounts.models import Membership, Quota
from scheduling import services
from scheduling.models import AuditEvent, Booking, Job
from tests.factories import (
    ClusterFactory,
    GpuTypeFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
    UserFactory,
)
from tests.hardening.conftest import clear_local_cache

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "researcher", "manager", "staff")
# A client address that is not loopback: /metrics must not be open to it.
REMOTE = "192.0.2.10"


def _walk(patterns: list, prefix: str = "", namespace: str = "") -> Iterator[tuple[str, str, str]]:
    for p in patterns:
        if isinstance(p, URLResolver):
            ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
            yield from _walk(p.url_patterns, prefix + str(p.pattern), ns)
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), f"{namespace}{p.name}" if p.name else "", str(p.pattern)


def all_routes() -> list[tuple[str, str]]:
    """(route, name) of every URL pattern outside the admin."""
    return [
        (route, name)
        for route, name, _ in _walk(get_resolver().url_patterns)
        if not route.startswith("admin/")
    ]


def admin_routes() -> list[tuple[str, str]]:
    return [
        (route, name) for route, name, _ in _walk(get_resolver().url_patterns) if route.startswith("admin/")
    ]


@pytest.fixture
def lab(settings):
    """Project Vision (a researcher's booking and job), its manager, staff, and an outsider."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    clear_local_cache()
    a100 = GpuTypeFactory(name="A100")
    cluster = ClusterFactory(name="alpha")
    NodeFactory(cluster=cluster, gpu_type=a100, name="a0", gpu_count=4)
    vision = ProjectFactory(name="Vision", slug="vision")
    other = ProjectFactory(name="Other", slug="other")
    users = {
        "researcher": MembershipFactory(project=vision, role=Membership.Role.MEMBER).user,
        "manager": MembershipFactory(project=vision, role=Membership.Role.MANAGER).user,
        "staff": UserFactory(is_staff=True, is_superuser=True),
        "peer": MembershipFactory(project=vision, role=Membership.Role.MEMBER).user,
        "outsider": MembershipFactory(project=other, role=Membership.Role.MANAGER).user,
    }
    start = (timezone.now() + timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    booking = services.booking_create(
        users["researcher"],
        project=vision,
        gpu_type=a100,
        gpu_count=1,
        start_at=start,
        end_at=start + timedelta(hours=1),
    )
    job = services.job_submit(users["researcher"], project=vision, name="train", gpu_count=1)
    quota = Quota.objects.create(project=vision, gpu_type=a100, guaranteed_gpus=1)
    webhook = webhook_create(owner=users["researcher"], url="https://hooks.example/berth")
    return {"users": users, "booking": booking, "job": job, "quota": quota, "webhook": webhook}


def _client(lab: dict, role: str, *, api: bool) -> Client:
    client = Client(REMOTE_ADDR=REMOTE)
    if role == "anonymous":
        return client
    user = lab["users"][role]
    if api:
        token, _ = Token.objects.get_or_create(user=user)
        client.defaults["HTTP_AUTHORIZATION"] = f"Token {token.key}"
    else:
        client.force_login(user)
    return client


# ---- the expected-access table ----
# name -> (url, {role: "GET/POST"}) with url placeholders {booking} and {job} (fresh objects of
# the researcher for every role).  "-" = the method is not checked for that role.
_A = ("anonymous", "researcher", "manager", "staff")


def _row(url: str, *codes: str) -> tuple[str, dict[str, str]]:
    return url, dict(zip(_A, codes, strict=True))


EXPECTED: dict[str, tuple[str, dict[str, str]]] = {
    # REST API: token auth; 401 without it.  Empty POST bodies are 400/415, never 5xx.
    "api:booking-list": _row("/api/v1/bookings/", "401/401", "200/415", "200/415", "200/415"),
    "api:booking-detail": _row("/api/v1/bookings/{booking}/", "401/401", "200/405", "200/405", "200/405"),
    "api:booking-cancel": _row(
        "/api/v1/bookings/{booking}/cancel/", "401/401", "405/200", "405/200", "405/200"
    ),
    "api:booking-extend": _row(
        "/api/v1/bookings/{booking}/extend/", "401/401", "405/415", "405/415", "405/415"
    ),
    "api:booking-end": _row("/api/v1/bookings/{booking}/end/", "401/401", "405/400", "405/400", "405/400"),
    "api:job-list": _row("/api/v1/jobs/", "401/401", "200/415", "200/415", "200/415"),
    "api:job-detail": _row("/api/v1/jobs/{job}/", "401/401", "200/405", "200/405", "200/405"),
    "api:job-cancel": _row("/api/v1/jobs/{job}/cancel/", "401/401", "405/200", "405/200", "405/200"),
    "api:availability": _row("/api/v1/availability/", "401/401", "400/405", "400/405", "400/405"),
    "api:cluster-list": _row("/api/v1/clusters/", "401/401", "200/405", "200/405", "200/405"),
    "api:gpu-type-list": _row("/api/v1/gpu-types/", "401/401", "200/405", "200/405", "200/405"),
    "api:project-list": _row("/api/v1/projects/", "401/401", "200/405", "200/405", "200/405"),
    "api:project-detail": _row("/api/v1/projects/vision/", "401/401", "200/405", "200/405", "200/405"),
    "api:me": _row("/api/v1/me/", "401/401", "200/405", "200/405", "200/405"),
    "api:me-token": _row("/api/v1/me/token/", "401/401", "405/405", "405/405", "405/405"),
    "api:auth-token": _row("/api/v1/auth/token/", "405/415", "405/415", "405/415", "405/415"),
    "api:audit-event-list": _row("/api/v1/audit-events/", "401/401", "403/403", "403/403", "200/405"),
    "api:not-found": _row("/api/v1/no-such-endpoint/", "404/404", "404/404", "404/404", "404/404"),
    # The schema and its docs are public: they describe the API, they hold no data.
    "schema": _row("/api/schema/", "200/405", "200/405", "200/405", "200/405"),
    "api-docs": _row("/api/docs/", "200/405", "200/405", "200/405", "200/405"),
    # Cluster-wide numbers: staff, the monitoring system's bearer token or direct loopback only.
    "api:booking-access": _row(
        "/api/v1/bookings/{booking}/access/", "401/401", "200/405", "200/405", "200/405"
    ),
    # A job's output is its owner's (and staff's): a manager who sees the job gets a 404.
    "api:job-logs": _row("/api/v1/jobs/{job}/logs/", "401/401", "200/405", "404/405", "200/405"),
    "notifications-api:preferences": _row(
        "/api/v1/notifications/preferences/", "401/401", "200/405", "200/405", "200/405"
    ),
    "notifications-api:webhook-list": _row(
        "/api/v1/notifications/webhooks/", "401/401", "200/415", "200/415", "200/415"
    ),
    "notifications-api:webhook-detail": _row(
        "/api/v1/notifications/webhooks/{webhook}/", "401/401", "200/405", "404/405", "404/405"
    ),
    "notifications-api:webhook-rotate": _row(
        "/api/v1/notifications/webhooks/{webhook}/rotate-secret/", "401/401", "405/200", "405/404", "405/404"
    ),
    "notifications-api:delivery-list": _row(
        "/api/v1/notifications/deliveries/", "401/401", "200/405", "200/405", "200/405"
    ),
    "prometheus-django-metrics": _row("/metrics", "403/403", "403/403", "403/403", "200/200"),
    # Pages: session auth; anonymous visitors go to the login page.
    "home": _row("/", "302/302", "200/405", "200/405", "200/405"),
    "booking-new": _row("/bookings/new/", "302/302", "200/422", "200/422", "200/422"),
    "availability-csv": _row("/availability/export.csv", "302/302", "200/405", "200/405", "200/405"),
    "job-prediction": _row("/jobs/new/prediction/", "302/302", "200/405", "200/405", "200/405"),
    # The signed-in user's own API token (an empty POST names no action: 400).
    "api-tokens": _row("/account/tokens/", "302/302", "200/400", "200/400", "200/400"),
    "booking-availability": _row("/bookings/availability/", "302/302", "200/405", "200/405", "200/405"),
    "availability": _row("/availability/", "302/302", "200/405", "200/405", "200/405"),
    "my-bookings": _row("/bookings/", "302/302", "200/405", "200/405", "200/405"),
    # The pages act on the signed-in user's own objects only (managers and staff use the API).
    "booking-cancel": _row("/bookings/{booking}/cancel/", "302/302", "405/303", "405/404", "405/404"),
    "booking-end": _row("/bookings/{booking}/end/", "302/302", "405/303", "405/404", "405/404"),
    "booking-extend": _row("/bookings/{booking}/extend/", "302/302", "405/303", "405/404", "405/404"),
    "my-jobs": _row("/jobs/", "302/302", "200/405", "200/405", "200/405"),
    "job-new": _row("/jobs/new/", "302/302", "200/422", "200/422", "200/422"),
    "job-cancel": _row("/jobs/{job}/cancel/", "302/302", "405/303", "405/404", "405/404"),
    "booking-detail": _row("/bookings/{booking}/", "302/302", "200/405", "404/405", "404/405"),
    "job-detail": _row("/jobs/{job}/", "302/302", "200/405", "404/405", "404/405"),
    "notification-preferences": _row("/account/notifications/", "302/302", "200/422", "200/422", "200/422"),
    "notification-webhook-create": _row(
        "/account/notifications/webhooks/", "302/302", "405/422", "405/422", "405/422"
    ),
    "notification-webhook-delete": _row(
        "/account/notifications/webhooks/{webhook}/delete/", "302/302", "405/303", "405/404", "405/404"
    ),
    "login": _row("/login/", "200/200", "302/302", "302/302", "302/302"),
    "logout": _row("/logout/", "405/302", "405/302", "405/302", "405/302"),
    # Single sign-on: not configured here, so not there (GET only; tests/portal/test_sso.py).
    "oidc_login": _row("/oidc/login/", "404/405", "404/405", "404/405", "404/405"),
    "oidc_authentication_callback": _row("/oidc/callback/", "404/405", "404/405", "404/405", "404/405"),
    # Ops pages: staff only (403 for signed-in non-staff).
    "ops:home": _row("/ops/", "302/302", "403/403", "403/403", "200/405"),
    "ops:utilization": _row("/ops/utilization/", "302/302", "403/403", "403/403", "200/405"),
    "ops:fairness": _row("/ops/fairness/", "302/302", "403/403", "403/403", "200/405"),
    "ops:idle": _row("/ops/idle/", "302/302", "403/403", "403/403", "200/405"),
    "ops:idle-drill": _row("/ops/idle/drill/", "302/302", "403/403", "403/403", "404/405"),
    "ops:capacity": _row("/ops/capacity/", "302/302", "403/403", "403/403", "200/405"),
    "ops:forecast-refresh": _row(
        "/ops/capacity/forecasts/refresh/", "302/302", "403/403", "403/403", "303/303"
    ),
    "ops:capacity-exceed": _row("/ops/capacity/exceed/", "302/302", "403/403", "403/403", "200/303"),
    # GET (a reloaded or bookmarked what-if URL) is sent to the form on the capacity page (303).
    "ops:whatif-new": _row("/ops/capacity/whatif/", "302/302", "403/403", "403/403", "303/422"),
    "ops:whatif": _row("/ops/capacity/whatif/unknown/", "302/302", "403/403", "403/403", "404/405"),
    "ops:quotas": _row("/ops/quotas/", "302/302", "403/403", "403/403", "200/405"),
    "ops:quota-edit": _row("/ops/quotas/{quota}/", "302/302", "403/403", "403/403", "405/422"),
    "ops:quota-new": _row("/ops/quotas/new/", "302/302", "403/403", "403/403", "405/422"),
    "ops:project-weight": _row("/ops/projects/999999/weight/", "302/302", "403/403", "403/403", "405/404"),
    "ops:policy": _row("/ops/policy/", "302/302", "403/403", "403/403", "200/422"),
    "ops:audit": _row("/ops/audit/", "302/302", "403/403", "403/403", "200/405"),
}


def test_every_route_has_an_expected_access_row():
    names = {name for _, name in all_routes()}
    missing = sorted(names - EXPECTED.keys())
    stale = sorted(EXPECTED.keys() - names)
    assert not missing, f"routes without an access row in EXPECTED: {missing}"
    assert not stale, f"EXPECTED rows for routes that no longer exist: {stale}"


def _fresh_objects(lab: dict) -> dict[str, int]:
    """A new booking and job of the researcher (a write may change or end the previous ones)."""
    from portal.accounts.models import Project
    from scheduling.models import GpuType

    vision = Project.objects.get(slug="vision")
    start = (timezone.now() + timedelta(hours=5)).replace(minute=0, second=0, microsecond=0)
    booking = services.booking_create(
        lab["users"]["researcher"],
        project=vision,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=1,
        start_at=start + timedelta(hours=Booking.objects.count()),
        end_at=start + timedelta(hours=Booking.objects.count() + 1),
    )
    job = services.job_submit(lab["users"]["researcher"], project=vision, name="train", gpu_count=1)
    webhook = webhook_create(owner=lab["users"]["researcher"], url="https://hooks.example/fresh")
    return {"booking": booking.pk, "job": job.pk, "quota": lab["quota"].pk, "webhook": webhook.pk}


@pytest.mark.parametrize("role", ROLES)
def test_access_table(lab, role):
    failures = []
    for name, (template, expected) in EXPECTED.items():
        get_code, post_code = expected[role].split("/")
        is_api = template.startswith("/api/v1/")
        for method, code in (("get", get_code), ("post", post_code)):
            if code == "-":
                continue
            url = template.format(**_fresh_objects(lab)) if "{" in template else template
            client = _client(lab, role, api=is_api)
            response = getattr(client, method)(url)
            if str(response.status_code) != code:
                failures.append(f"{method.upper()} {url} ({name}): {response.status_code}, expected {code}")
            if response.status_code == 302 and role == "anonymous" and name not in {"logout", "login"}:
                assert response["Location"].startswith("/login/"), url
    assert not failures, "\n".join(failures)


# ---- no cross-user reads or writes ----

_OBJECT_ROUTES = [
    ("/api/v1/bookings/{booking}/", True),
    ("/api/v1/bookings/{booking}/cancel/", True),
    ("/api/v1/bookings/{booking}/extend/", True),
    ("/api/v1/bookings/{booking}/end/", True),
    ("/api/v1/jobs/{job}/", True),
    ("/api/v1/jobs/{job}/cancel/", True),
    ("/bookings/{booking}/cancel/", False),
    ("/bookings/{booking}/end/", False),
    ("/bookings/{booking}/extend/", False),
    ("/jobs/{job}/cancel/", False),
    ("/api/v1/bookings/{booking}/access/", True),
    ("/api/v1/jobs/{job}/logs/", True),
    ("/bookings/{booking}/", False),
    ("/jobs/{job}/", False),
    ("/api/v1/notifications/webhooks/{webhook}/", True),
    ("/api/v1/notifications/webhooks/{webhook}/rotate-secret/", True),
    ("/account/notifications/webhooks/{webhook}/delete/", False),
]
_READ_SUFFIXES = ("}/", "/access/", "/logs/")


def test_object_routes_cover_every_route_with_an_object_id():
    # The operations pages' ids (quotas, what-ifs) are staff-only objects, not someone's own:
    # every non-staff role gets 403 there (the access table above checks it).
    with_ids = {route for route, _ in all_routes() if "_id>" in route and not route.startswith("ops/")}
    covered = {url.split("{")[0].lstrip("/") for url, _ in _OBJECT_ROUTES}
    for route in with_ids:
        assert route.split("<")[0] in covered, f"{route} is not in _OBJECT_ROUTES"
    assert len(with_ids) == len(_OBJECT_ROUTES)


@pytest.mark.parametrize("intruder", ["outsider", "peer"])
def test_no_cross_user_access(lab, intruder):
    """A user of another project, and a plain member of the same project, cannot see or change
    the researcher's booking and job: every method on every object route is 404 (or 405 for a
    method the route has for no one), the objects stay as they were, no audit event is theirs."""
    booking, job = lab["booking"], lab["job"]
    before = (Booking.objects.get(pk=booking.pk).status, Job.objects.get(pk=job.pk).status)
    bad = []
    for template, is_api in _OBJECT_ROUTES:
        url = template.format(booking=booking.pk, job=job.pk, webhook=lab["webhook"].pk)
        client = _client(lab, intruder, api=is_api)
        for method in ("get", "post", "put", "patch", "delete"):
            body = '{"end_at": "2099-01-01T00:00:00Z"}' if is_api else ""
            response = client.generic(method.upper(), url, body, content_type="application/json")
            if response.status_code not in (404, 405):
                bad.append(f"{method.upper()} {url}: {response.status_code}")
        # The method each route is for must be a 404, not merely "not allowed".
        main = "GET" if template.endswith(_READ_SUFFIXES) and (is_api or template.count("/") == 3) else "POST"
        body = '{"end_at": "2099-01-01T00:00:00Z"}' if is_api else ""
        assert client.generic(main, url, body, content_type="application/json").status_code == 404, url
    assert not bad, "\n".join(bad)
    after = (Booking.objects.get(pk=booking.pk).status, Job.objects.get(pk=job.pk).status)
    assert after == before
    assert not AuditEvent.objects.filter(actor=lab["users"][intruder]).exists()

    api = _client(lab, intruder, api=True)
    assert booking.pk not in [b["id"] for b in api.get("/api/v1/bookings/").json()["results"]]
    assert job.pk not in [j["id"] for j in api.get("/api/v1/jobs/").json()["results"]]
    page = _client(lab, intruder, api=False)
    assert f"/bookings/{booking.pk}/" not in page.get("/bookings/").content.decode()
    assert f"/jobs/{job.pk}/" not in page.get("/jobs/").content.decode()


def test_outsider_cannot_book_or_submit_in_a_project_they_are_not_in(lab):
    api = _client(lab, "outsider", api=True)
    start = (timezone.now() + timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    booking = {
        "project": "vision",
        "gpu_type": "A100",
        "gpu_count": 1,
        "start_at": start.isoformat(),
        "end_at": (start + timedelta(hours=1)).isoformat(),
    }
    assert api.post("/api/v1/bookings/", booking, content_type="application/json").status_code == 403
    job = {"name": "x", "project": "vision", "gpu_count": 1, "payload": {"command": "true"}}
    assert api.post("/api/v1/jobs/", job, content_type="application/json").status_code == 403
    assert api.get("/api/v1/projects/vision/").status_code == 404
    assert Booking.objects.count() == 1
    assert Job.objects.count() == 1


# ---- admin and /metrics ----


def _admin_url(route: str) -> str:
    import re

    url = "/" + re.sub(r"<(?:\w+:)?\w+>", "1", route)
    return re.sub(r"\(\?P<\w+>[^)]*\)", "scheduling", url).replace("^", "").replace("$", "")


@pytest.mark.parametrize("role", ["anonymous", "researcher", "manager"])
def test_admin_is_closed_to_everyone_but_staff(lab, role):
    client = _client(lab, role, api=False)
    open_routes = {"admin:login", "admin:logout"}
    for route, name in admin_routes():
        if name in open_routes:
            continue
        url = _admin_url(route)
        response = client.get(url)
        assert response.status_code == 302, (url, response.status_code)
        assert response["Location"].startswith("/admin/login/"), url


def test_staff_sees_every_admin_changelist(lab):
    client = _client(lab, "staff", api=False)
    changelists = [name for _, name in admin_routes() if name.endswith("_changelist")]
    assert len(changelists) >= 10
    for name in changelists:
        from django.urls import reverse

        assert client.get(reverse(name)).status_code == 200, name


def test_metrics_for_loopback_and_the_bearer_token_only(lab, settings):
    settings.BERTH_METRICS_TOKEN = "scrape-secret"
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    # Through a proxy the loopback address is the proxy's: not trusted.
    proxied = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert proxied.get("/metrics").status_code == 403
    remote = Client(REMOTE_ADDR=REMOTE)
    assert remote.get("/metrics").status_code == 403
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret").status_code == 200
    settings.BERTH_METRICS_ALLOWED_IPS = []
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
