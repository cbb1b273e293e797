"""The notification preferences page (htmx): what to be told, webhooks with their secrets, and
the delivery log.  Views parse input, call one service or selector and render."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from notifications import selectors, services
from notifications.forms import PreferenceForm, WebhookForm
from portal.accounts.models import Membership, Project
from portal.htmx import UNPROCESSABLE, HtmxHttpRequest, render_page, service_errors_add

TEMPLATE = "notifications/preferences.html"


def _managed_projects(request: HtmxHttpRequest) -> Any:
    return Project.objects.filter(
        memberships__user=request.user, memberships__role=Membership.Role.MANAGER
    ).order_by("name")


def _context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    pref = services.preference_get(user=request.user)
    context = {
        "form": PreferenceForm(
            initial={
                "is_email_enabled": pref.is_email_enabled,
                "email_events": list(pref.email_events),
                "booking_start_lead_min": pref.booking_start_lead_min,
                "booking_end_lead_min": pref.booking_end_lead_min,
            }
        ),
        "webhook_form": WebhookForm(projects=_managed_projects(request)),
        "webhooks": list(selectors.webhook_list(user=request.user)),
        "deliveries": list(selectors.delivery_list(user=request.user).select_related("webhook")[:50]),
        "new_secret": None,
        "saved": False,
    }
    context.update(extra)
    return context


@login_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def preferences(request: HtmxHttpRequest) -> HttpResponse:
    """Show or save the user's preferences; htmx gets the ``preference-form`` part back."""
    if request.method == "GET":
        if request.htmx and request.GET.get("part") == "deliveries":
            return render_page(request, TEMPLATE, "delivery-log", _context(request))
        return render_page(request, TEMPLATE, "preference-form", _context(request))
    form = PreferenceForm(request.POST)
    if form.is_valid():
        try:
            services.preference_update(user=request.user, **form.cleaned_data)
        except ValidationError as exc:
            service_errors_add(form, exc)
    if not form.is_valid():
        return render_page(
            request, TEMPLATE, "preference-form", _context(request, form=form), status=UNPROCESSABLE
        )
    if not request.htmx:
        messages.success(request, "Notification preferences saved.")
        return HttpResponseRedirect(reverse("notification-preferences"), status=303)
    return render_page(request, TEMPLATE, "preference-form", _context(request, saved=True))


@login_required
@vary_on_headers("HX-Request")
@require_POST
def webhook_create_view(request: HtmxHttpRequest) -> HttpResponse:
    form = WebhookForm(request.POST, projects=_managed_projects(request))
    new_secret = None
    if form.is_valid():
        try:
            hook = services.webhook_create(
                owner=request.user, url=form.cleaned_data["url"], project=form.cleaned_data["project"]
            )
            new_secret = (hook.pk, hook.secret)
        except (ValidationError, PermissionDenied) as exc:
            form.add_error(None, " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc))
    status = 200 if new_secret else UNPROCESSABLE
    return render_page(
        request,
        TEMPLATE,
        "webhooks",
        _context(request, webhook_form=form, new_secret=new_secret),
        status=status,
    )


@login_required
@vary_on_headers("HX-Request")
@require_POST
def webhook_delete_view(request: HtmxHttpRequest, webhook_id: int) -> HttpResponse:
    services.webhook_delete(selectors.webhook_get(user=request.user, webhook_id=webhook_id))
    if not request.htmx:
        return HttpResponseRedirect(reverse("notification-preferences"), status=303)
    return render_page(request, TEMPLATE, "webhooks", _context(request))
