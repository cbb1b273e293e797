"""The Celery app shared by the worker and beat; configuration comes from Django settings."""

import os

from celery import Celery

from portal import broker

broker.install()  # a Redis outage must not kill the worker (portal/broker.py)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("berth")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
