"""Log in and log out with Django's own auth views, on Berth's templates, and single sign-on.

The OpenID Connect views are mozilla-django-oidc's, on Berth's configuration
(``portal.accounts.oidc``); every way a sign-in through the provider can fail ends on a page
that says what happened (``registration/sso_error.html``), never a 500.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from mozilla_django_oidc import views as oidc_views

from portal.accounts.oidc import (
    OidcError,
    OidcSignInRefusedError,
    end_session_url,
    oidc_setting,
    provider_metadata,
)
from portal.accounts.sso import oidc_config
from portal.security import LOCKED_OUT_MESSAGE, client_ip, is_locked_out


class LoginForm(AuthenticationForm):
    """Django's login form that says so when the account is locked out from this address
    (instead of "wrong password", which sends the user on guessing)."""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        was_locked = (
            isinstance(username, str)
            and bool(username)
            and self.request is not None
            and is_locked_out(username, client_ip(self.request))
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
        config = oidc_config()
        context["sso_enabled"] = config.is_enabled
        context["sso_provider_name"] = config.provider_name
        return context


class BerthLogoutView(auth_views.LogoutView):
    """Log out (POST only, as in Django 5) and return to the login page.

    After a single sign-on, the provider's session ends too (RP-initiated logout): the page
    that follows sends the browser to the provider's end-session endpoint, which returns to
    the login page.  A page, not a redirect: the CSP's ``form-action 'self'`` forbids a form
    POST from being redirected to another origin.
    """

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        provider_logout = end_session_url(request)
        response = super().post(request, *args, **kwargs)
        if provider_logout is None:
            return response
        return render(
            request,
            "registration/sso_logout.html",
            {"provider_logout": provider_logout, "provider_name": oidc_config().provider_name},
        )


def sso_error(request: HttpRequest, error: OidcError) -> HttpResponse:
    """The page for a sign-in through the provider that failed, with the error's status."""
    response = render(
        request,
        "registration/sso_error.html",
        {"title": error.title, "message": error.message, "sso_provider_name": oidc_config().provider_name},
        status=error.status,
    )
    if error.status == 503:
        response["Retry-After"] = "60"
    return response


class OidcLoginView(oidc_views.OIDCAuthenticationRequestView):  # type: ignore[misc]
    """``/oidc/login/``: send the browser to the provider's login page (state, nonce, PKCE)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parent reads the endpoint from the settings here; it comes from discovery instead.
        super(oidc_views.OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        config = oidc_config()
        if not config.is_enabled:
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider_metadata(config)["authorization_endpoint"]
        except OidcError as error:
            return sso_error(request, error)
        self.OIDC_RP_CLIENT_ID = config.client_id
        response: HttpResponse = super().get(request)
        return response


class OidcCallbackView(oidc_views.OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """``/oidc/callback/``: the provider sends the browser back here with a code (or an error)."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        config = oidc_config()
        if not config.is_enabled:
            raise Http404("Single sign-on is not configured.")
        error = request.GET.get("error")
        if error:
            super().get(request)  # forgets the state; logs out a half-signed-in session
            if error in ("access_denied", "consent_required", "interaction_required", "login_required"):
                return sso_error(
                    request,
                    OidcSignInRefusedError(
                        f"{config.provider_name} did not let you sign in to Berth ({error}). "
                        "If you declined, start again and allow Berth to see your profile and groups."
                    ),
                )
            description = request.GET.get("error_description", "")[:200]
            return sso_error(
                request,
                OidcError(f"{config.provider_name} answered with an error: {error} {description}".strip()),
            )
        if "code" not in request.GET or "state" not in request.GET or "oidc_states" not in request.session:
            return sso_error(request, _expired())
        try:
            response: HttpResponse = super().get(request)
        except SuspiciousOperation:
            return sso_error(request, _expired())
        except OidcError as failure:
            return sso_error(request, failure)
        return response

    def login_failure(self) -> HttpResponse:
        return sso_error(self.request, OidcSignInRefusedError("Your account may not sign in to Berth."))


def _expired() -> OidcError:
    return OidcError(
        "This sign-in has expired or was already used (or it was started in another browser). Start again."
    )
