"""The dashboard (home page) and the API token page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers
from rest_framework.authtoken.models import Token

from portal.accounts.selectors import membership_list, project_list
from portal.accounts.services import token_create, token_revoke
from portal.htmx import HtmxHttpRequest, render_page
from scheduling.forms import (
    next_quarter_hour,
)
from scheduling.selectors import (
    gpu_type_list,
)
from scheduling.selectors_ui import dashboard_get

DASHBOARD_TEMPLATE = "scheduling/dashboard.html"
TOKENS_TEMPLATE = "scheduling/tokens.html"


@login_required
@vary_on_headers("HX-Request")
@require_GET
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """The user's bookings and jobs with live status; htmx polls the ``dashboard-live`` part."""
    # The memberships are a lazy queryset: read by the full page only, not by the polled part.
    context = {
        "dash": dashboard_get(request.user),
        "now": timezone.now(),
        "memberships": membership_list(request.user),
    }
    return render_page(request, DASHBOARD_TEMPLATE, "dashboard-live", context)


def _tokens_context(request: HtmxHttpRequest, *, new_key: str = "") -> dict[str, Any]:
    token = Token.objects.filter(user=request.user).first()
    api_root = request.build_absolute_uri("/api/v1")
    example_start = timezone.localtime(next_quarter_hour(timezone.now()) + timedelta(hours=1))
    return {
        "token": token,
        "new_key": new_key,
        "api_root": api_root,
        "host_url": request.build_absolute_uri("/").rstrip("/"),
        "project": project_list(request.user).first(),
        "gpu_type": gpu_type_list().filter(nodes__cluster__is_active=True).distinct().first(),
        "example_start": example_start.isoformat(),
        "example_end": (example_start + timedelta(hours=2)).isoformat(),
    }


@login_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def api_tokens(request: HtmxHttpRequest) -> HttpResponse:
    """Whether the user has an API token; POST ``action=create`` issues a new one (shown once),
    ``action=revoke`` deletes it.  Both through ``portal.accounts.services``."""
    if request.method == "GET":
        return render_page(request, TOKENS_TEMPLATE, "token-panel", _tokens_context(request))
    action = request.POST.get("action", "")
    new_key = ""
    if action == "create":
        new_key = token_create(user=request.user, actor_label="user")
        messages.success(request, "A new API token was created; any older token no longer works.")
    elif action == "revoke":
        had = token_revoke(user=request.user, actor_label="user")
        messages.success(request, "Your API token was revoked." if had else "You had no API token.")
    else:
        return HttpResponse("Unknown action.", status=400)
    if new_key:
        # Shown once, on this response only (not through a redirect, which would put it in a URL
        # or the session).
        return render_page(request, TOKENS_TEMPLATE, "token-panel", _tokens_context(request, new_key=new_key))
    if request.htmx:
        return render_page(request, TOKENS_TEMPLATE, "token-panel", _tokens_context(request))
    return HttpResponseRedirect(reverse("api-tokens"), status=303)
