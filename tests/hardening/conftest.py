"""Fixtures for the hardening suite."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver
from django.views.static import serve


@pytest.fixture
def static_from_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run with DEBUG off, where static files come from STATIC_ROOT (collectstatic's output,
    which may not exist in a checkout): serve them from static/ instead."""
    stack = list(get_resolver().url_patterns)
    while stack:
        pattern = stack.pop()
        if isinstance(pattern, URLResolver):
            stack.extend(pattern.url_patterns)
        elif isinstance(pattern, URLPattern) and pattern.callback is serve:
            monkeypatch.setitem(pattern.default_args, "document_root", str(settings.STATICFILES_DIRS[0]))
