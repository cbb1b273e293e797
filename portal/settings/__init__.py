"""Berth settings: every value comes from the environment (django-environ), in this one place.

``DJANGO_ENV`` is ``development`` (default; a local secret key is allowed) or ``production``
(``DJANGO_SECRET_KEY`` and ``DATABASE_URL`` are required).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import environ
from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

DJANGO_ENV = env.str("DJANGO_ENV", default="development")
IS_PRODUCTION = DJANGO_ENV == "production"

if IS_PRODUCTION:
    SECRET_KEY = env.str("DJANGO_SECRET_KEY")
    DATABASES = {"default": env.db("DATABASE_URL")}
    # A placeholder copied from an example file is no secret: refuse to start (check --deploy
    # only warns, and nobody runs it on every start).
    if len(SECRET_KEY) < 32 or SECRET_KEY.lower().startswith(("change-me", "changeme", "django-insecure")):
        raise environ.ImproperlyConfigured(
            "DJANGO_SECRET_KEY is a placeholder or shorter than 32 characters; set a long random value."
        )
else:
    SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="dev-only-insecure-key-not-for-production")
    DATABASES = {"default": env.db("DATABASE_URL", default="postgres://berth:berth@127.0.0.1:55433/berth")}
DATABASES["default"]["ENGINE"] = "django.db.backends.postgresql"
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Separate test database names let several test runs share one server.
DATABASES["default"]["TEST"] = {"NAME": env.str("BERTH_TEST_DB", default="test_berth")}

DEBUG = env.bool("DJANGO_DEBUG", default=not IS_PRODUCTION)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from static/, not a CDN
    "django_htmx",
    "template_partials",
    "django_celery_beat",
    "django_prometheus",
    "portal.accounts",
    "scheduling",
    "forecasting",
    "notifications",
    "ops",  # the staff pages, above scheduling and forecasting
    "axes",  # sign-in lockout (portal.security)
]

MIDDLEWARE = [
    # Outermost: a database outage is a 503 (JSON under /api/, a maintenance page elsewhere) in
    # every settings mode, and every API error is JSON (portal.outage).
    "portal.outage.OutageMiddleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "portal.security.LoginRateLimitMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "portal.security.SecurityHeadersMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "scheduling.middleware.AvailabilityStampMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # Last: django-axes marks a locked-out request; portal.security.login_lockout_response answers it.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.demo_clock",
            ],
        },
    }
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / ".run" / "staticfiles")
# WhiteNoise serves static files from the web process (a proxy or CDN in front caches them).
# Outside production it reads them from static/ and the apps directly, so tests and the demo
# need no collectstatic; production serves the collected files (the Dockerfile collects them).
WHITENOISE_USE_FINDERS = not IS_PRODUCTION
WHITENOISE_AUTOREFRESH = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# The debug page and error mails never show credentials carried in URLs (REDIS_URL, ...).
DEFAULT_EXCEPTION_REPORTER_FILTER = "portal.outage.ExceptionReporterFilter"
# Retry-After of the 503 answered while PostgreSQL is unreachable.
BERTH_OUTAGE_RETRY_AFTER_S = env.int("BERTH_OUTAGE_RETRY_AFTER_S", default=10)

DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=256 * 1024)
# API JSON bodies nest at most this deep (400 beyond; 2 KB of "[" was a RecursionError).
BERTH_JSON_MAX_DEPTH = env.int("BERTH_JSON_MAX_DEPTH", default=32)
# An API write's Idempotency-Key and its stored answer are kept this long (docs/api.md).
BERTH_IDEMPOTENCY_TTL_S = env.int("BERTH_IDEMPOTENCY_TTL_S", default=24 * 3600)
# Pending jobs one user, and one project, may have at once (400 beyond; 0: no limit).
BERTH_MAX_PENDING_JOBS_PER_USER = env.int("BERTH_MAX_PENDING_JOBS_PER_USER", default=200)
BERTH_MAX_PENDING_JOBS_PER_PROJECT = env.int("BERTH_MAX_PENDING_JOBS_PER_PROJECT", default=1_000)
# Refused bookings (409, each costing an alternatives search) one user may make per window,
# on top of the write throttle that counts them like any write (429 beyond).
BERTH_REFUSED_BOOKING_RATE = env.str("BERTH_REFUSED_BOOKING_RATE", default="30/min")

# ---- booking and job limits (scheduling.services) ----
# A booking may start this far in the past (clock skew, slow forms) and no further.
BERTH_BOOKING_PAST_TOLERANCE_S = env.int("BERTH_BOOKING_PAST_TOLERANCE_S", default=5 * 60)
BERTH_BOOKING_MAX_ADVANCE_S = env.int("BERTH_BOOKING_MAX_ADVANCE_S", default=90 * 86_400)
BERTH_BOOKING_MIN_DURATION_S = env.int("BERTH_BOOKING_MIN_DURATION_S", default=5 * 60)
BERTH_BOOKING_MAX_DURATION_S = env.int("BERTH_BOOKING_MAX_DURATION_S", default=7 * 86_400)
BERTH_JOB_MAX_REQUESTED_S = env.int("BERTH_JOB_MAX_REQUESTED_S", default=30 * 86_400)
# How far ahead a refused booking looks for the nearest free alternative windows.
BERTH_ALTERNATIVES_HORIZON_S = env.int("BERTH_ALTERNATIVES_HORIZON_S", default=14 * 86_400)
# ... reading at most this many allocations (the earliest first): a refused booking costs bounded work.
BERTH_ALTERNATIVES_MAX_ROWS = env.int("BERTH_ALTERNATIVES_MAX_ROWS", default=4_000)
# Availability queries: smallest step and most steps in one answer.
BERTH_AVAILABILITY_MIN_STEP_S = env.int("BERTH_AVAILABILITY_MIN_STEP_S", default=5 * 60)
BERTH_AVAILABILITY_MAX_STEPS = env.int("BERTH_AVAILABILITY_MAX_STEPS", default=2_000)
# Each web process caches availability answers until a write changes allocations, GPUs, nodes
# or clusters (at once, see scheduling.selectors) and at most this long (0: no cache), which
# bounds how long a write made outside Django (psql, another program) can go unseen.
BERTH_AVAILABILITY_CACHE_S = env.float("BERTH_AVAILABILITY_CACHE_S", default=10.0)

# Where the real public traces live (read-only); the project ships small samples of its own.
TRACES_DIR = env.path("BERTH_TRACES_DIR", default=BASE_DIR.parent / "shared" / "traces")

# ---- security (production values; check --deploy must pass; see docs/security.md) ----
SESSION_COOKIE_SECURE = IS_PRODUCTION
CSRF_COOKIE_SECURE = IS_PRODUCTION
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env.int("DJANGO_SESSION_COOKIE_AGE", default=14 * 86_400)
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=IS_PRODUCTION)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31_536_000 if IS_PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = IS_PRODUCTION
SECURE_HSTS_PRELOAD = IS_PRODUCTION
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if IS_PRODUCTION else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (django-csp's middleware); scripts only from 'self'.
# BERTH_CSP overrides the whole policy in the header's own notation ("directive value ...; ...").
BERTH_CSP = env.str("BERTH_CSP", default="") or (
    "default-src 'self'; script-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self'; connect-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)


def _csp_directives(policy: str) -> dict[str, list[str]]:
    """``"default-src 'self'; img-src 'self' data:"`` -> django-csp's ``DIRECTIVES`` mapping."""
    directives: dict[str, list[str]] = {}
    for part in policy.split(";"):
        name, *values = part.split()
        if part.strip():
            directives[name.lower()] = values
    return directives


CONTENT_SECURITY_POLICY = {"DIRECTIVES": _csp_directives(BERTH_CSP)}
# /metrics: staff sessions, "Authorization: Bearer <BERTH_METRICS_TOKEN>", or direct (not
# proxied) requests from these networks (loopback by default; none in production).
BERTH_METRICS_TOKEN = env.str("BERTH_METRICS_TOKEN", default="")
BERTH_METRICS_ALLOWED_IPS = env.list(
    "BERTH_METRICS_ALLOWED_IPS", default=[] if IS_PRODUCTION else ["127.0.0.0/8", "::1/128"]
)
# Sign-in: form POSTs per client address, and the lockout of one username from one address.
BERTH_LOGIN_PATH = "/login/"
BERTH_LOGIN_RATE = env.str("BERTH_LOGIN_RATE", default="30/min")
BERTH_LOGIN_LOCKOUT_ATTEMPTS = env.int("BERTH_LOGIN_LOCKOUT_ATTEMPTS", default=5)
BERTH_LOGIN_LOCKOUT_S = env.int("BERTH_LOGIN_LOCKOUT_S", default=15 * 60)
# ModelBackend behind django-axes' lockout check (portal.security.LockoutBackend).
AUTHENTICATION_BACKENDS = ["portal.security.LockoutBackend"]
# django-axes: one count per username and client address, in PostgreSQL (its database handler);
# the limit and the lock's length are read from the two settings above at each attempt.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = "portal.security.login_failure_limit"
AXES_COOLOFF_TIME = "portal.security.login_cool_off"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "portal.security.login_lockout_response"
AXES_CLIENT_IP_CALLABLE = "portal.security.login_client_ip"  # REMOTE_ADDR only (see client_ip)
AXES_DISABLE_ACCESS_LOG = True  # successful sign-ins are not logged per attempt (the audit log has lockouts)
AXES_VERBOSE = False
# Rate limits and lockouts must be shared by all web processes: Redis in production.
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": env.str(
                "BERTH_CACHE_URL", default=env.str("REDIS_URL", default="redis://127.0.0.1:56379/0")
            ),
            "KEY_PREFIX": "berth",
            # An unreachable or hung Redis must cost a request at most this, not a worker timeout:
            # the counters then move to PostgreSQL (portal.security).
            "OPTIONS": {
                "socket_connect_timeout": env.float("BERTH_CACHE_TIMEOUT_S", default=0.5),
                "socket_timeout": env.float("BERTH_CACHE_TIMEOUT_S", default=0.5),
            },
        }
        if IS_PRODUCTION or env.str("BERTH_CACHE_URL", default="")
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# ---- single sign-on: OpenID Connect (portal.accounts.oidc; docs/sso.md) ----
# Off unless BERTH_OIDC_CLIENT_ID is set; local accounts keep working beside it.  The provider's
# endpoints come from BERTH_OIDC_ISSUER's discovery document unless each is set below.
BERTH_OIDC_CLIENT_ID = env.str("BERTH_OIDC_CLIENT_ID", default="")
BERTH_OIDC_CLIENT_SECRET = env.str("BERTH_OIDC_CLIENT_SECRET", default="")
BERTH_OIDC_PROVIDER_NAME = env.str("BERTH_OIDC_PROVIDER_NAME", default="single sign-on")
BERTH_OIDC_ISSUER = env.str("BERTH_OIDC_ISSUER", default="")
BERTH_OIDC_AUTHORIZATION_ENDPOINT = env.str("BERTH_OIDC_AUTHORIZATION_ENDPOINT", default="")
BERTH_OIDC_TOKEN_ENDPOINT = env.str("BERTH_OIDC_TOKEN_ENDPOINT", default="")
BERTH_OIDC_USERINFO_ENDPOINT = env.str("BERTH_OIDC_USERINFO_ENDPOINT", default="")
BERTH_OIDC_JWKS_URI = env.str("BERTH_OIDC_JWKS_URI", default="")
BERTH_OIDC_END_SESSION_ENDPOINT = env.str("BERTH_OIDC_END_SESSION_ENDPOINT", default="")
BERTH_OIDC_SCOPES = env.str("BERTH_OIDC_SCOPES", default="openid email profile")
BERTH_OIDC_SIGN_ALGO = env.str("BERTH_OIDC_SIGN_ALGO", default="RS256")
# Claims: the Berth username, and the list of groups mapped to project memberships.
BERTH_OIDC_USERNAME_CLAIM = env.str("BERTH_OIDC_USERNAME_CLAIM", default="preferred_username")
BERTH_OIDC_GROUPS_CLAIM = env.str("BERTH_OIDC_GROUPS_CLAIM", default="groups")
# "GROUP=SLUG[:manager]" entries separated by ";", and/or groups named like project slugs.
BERTH_OIDC_PROJECT_MAP = env.str("BERTH_OIDC_PROJECT_MAP", default="")
BERTH_OIDC_GROUPS_ARE_PROJECT_SLUGS = env.bool("BERTH_OIDC_GROUPS_ARE_PROJECT_SLUGS", default=False)
# Create a Berth user at a first sign-in; link a first sign-in to an existing (non-staff)
# account with the same "username" or verified "email", or to "none".
BERTH_OIDC_CREATE_USERS = env.bool("BERTH_OIDC_CREATE_USERS", default=True)
BERTH_OIDC_LINK_EXISTING = env.str("BERTH_OIDC_LINK_EXISTING", default="none")
BERTH_OIDC_TIMEOUT_S = env.float("BERTH_OIDC_TIMEOUT_S", default=5.0)
BERTH_OIDC_DISCOVERY_CACHE_S = env.int("BERTH_OIDC_DISCOVERY_CACHE_S", default=3600)
BERTH_OIDC_VERIFY_TLS = env.bool("BERTH_OIDC_VERIFY_TLS", default=True)
# How far the provider's clock may be from ours when the ID token's iat / nbf / exp are checked.
BERTH_OIDC_CLOCK_SKEW_S = env.int("BERTH_OIDC_CLOCK_SKEW_S", default=60)
if IS_PRODUCTION and BERTH_OIDC_CLIENT_ID:
    _oidc_secret = BERTH_OIDC_CLIENT_SECRET
    if len(_oidc_secret) < 16 or _oidc_secret.lower().startswith(("change-me", "changeme", "secret", "xxx")):
        raise environ.ImproperlyConfigured(
            "BERTH_OIDC_CLIENT_SECRET is a placeholder or shorter than 16 characters; "
            "set the secret the identity provider issued for this client."
        )
    _oidc_urls = [BERTH_OIDC_ISSUER, BERTH_OIDC_AUTHORIZATION_ENDPOINT, BERTH_OIDC_TOKEN_ENDPOINT]
    if not BERTH_OIDC_ISSUER and not all(_oidc_urls[1:]):
        raise environ.ImproperlyConfigured(
            "BERTH_OIDC_CLIENT_ID is set: set BERTH_OIDC_ISSUER (discovery) or the provider's endpoints."
        )
    if any(url and not url.startswith("https://") for url in _oidc_urls) or not BERTH_OIDC_VERIFY_TLS:
        raise environ.ImproperlyConfigured("Single sign-on in production talks to its provider over https.")
# The OpenID Connect backend answers only the sign-in callback (portal.accounts.oidc), after
# the lockout backend that checks passwords.
AUTHENTICATION_BACKENDS = [*AUTHENTICATION_BACKENDS, "portal.accounts.oidc.OidcBackend"]
# ---- end of single sign-on ----

# ---- REST framework ----
# API tokens: each web process caches token -> user this long (0: off).  A revoked token or a
# deactivated user is refused at once by the process that made the change and within this
# bound by the others (portal.accounts.authentication).
BERTH_API_TOKEN_CACHE_S = env.float("BERTH_API_TOKEN_CACHE_S", default=5.0)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.accounts.authentication.CachedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "scheduling.api.schema.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "scheduling.api.pagination.CursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "portal.api.exception_handler",
    # Password-for-token exchanges per client address (POST /api/v1/auth/token/).
    # Unsafe methods per user (portal.security.WriteRateThrottle): generous, so bench.api's
    # clients are not throttled; lower it where scripts misbehave.
    "DEFAULT_THROTTLE_CLASSES": ["portal.security.WriteRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "auth-token": env.str("BERTH_TOKEN_THROTTLE_RATE", default="20/min"),
        "api-write": env.str("BERTH_API_WRITE_THROTTLE_RATE", default="3000/min"),
    },
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's JSON parser plus the DATA_UPLOAD_MAX_MEMORY_SIZE limit (413), which DRF skips.
    "DEFAULT_PARSER_CLASSES": ["portal.api.JSONParser"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Berth API",
    "DESCRIPTION": "Book interactive GPU windows and submit batch jobs.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI and Redoc assets from the drf-spectacular-sidecar package (no CDN at run time).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "MembershipRoleEnum": "portal.accounts.models.Membership.Role",
        "BookingStatusEnum": "scheduling.models.Booking.Status",
        "JobStatusEnum": "scheduling.models.Job.Status",
        "NotificationEventEnum": "notifications.models.EventKind",
    },
}

# ---- Celery (JSON only, time limits, never eager) ----
# Beat enqueues an engine round for every active cluster this often (scheduling.tasks).
BERTH_ENGINE_ROUND_INTERVAL_S = env.int("BERTH_ENGINE_ROUND_INTERVAL_S", default=15)
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:56379/0")
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=REDIS_URL)
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=300)
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=240)
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A Redis outage pauses the worker and beat; they reconnect by themselves when it is back
# (never give up: Celery's default stops after 100 attempts and exits).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A web request that enqueues a task while the broker is down gives up quickly (the tasks it
# sends are covered by beat or the hourly refresh) instead of waiting out the default retries.
CELERY_BROKER_CONNECTION_TIMEOUT = env.float("CELERY_BROKER_CONNECTION_TIMEOUT_S", default=1.0)
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
# acks_late tasks of a worker that died are redelivered after this (the default is an hour);
# it must exceed the longest task time limit.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT_S", default=600)}
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "engine-rounds": {
        "task": "scheduling.tasks.engine_rounds_dispatch",
        "schedule": timedelta(seconds=BERTH_ENGINE_ROUND_INTERVAL_S),
        "options": {"expires": max(1, BERTH_ENGINE_ROUND_INTERVAL_S - 1)},
    },
}

# ---- the engine loop (scheduling.rounds, scheduling.tasks, scheduling.metrics) ----
# Policy of clusters whose settings do not name one (Cluster.settings["policy"]).
BERTH_ENGINE_POLICY = env.str("BERTH_ENGINE_POLICY", default="berth")
# Bookings starting within this horizon are part of a round's snapshot.
BERTH_ENGINE_HORIZON_S = env.int("BERTH_ENGINE_HORIZON_S", default=2 * 86_400)
# Redis for the simulator's state, the round triggers and Berth's metrics counters.
BERTH_ENGINE_REDIS_URL = env.str("BERTH_ENGINE_REDIS_URL", default=REDIS_URL)
BERTH_ENGINE_ROUND_SOFT_TIME_LIMIT_S = env.int("BERTH_ENGINE_ROUND_SOFT_TIME_LIMIT_S", default=60)
BERTH_ENGINE_ROUND_TIME_LIMIT_S = env.int("BERTH_ENGINE_ROUND_TIME_LIMIT_S", default=90)
# A change (submit, cancel, booking) asks for a round this long after it; later changes join it.
BERTH_ENGINE_TRIGGER_DEBOUNCE_S = env.float("BERTH_ENGINE_TRIGGER_DEBOUNCE_S", default=1.0)
# At most one dispatched round per cluster is queued; the mark expires after this.
BERTH_ENGINE_QUEUED_TTL_S = env.int("BERTH_ENGINE_QUEUED_TTL_S", default=60)
# Live simulator (Cluster.backend "simulator"): work seconds per wall second, unless the cluster's
# settings say otherwise; e.g. 30 lets a demo audience watch hour-long jobs finish in minutes.
BERTH_SIM_SPEEDUP = env.float("BERTH_SIM_SPEEDUP", default=1.0)

# ---- forecasting (forecasting.services, forecasting.tasks, forecasting.capacity) ----
# The model the portal ships and stores hourly, its horizon and its training window.
BERTH_FORECAST_MODEL = env.str("BERTH_FORECAST_MODEL", default="berth")
BERTH_FORECAST_HORIZON_H = env.int("BERTH_FORECAST_HORIZON_H", default=48)
BERTH_FORECAST_HISTORY_DAYS = env.int("BERTH_FORECAST_HISTORY_DAYS", default=56)
# Rolling daily origins of the nightly backtest (each costs one fit per model).
BERTH_FORECAST_BACKTEST_DAYS = env.int("BERTH_FORECAST_BACKTEST_DAYS", default=7)
BERTH_FORECAST_RETENTION_DAYS = env.int("BERTH_FORECAST_RETENTION_DAYS", default=14)
# JSON event calendar (conference deadlines): [{"name", "start", "end"?, "days_before"?, ...}].
BERTH_FORECAST_EVENTS_FILE = env.str("BERTH_FORECAST_EVENTS_FILE", default="")
BERTH_FORECAST_SOFT_TIME_LIMIT_S = env.int("BERTH_FORECAST_SOFT_TIME_LIMIT_S", default=600)
BERTH_FORECAST_REFIT_SOFT_TIME_LIMIT_S = env.int("BERTH_FORECAST_REFIT_SOFT_TIME_LIMIT_S", default=3600)
# Interactive headroom: ignore forecasts older than this; hold at most this share of a type.
BERTH_HEADROOM_MAX_FORECAST_AGE_H = env.int("BERTH_HEADROOM_MAX_FORECAST_AGE_H", default=6)
BERTH_HEADROOM_MAX_FRACTION = env.float("BERTH_HEADROOM_MAX_FRACTION", default=0.25)
# Runtime predictor: finished jobs it learns from; how long a process reuses it before looking
# for newly finished jobs, and how often it is rebuilt from scratch.
BERTH_RUNTIME_HISTORY_JOBS = env.int("BERTH_RUNTIME_HISTORY_JOBS", default=20_000)
BERTH_RUNTIME_PREDICTOR_TTL_S = env.int("BERTH_RUNTIME_PREDICTOR_TTL_S", default=60)
BERTH_RUNTIME_PREDICTOR_REBUILD_S = env.int("BERTH_RUNTIME_PREDICTOR_REBUILD_S", default=6 * 3600)
# What-ifs (capacity studies, two replays each): the newest jobs one replays, and the task's
# soft time limit (seconds; past it the what-if is marked failed, saying so).
BERTH_CAPACITY_MAX_JOBS = env.int("BERTH_CAPACITY_MAX_JOBS", default=5_000)
BERTH_CAPACITY_TIME_BUDGET_S = env.int("BERTH_CAPACITY_TIME_BUDGET_S", default=900)
# The live demo's load generator (scheduling.demo_load): `make demo` turns it on; off elsewhere.
BERTH_DEMO_LOAD = env.bool("BERTH_DEMO_LOAD", default=False)
BERTH_DEMO_LOAD_TICK_S = env.int("BERTH_DEMO_LOAD_TICK_S", default=60)
BERTH_DEMO_LOAD_SCALE = env.float("BERTH_DEMO_LOAD_SCALE", default=1.0)  # times the history's rate
BERTH_DEMO_LOAD_MAX_PER_TICK = env.int("BERTH_DEMO_LOAD_MAX_PER_TICK", default=5)
BERTH_DEMO_LOAD_MAX_PENDING = env.int("BERTH_DEMO_LOAD_MAX_PENDING", default=200)
if BERTH_DEMO_LOAD:
    CELERY_BEAT_SCHEDULE["demo-load"] = {
        "task": "scheduling.tasks.demo_load_dispatch",
        "schedule": timedelta(seconds=BERTH_DEMO_LOAD_TICK_S),
        "options": {"expires": max(1, BERTH_DEMO_LOAD_TICK_S - 1)},
    }
CELERY_BEAT_SCHEDULE.update(
    {
        "forecast-refresh": {
            "task": "forecasting.tasks.forecast_refresh_dispatch",
            "schedule": crontab(minute=env.int("BERTH_FORECAST_REFRESH_MINUTE", default=2)),
            "options": {"expires": 3000},
        },
        "forecast-refit": {
            "task": "forecasting.tasks.forecast_refit_dispatch",
            "schedule": crontab(hour=env.int("BERTH_FORECAST_REFIT_HOUR", default=2), minute=30),
            "options": {"expires": 6 * 3600},
        },
    }
)

# ---- notifications (notifications.services, notifications.tasks) ----
# Links in mails and webhook bodies point here.
BERTH_PUBLIC_URL = env.str("BERTH_PUBLIC_URL", default="http://127.0.0.1:8000")
# Mail: SMTP in production (EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD,
# EMAIL_USE_TLS / EMAIL_USE_SSL); the console (the worker's log) in development and the demo.
EMAIL_BACKEND = env.str(
    "DJANGO_EMAIL_BACKEND",
    default=(
        "django.core.mail.backends.smtp.EmailBackend"
        if IS_PRODUCTION
        else "django.core.mail.backends.console.EmailBackend"
    ),
)
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=20)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Berth <berth@localhost>")
# A failed delivery is retried after BACKOFF × 2^(attempt-1) s (capped), at most MAX_ATTEMPTS times.
BERTH_NOTIFY_MAX_ATTEMPTS = env.int("BERTH_NOTIFY_MAX_ATTEMPTS", default=6)
BERTH_NOTIFY_BACKOFF_S = env.float("BERTH_NOTIFY_BACKOFF_S", default=30.0)
BERTH_NOTIFY_BACKOFF_MAX_S = env.float("BERTH_NOTIFY_BACKOFF_MAX_S", default=3600.0)
BERTH_WEBHOOK_TIMEOUT_S = env.float("BERTH_WEBHOOK_TIMEOUT_S", default=10.0)
# Whether webhooks may use plain http and point at loopback/private addresses (tests, the demo).
BERTH_WEBHOOK_ALLOW_PRIVATE = env.bool("BERTH_WEBHOOK_ALLOW_PRIVATE", default=not IS_PRODUCTION)
CELERY_BEAT_SCHEDULE["idempotency-keys-clean"] = {
    "task": "scheduling.tasks.idempotency_keys_clean",
    "schedule": timedelta(hours=1),
    "options": {"expires": 3000},
}
CELERY_BEAT_SCHEDULE["notifications-sweep"] = {
    "task": "notifications.tasks.notifications_sweep",
    "schedule": timedelta(seconds=env.int("BERTH_NOTIFY_SWEEP_S", default=60)),
    "options": {"expires": 55},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"cmdstanpy": {"level": "WARNING"}, "prophet": {"level": "WARNING"}},
}
