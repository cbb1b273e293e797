"""What every page shares: the typed htmx request, full page or partial rendering, swapped-in status codes."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

# Status codes whose htmx responses are swapped in (base.html sets htmx's responseHandling).
UNPROCESSABLE = 422
CONFLICT = 409


class HtmxHttpRequest(HttpRequest):
    """A signed-in request that went through django-htmx's middleware (typed, as django-htmx
    suggests); every view here is behind ``login_required``, so ``user`` is a real user."""

    htmx: HtmxDetails
    user: User


def _render(
    request: HtmxHttpRequest, template: str, partial: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """The whole page, or only ``partial`` of it for an htmx request.

    A history-restore request (htmx lost its cached copy of a pushed URL) gets the whole page:
    htmx swaps it in as the body.
    """
    is_fragment = bool(request.htmx) and not request.htmx.history_restore_request
    name = f"{template}#{partial}" if is_fragment else template
    return render(request, name, context, status=status)
