"""Request-level security: /metrics access, login lockout, API write throttle, headers.

- The Content-Security-Policy is django-csp's ``CSPMiddleware`` (policy from ``BERTH_CSP``).
- ``SecurityHeadersMiddleware`` adds Permissions-Policy and ``Cache-Control`` to every
  response that has none, and guards ``/metrics`` (staff session, a bearer token, or a direct
  request from an allowed address; see docs/security.md).
- The sign-in lockout is django-axes (database handler: the counts live in PostgreSQL, so every web
  process sees them and a Redis outage does not touch them): after ``BERTH_LOGIN_LOCKOUT_ATTEMPTS``
  failures of one username from one client address, every sign-in for it from there is refused
  for ``BERTH_LOGIN_LOCKOUT_S`` after the last failure.  ``LockoutBackend`` (axes' check in front
  of Django's ModelBackend) refuses before any password check, hashing anyway; the login form
  and ``POST /api/v1/auth/token/`` (both call ``authenticate()``) share the count and say why;
  the attempt that starts a lockout writes an ``auth.lockout`` audit event; a success clears it.
- ``LoginRateLimitMiddleware`` caps login-form POSTs per client address (the API token
  exchange has its own DRF throttle).
- ``WriteRateThrottle`` caps unsafe API methods per user (``BERTH_API_WRITE_THROTTLE_RATE``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from axes.backends import AxesStandaloneBackend
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import Counter
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework import throttling

if TYPE_CHECKING:
    # Not at run time: DRF's APIView reads DEFAULT_THROTTLE_CLASSES (this module) in its class body.
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)

_PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def client_ip(request: HttpRequest) -> str:
    """The address the request came from, as the web server saw it.

    ``X-Forwarded-For`` is not trusted here (any client can send it); behind a proxy, the proxy
    must pass the real address in ``REMOTE_ADDR`` (gunicorn: ``--forwarded-allow-ips``).
    """
    return str(request.META.get("REMOTE_ADDR") or "unknown")


# ---- headers and /metrics ----


def _metrics_allowed(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    token = settings.BERTH_METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
        return True
    # A forwarded request only looks local: the proxy's address is not the client's.
    if "HTTP_X_FORWARDED_FOR" in request.META:
        return False
    try:
        address = ipaddress.ip_address(client_ip(request))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net) for net in settings.BERTH_METRICS_ALLOWED_IPS)


class SecurityHeadersMiddleware:
    """Permissions-Policy and ``Cache-Control: private, no-store`` (unless set; not on static
    files) on every response; ``/metrics`` only for its allowed callers.

    Place after ``AuthenticationMiddleware`` (the staff check reads ``request.user``).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.static_prefix = "/" + str(settings.STATIC_URL).lstrip("/")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.rstrip("/") == "/metrics" and not _metrics_allowed(request):
            response: HttpResponse = JsonResponse(
                {"message": "Metrics are for staff and the monitoring system.", "fields": {}},
                status=403,
            )
        else:
            response = self.get_response(request)
        # Pages and API answers are personal (tokens, bookings): no browser or proxy may store
        # them unless a view says otherwise.  Static files keep their own caching.
        if "Cache-Control" not in response and not request.path_info.startswith(self.static_prefix):
            response["Cache-Control"] = "private, no-store"
        response.setdefault("Permissions-Policy", _PERMISSIONS_POLICY)
        return response


# ---- counters (rate limits, throttles) ----


def _parse_rate(rate: str) -> tuple[int, int]:
    """``"10/min"`` -> (10, 60); the same notation as DRF's throttle rates."""
    count, _, period = rate.partition("/")
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86_400}[period.strip()[:1]]
    return int(count), seconds


_redis_clients: dict[tuple[int, bool], Any] = {}


def cache_redis(backend: RedisCache, *, write: bool) -> Any:
    """A redis-py client on the default cache's connection pool, made once per process.

    Django's ``RedisCache`` builds a new ``redis.Redis`` object for every operation, which
    costs more CPU than the round trip itself; clients are thread-safe (the pool is shared),
    so one per backend and direction is kept.
    """
    slot = (id(backend), write)
    client = _redis_clients.get(slot)
    if client is None:
        client = _redis_clients.setdefault(slot, backend._cache.get_client(None, write=write))
    return client


# INCR + EXPIRE as one server-side script: one command and one round trip, without the
# pipeline object redis-py builds for two commands (which cost more CPU than the round trip).
_HIT_LUA = "local n = redis.call('INCR', KEYS[1]) redis.call('EXPIRE', KEYS[1], ARGV[1]) return n"
_hit_scripts: dict[int, Any] = {}


# What an unreachable Redis raises (refused, reset, timed out); anything else is a bug and stays loud.
CACHE_DOWN_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)

CACHE_FALLBACKS = Counter(
    "berth_cache_fallback_total",
    "Rate-limit operations answered from PostgreSQL because the cache was unreachable.",
    ["operation"],
)
_last_fallback_warning = [0.0]


def _cache_down(operation: str) -> None:
    """Count a fallback; warn at most once a minute per process (an outage is not a log flood)."""
    CACHE_FALLBACKS.labels(operation=operation).inc()
    now = time.monotonic()
    if now - _last_fallback_warning[0] >= 60:
        _last_fallback_warning[0] = now
        logger.warning(
            "cache unreachable: %s counted in PostgreSQL until it is back", operation, exc_info=True
        )


def _db_hit(key: str, *, window_s: int) -> int:
    """``_hit`` in PostgreSQL: one upsert, the same semantics as the Redis script (INCR, then
    EXPIRE: a key that expired starts again at 1; every hit pushes the expiry out)."""
    from portal.accounts.queries import rate_counter_hit

    return rate_counter_hit(key, window_s=window_s)


def _db_count(key: str) -> int:
    from portal.accounts.models import RateCounter

    row = RateCounter.objects.filter(key=key[:200], expires_at__gt=timezone.now()).values_list(
        "count", flat=True
    )
    return int(row.first() or 0)


def _hit(key: str, *, window_s: int) -> int:
    """Count one event under ``key`` in a fixed window; returns the count so far.

    On Redis: one command (INCR and EXPIRE in a script; Django's own ``incr`` costs two round
    trips, plus the ``add`` before it).  Other caches (local memory in development): add, then incr.
    Redis unreachable: the same count in PostgreSQL (``_db_hit``).
    """
    try:
        return _cache_hit(key, window_s=window_s)
    except CACHE_DOWN_ERRORS:
        _cache_down("hit")
        return _db_hit(key, window_s=window_s)


def _cache_hit(key: str, *, window_s: int) -> int:
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        full_key = backend.make_and_validate_key(key)
        # Django's RedisCache stores ints as plain Redis integers, so cache.get() reads this back.
        client = cache_redis(backend, write=True)
        script = _hit_scripts.get(id(client))
        if script is None:  # redis-py runs it by EVALSHA, loading it again after a server restart
            script = _hit_scripts.setdefault(id(client), client.register_script(_HIT_LUA))
        return int(script(keys=[full_key], args=[window_s]))
    if backend.add(key, 1, timeout=window_s):
        return 1
    try:
        return int(backend.incr(key))
    except ValueError:  # expired between add and incr
        backend.set(key, 1, timeout=window_s)
        return 1


class LoginRateLimitMiddleware:
    """At most ``BERTH_LOGIN_RATE`` login-form POSTs per client address (429 above it)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path_info == settings.BERTH_LOGIN_PATH:
            limit, window_s = _parse_rate(settings.BERTH_LOGIN_RATE)
            bucket = int(time.time() // window_s)
            if _hit(f"berth:login-rate:{client_ip(request)}:{bucket}", window_s=window_s) > limit:
                response = HttpResponse(
                    "Too many sign-in attempts from this address; try again in a minute.",
                    status=429,
                    content_type="text/plain; charset=utf-8",
                )
                response["Retry-After"] = str(window_s)
                return response
        return self.get_response(request)


# ---- sign-in lockout (django-axes) ----


LOCKED_OUT_MESSAGE = (
    "Too many failed sign-ins for this account from this address; sign-in is locked for a while. "
    "Try again later or ask an administrator."
)


def login_client_ip(request: HttpRequest) -> str | None:
    """django-axes' ``AXES_CLIENT_IP_CALLABLE``: `client_ip`, or None when the request has no
    address (a test client, a management command): axes stores addresses in an IP column."""
    ip = client_ip(request)
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return None
    return ip


def login_failure_limit(request: Any = None, credentials: Any = None) -> int:
    """django-axes' ``AXES_FAILURE_LIMIT``: read at each attempt, so a changed setting holds at once."""
    return int(settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS)


def login_cool_off(request: Any = None) -> timedelta:
    """django-axes' ``AXES_COOLOFF_TIME``: a lock lasts this long after the last failure."""
    return timedelta(seconds=settings.BERTH_LOGIN_LOCKOUT_S)


def login_lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any = None
) -> HttpResponse:
    """django-axes' ``AXES_LOCKOUT_CALLABLE``: the login form and the token exchange already
    answer a locked-out attempt themselves (a form error; 403 with `LOCKED_OUT_MESSAGE`), and the
    attempt that reaches the limit is still an ordinary wrong password: keep their response."""
    if original_response is not None:
        return original_response
    return HttpResponse(LOCKED_OUT_MESSAGE, status=403, content_type="text/plain; charset=utf-8")


def _probe_request(username: str, ip: str) -> HttpRequest:
    """A request from ``ip`` as django-axes reads one (it keys attempts by username and address)."""
    request = HttpRequest()
    request.META["REMOTE_ADDR"] = ip
    request.path_info = settings.BERTH_LOGIN_PATH
    return request


def is_locked_out(username: str, ip: str) -> bool:
    """Whether sign-ins for ``username`` from ``ip`` are refused right now (django-axes)."""
    from axes.handlers.proxy import AxesProxyHandler

    return bool(AxesProxyHandler.is_locked(_probe_request(username, ip), {"username": username}))


def login_failures_clear(*, username: str, ip: str) -> None:
    """Forget the failed sign-ins of ``username`` from ``ip`` (what the cool-off does by itself)."""
    from axes.handlers.proxy import AxesProxyHandler

    request = _probe_request(username, ip)
    AxesProxyHandler.reset_attempts(username=username, ip_address=login_client_ip(request))


def _lockout_audit(*, username: str, ip: str) -> None:
    from django.contrib.auth import get_user_model

    from scheduling.models import AuditEvent

    user = get_user_model().objects.filter(username=username).first()
    logger.warning("sign-in locked out: username=%r ip=%s", username[:150], ip)
    AuditEvent.objects.create(
        actor=None,
        actor_label=AuditEvent.Actor.USER,
        verb="auth.lockout",
        entity_type="user",
        entity_id=user.pk if user is not None else 0,
        before=None,
        after={
            "username": username[:150],
            "ip": ip,
            "attempts": settings.BERTH_LOGIN_LOCKOUT_ATTEMPTS,
            "lockout_s": settings.BERTH_LOGIN_LOCKOUT_S,
        },
        at=timezone.now(),
    )


@receiver(user_locked_out)
def _audit_lockout(sender: Any, request: Any, username: str | None, ip_address: str, **kwargs: Any) -> None:
    # django-axes signals every failure at or over the limit: the one that reaches it starts the lock.
    failures = getattr(request, "axes_failures_since_start", None)
    if username and failures == login_failure_limit():
        _lockout_audit(username=username, ip=ip_address)


class LockoutBackend(AxesStandaloneBackend, ModelBackend):  # type: ignore[misc]  # axes ships no types
    """Django's ModelBackend behind django-axes' check: a locked-out username and address is
    refused before any password check (``PermissionDenied`` stops ``authenticate()``: a correct
    password does not help); otherwise the password is checked as usual."""

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if request is None:  # no address to key a lock by (a management command, a test helper)
            return ModelBackend.authenticate(self, request, username=username, password=password, **kwargs)
        try:
            AxesStandaloneBackend.authenticate(self, request, username=username, password=password, **kwargs)
        except PermissionDenied:
            # Hash the password anyway: a refusal that answers in 8 ms against 350 ms for a real
            # check would tell a prober which guesses were never checked.
            from django.contrib.auth import get_user_model

            get_user_model()().set_password(password)
            raise PermissionDenied(LOCKED_OUT_MESSAGE) from None
        return ModelBackend.authenticate(self, request, username=username, password=password, **kwargs)


# ---- API write throttle ----


def _parsed_rate(throttle: throttling.SimpleRateThrottle) -> tuple[int | None, int | None]:
    """The ``(num_requests, duration)`` DRF parsed from the throttle's rate in ``__init__``
    (attributes its type stubs do not declare)."""
    num_requests = getattr(throttle, "num_requests", None)
    duration = getattr(throttle, "duration", None)
    return (
        int(num_requests) if num_requests is not None else None,
        int(duration) if duration is not None else None,
    )


class WriteRateThrottle(throttling.UserRateThrottle):
    """Per-user limit on unsafe API methods (reads are not throttled); rate ``api-write``.

    A fixed-window counter (one ``incr`` per write), not DRF's sliding log: DRF stores every
    request time of the window in one cache value and rewrites it on each request, which at
    the generous default rate means thousands of timestamps pickled to Redis per write.
    """

    scope = "api-write"

    def allow_request(self, request: Request, view: APIView) -> bool:
        if request.method not in _UNSAFE_METHODS or self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        num_requests, duration = _parsed_rate(self)
        if key is None or num_requests is None or duration is None:
            return True
        now = time.time()
        window = int(now // duration)
        self._retry_after = (window + 1) * duration - now
        return _hit(f"{key}:{window}", window_s=duration) <= num_requests

    def wait(self) -> float | None:
        return getattr(self, "_retry_after", None)


# ---- refused bookings ----
# A refused booking (409) costs an alternatives search, several times an accepted one: besides
# the write throttle (which counts it like any write), a user gets BERTH_REFUSED_BOOKING_RATE
# refusals per window; beyond it, booking requests are answered 429 before any search.


def _refusal_key(user_id: int) -> tuple[str, int, float]:
    _, window_s = _parse_rate(settings.BERTH_REFUSED_BOOKING_RATE)
    now = time.time()
    window = int(now // window_s)
    return f"berth:refused-booking:{user_id}:{window}", window_s, (window + 1) * window_s - now


def refused_bookings_retry_after(user_id: int) -> float | None:
    """Seconds until ``user_id`` may try a booking again, or ``None`` while under the refusal limit."""
    limit, _ = _parse_rate(settings.BERTH_REFUSED_BOOKING_RATE)
    key, _, retry_after = _refusal_key(user_id)
    try:
        count = int(cache.get(key, 0))
    except CACHE_DOWN_ERRORS:
        _cache_down("read")
        count = _db_count(key)
    return retry_after if count >= limit else None


def refused_booking_record(user_id: int) -> None:
    """Count one refused booking of ``user_id`` (in PostgreSQL while the cache is down)."""
    key, window_s, _ = _refusal_key(user_id)
    _hit(key, window_s=window_s)


class ScopedRateThrottle(throttling.ScopedRateThrottle):
    """DRF's scoped throttle (its sliding log in the cache) that keeps counting while the cache
    is unreachable: a fixed window in PostgreSQL then, the same limit (``_db_hit``)."""

    def allow_request(self, request: Request, view: APIView) -> bool:
        try:
            return bool(super().allow_request(request, view))
        except CACHE_DOWN_ERRORS:
            _cache_down("hit")
        num_requests, duration = _parsed_rate(self)
        if self.key is None or num_requests is None or duration is None:
            return True
        now = time.time()
        window = int(now // duration)
        self._fallback_wait = (window + 1) * duration - now
        return _db_hit(f"{self.key}:{window}", window_s=duration) <= num_requests

    def wait(self) -> float | None:
        fallback = getattr(self, "_fallback_wait", None)
        return fallback if fallback is not None else super().wait()


# ---- every admin action in the audit log ----
# Django's admin writes a LogEntry for each add, change and delete; each one is mirrored as an
# ``admin.<action>`` AuditEvent (actor = the staff user), so the portal's audit log is complete.
# Bulk deletes ("delete selected") write their LogEntries with bulk_create, which sends no
# signal: the site-wide action is wrapped to record them.

_ADMIN_VERBS = {1: "admin.add", 2: "admin.change", 3: "admin.delete"}


def _admin_audit(
    *, user_id: int | None, model: str, object_id: str, after: dict[str, Any], verb: str
) -> None:
    from scheduling.models import AuditEvent

    AuditEvent.objects.create(
        actor_id=user_id,
        actor_label=AuditEvent.Actor.ADMIN,
        verb=verb,
        entity_type=model[:40],
        entity_id=int(object_id) if str(object_id).isdigit() else 0,
        before=None,
        after={"object_id": str(object_id), **after},
        at=timezone.now(),
    )


def _mirror_log_entry(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if not created or kwargs.get("raw"):
        return
    content_type = instance.content_type
    _admin_audit(
        user_id=instance.user_id,
        model=content_type.model if content_type is not None else "unknown",
        object_id=str(instance.object_id or ""),
        after={"repr": instance.object_repr, "change": instance.get_change_message()},
        verb=_ADMIN_VERBS.get(instance.action_flag, "admin.action"),
    )


def _audited_delete_selected(modeladmin: Any, request: HttpRequest, queryset: Any) -> Any:
    from django.contrib.admin.actions import delete_selected

    objects = [(str(obj.pk), str(obj)[:200]) for obj in queryset] if request.POST.get("post") else []
    response = delete_selected(modeladmin, request, queryset)
    if objects and response is None:  # None: the deletion was confirmed and done
        model = queryset.model._meta.model_name
        for pk, text in objects:
            _admin_audit(
                user_id=request.user.pk, model=model, object_id=pk, after={"repr": text}, verb="admin.delete"
            )
    return response


_audited_delete_selected.short_description = "Delete selected %(verbose_name_plural)s"  # type: ignore[attr-defined]
_audited_delete_selected.allowed_permissions = ("delete",)  # type: ignore[attr-defined]


def admin_audit_connect() -> None:
    """Mirror admin LogEntries into the audit log (called once from AccountsConfig.ready)."""
    from django.contrib import admin
    from django.contrib.admin.models import LogEntry
    from django.db.models.signals import post_save

    post_save.connect(_mirror_log_entry, sender=LogEntry, dispatch_uid="berth-admin-audit")
    admin.site.add_action(_audited_delete_selected, "delete_selected")
