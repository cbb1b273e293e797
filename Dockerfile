# One image for web (gunicorn), Celery worker and Celery beat; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=portal.settings \
    STATIC_ROOT=/app/staticfiles \
    PORT=8000

WORKDIR /app

# The pinned tree first, so that code changes do not reinstall it. psycopg[binary] bundles libpq
# and the Prophet wheel bundles CmdStan, so no compiler or system library is needed.
COPY requirements.lock ./
RUN pip install -r requirements.lock

COPY . .
RUN pip install --no-deps -e . \
 && DJANGO_SECRET_KEY=collectstatic-only-build-step-not-a-runtime-secret python manage.py collectstatic --noinput -v 0 \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin berth \
 && chown -R berth /app/staticfiles

USER berth
EXPOSE 8000

# A TCP check: an HTTP one would trip over ALLOWED_HOSTS and the HTTPS redirect of production.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
  CMD python -c "import os, socket; socket.create_connection(('127.0.0.1', int(os.environ['PORT'])), timeout=4).close()" || exit 1

CMD ["sh", "-c", "exec gunicorn portal.wsgi:application --preload --bind 0.0.0.0:${PORT} --workers ${WEB_CONCURRENCY:-3} --forwarded-allow-ips=${FORWARDED_ALLOW_IPS:-127.0.0.1} --access-logfile - --error-logfile -"]
