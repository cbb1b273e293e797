"""Log in and log out with Django's own auth views, on Berth's templates."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views


class BerthLoginView(auth_views.LoginView):
    """The login page; a signed-in visitor goes straight on to where they were going."""

    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        # Outside production the demo lab may be loaded; point at where its logins are printed.
        context["show_demo_hint"] = not getattr(settings, "IS_PRODUCTION", False)
        return context


class BerthLogoutView(auth_views.LogoutView):
    """Log out (POST only, as in Django 5) and return to the login page."""
