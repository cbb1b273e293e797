"""What every page shares: the typed htmx request, full page or partial rendering, swapped-in status codes."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect
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


def redirect_after_post(request: HtmxHttpRequest, url: str) -> HttpResponse:
    """After a successful form POST: htmx follows ``HX-Redirect``, a plain browser a 303."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url, status=303)


def refusal_text(exc: ValidationError | PermissionDenied) -> str:
    """A service's refusal as one sentence for a row or a message."""
    return " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)


def row_action_redirect(request: HtmxHttpRequest, *, error: str, success: str, to: str) -> HttpResponse:
    """A row action without htmx: the refusal or ``success`` as a message, back to the list ``to``."""
    if error:
        messages.error(request, error)
    else:
        messages.success(request, success)
    return HttpResponseRedirect(reverse(to), status=303)
