"""What every page shares (the researcher pages in `scheduling.views` and the staff pages in
`ops`): the typed htmx request, full page or partial rendering, swapped-in status codes,
redirects after a POST, a service's refusal on a form."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from django import forms
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


def render_page(
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


def service_errors_add(
    form: forms.BaseForm,
    exc: ValidationError,
    *,
    fields: Collection[str] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> None:
    """A service's ``ValidationError`` on ``form``: a keyed message on its field, the rest on the
    form as a whole (never a 500 for a key the form lacks).

    ``fields``: the service keys shown at their field (default: every field of the form);
    ``aliases``: service keys whose field has another name (``requested_s`` -> ``requested_h``).
    """
    if not hasattr(exc, "error_dict"):
        for message in exc.messages:
            form.add_error(None, message)
        return
    shown = form.fields if fields is None else fields
    for key, errors in exc.message_dict.items():
        target = (aliases or {}).get(key, key if key in shown else None)
        for message in errors:
            form.add_error(target, message)


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
