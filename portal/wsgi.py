import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from portal.chunked import ChunkedBodyMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Chunked request bodies are read (or refused with a JSON 411/413/400), never seen as empty.
application = ChunkedBodyMiddleware(get_wsgi_application())
# Import every view module now (gunicorn --preload shares it across workers), so the first
# request a worker serves does not pay for importing the API, pages and their libraries.
get_resolver().url_patterns  # noqa: B018
