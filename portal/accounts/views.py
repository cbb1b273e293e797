"""Log in and log out with Django's own auth views, on Berth's templates."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm

from portal.security import LOCKED_OUT_MESSAGE, client_ip, is_locked_out


class LoginForm(AuthenticationForm):
    """Django's login form that says so when the account is locked out from this address
    (instead of "wrong password", which sends the user on guessing)."""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        was_locked = (
            bool(username) and self.request is not None and is_locked_out(username, client_ip(self.request))
        )
        try:
            return super().clean()
        except forms.ValidationError:
            if was_locked:
                raise forms.ValidationError(LOCKED_OUT_MESSAGE, code="locked_out") from None
            raise


class BerthLoginView(auth_views.LoginView):
    """The login page; a signed-in visitor goes straight on to where they were going."""

    template_name = "registration/login.html"
    authentication_form = LoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        # Outside production the demo lab may be loaded; point at where its logins are printed.
        context["show_demo_hint"] = not getattr(settings, "IS_PRODUCTION", False)
        return context


class BerthLogoutView(auth_views.LogoutView):
    """Log out (POST only, as in Django 5) and return to the login page."""
