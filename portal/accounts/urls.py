"""Single sign-on addresses; 404 while ``BERTH_OIDC_CLIENT_ID`` is unset.

Register ``https://<berth>/oidc/callback/`` as the client's redirect URI at the provider and
``https://<berth>/login/`` as its post-logout redirect URI.
"""

from django.urls import path

from portal.accounts.views import OidcCallbackView, OidcLoginView

urlpatterns = [
    path("oidc/login/", OidcLoginView.as_view(), name="oidc_login"),
    path("oidc/callback/", OidcCallbackView.as_view(), name="oidc_authentication_callback"),
]
