"""OpenID Connect sign-in on mozilla-django-oidc: provider discovery, the authentication backend,
and the provider's end-session (RP-initiated logout) address.

mozilla-django-oidc does the protocol (state, nonce, PKCE, code exchange, signature check);
this module feeds it the provider's endpoints (from ``BERTH_OIDC_ISSUER``'s discovery document
unless set one by one), checks what it leaves out (``iss``, ``aud``, the userinfo ``sub``),
turns every failure into an ``OidcError`` with a sentence for the person, and hands the
verified claims to ``oidc_user_sign_in`` (users, memberships).  Reads ``BERTH_OIDC_*`` at call
time, so nothing here talks to the provider before someone signs in.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from cachetools import TLRUCache
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError
from django.http import HttpRequest
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from portal.accounts.sso import (
    OidcConfig,
    OidcError,
    OidcProviderUnavailableError,
    OidcSignInRefusedError,
    oidc_config,
)

logger = logging.getLogger(__name__)

_REQUIRED_ENDPOINTS = ("authorization_endpoint", "token_endpoint", "jwks_uri")


def _metadata_expires_at(_url: str, value: tuple[float, dict[str, str]], now: float) -> float:
    return now + value[0]  # the discovery_cache_s in force when the document was read


# discovery URL -> (ttl, metadata); a handful of issuers at most.
_metadata_cache: TLRUCache[str, tuple[float, dict[str, str]]] = TLRUCache(
    maxsize=16, ttu=_metadata_expires_at, timer=lambda: time.monotonic()
)
_metadata_lock = threading.Lock()  # cachetools caches are not thread-safe
SESSION_ID_TOKEN = "oidc_id_token"  # noqa: S105 (a session key, not a secret)


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's settings, derived from ``BERTH_OIDC_*`` (one source of truth)."""
    config = oidc_config()
    values: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": config.client_id,
        "OIDC_RP_CLIENT_SECRET": config.client_secret,
        "OIDC_RP_SCOPES": config.scopes,
        "OIDC_RP_SIGN_ALGO": config.sign_algo,
        "OIDC_RP_IDP_SIGN_KEY": None,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_STORE_ID_TOKEN": True,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_ALLOW_UNSECURED_JWT": False,
        "OIDC_TOKEN_USE_BASIC_AUTH": False,
        "OIDC_TIMEOUT": config.timeout_s,
        "OIDC_VERIFY_SSL": config.verify_tls,
        "OIDC_PROXY": None,
        "OIDC_CREATE_USER": config.create_users,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
    }
    if attr in values:
        return values[attr]
    return import_from_settings(attr, *default)


def metadata_forget() -> None:
    """Drop the cached discovery documents (tests; a provider that moved its endpoints)."""
    with _metadata_lock:
        _metadata_cache.clear()


def provider_metadata(config: OidcConfig | None = None) -> dict[str, str]:
    """The provider's endpoints: the ones set in the settings, the rest from discovery.

    The discovery document is fetched at the first sign-in and kept ``BERTH_OIDC_DISCOVERY_CACHE_S``
    seconds per process.  Raises ``OidcProviderUnavailableError`` when it cannot be had.
    """
    config = config or oidc_config()
    explicit = {name: url for name, url in config.endpoints.items() if url}
    if all(name in explicit for name in _REQUIRED_ENDPOINTS) or not config.issuer:
        needed = _REQUIRED_ENDPOINTS if config.sign_algo.startswith(("RS", "ES")) else _REQUIRED_ENDPOINTS[:2]
        missing = [name for name in needed if name not in explicit]
        if missing:
            raise OidcError(
                f"Single sign-on is misconfigured: no BERTH_OIDC_ISSUER and no {', '.join(missing)}."
            )
        return {"issuer": config.issuer, **explicit}
    url = f"{config.issuer}/.well-known/openid-configuration"
    with _metadata_lock:
        cached = _metadata_cache.get(url)
        if cached is not None:
            return {**cached[1], **explicit}
    try:
        response = requests.get(url, timeout=config.timeout_s, verify=config.verify_tls)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        logger.warning("OIDC discovery failed at %s: %s", url, exc)
        raise OidcProviderUnavailableError(
            f"{config.provider_name} did not answer. Try again in a few minutes, or sign in with "
            "a Berth password if you have one."
        ) from exc
    if not isinstance(document, dict) or any(not document.get(name) for name in _REQUIRED_ENDPOINTS):
        raise OidcProviderUnavailableError(f"{config.provider_name}'s discovery document is incomplete.")
    if str(document.get("issuer", "")).rstrip("/") != config.issuer:
        raise OidcError(
            f"{config.provider_name}'s discovery document names another issuer "
            f"({document.get('issuer')!r}); check BERTH_OIDC_ISSUER."
        )
    metadata = {
        name: str(document[name])
        for name in ("issuer", *_REQUIRED_ENDPOINTS, "userinfo_endpoint", "end_session_endpoint")
        if document.get(name)
    }
    metadata["issuer"] = config.issuer
    with _metadata_lock:
        _metadata_cache[url] = (float(config.discovery_cache_s), metadata)
    return {**metadata, **explicit}


def _unavailable(config: OidcConfig, exc: Exception) -> OidcProviderUnavailableError:
    logger.warning("OIDC provider call failed: %s", exc)
    return OidcProviderUnavailableError(
        f"{config.provider_name} did not answer while signing you in. Try again in a few minutes."
    )


class OidcBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """mozilla-django-oidc's backend on Berth's configuration and user rules.

    Answers only the callback view (which passes ``nonce``); a password sign-in passes through
    it untouched, so the local form keeps its lockout.  Raises ``OidcError`` (not ``None``)
    when a sign-in fails, so the callback page can say why.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parent reads the endpoints here; they are resolved per sign-in instead.
        self.UserModel = get_user_model()

    get_settings = staticmethod(oidc_setting)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or "nonce" not in kwargs or "username" in kwargs:
            return None
        config = oidc_config()
        if not config.is_enabled:
            return None
        self.config = config
        self.metadata = provider_metadata(config)
        self.OIDC_OP_TOKEN_ENDPOINT = self.metadata["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = self.metadata.get("userinfo_endpoint", "")
        self.OIDC_OP_JWKS_ENDPOINT = self.metadata.get("jwks_uri")
        self.OIDC_RP_CLIENT_ID = config.client_id
        self.OIDC_RP_CLIENT_SECRET = config.client_secret
        self.OIDC_RP_SIGN_ALGO = config.sign_algo
        self.OIDC_RP_IDP_SIGN_KEY = None
        try:
            return super().authenticate(request, **kwargs)
        except OidcError:
            raise
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status >= 500 or status == 0:
                raise _unavailable(config, exc) from exc
            logger.warning("OIDC token or userinfo request refused: %s", exc)
            raise OidcError(
                f"{config.provider_name} refused to complete this sign-in (the sign-in code was "
                "used or expired). Start again."
            ) from exc
        except (requests.RequestException, ValueError) as exc:
            raise _unavailable(config, exc) from exc
        except SuspiciousOperation as exc:
            logger.warning("OIDC token verification failed: %s", exc)
            raise OidcError(
                "The sign-in answer from the provider could not be verified. Start again."
            ) from exc
        except IntegrityError as exc:  # two first sign-ins of one person at once
            raise OidcError("Your account was being set up by another sign-in. Start again.") from exc

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        """The parent's check of the signature and of ``iat``/``nbf``/``exp``, with
        ``BERTH_OIDC_CLOCK_SKEW_S`` of leeway: without it a provider whose clock is one second
        ahead issues tokens "not yet valid", and a token outside the leeway raised an uncaught
        PyJWT error (a 500) instead of a page that says what went wrong."""
        try:
            alg = jwt.get_unverified_header(payload).get("alg")
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"Unreadable ID token header: {exc}") from exc
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"The provider algorithm {alg!r} does not match BERTH_OIDC_SIGN_ALGO")
        try:
            decoded: dict[str, Any] = jwt.decode(
                payload,
                key,
                algorithms=[alg],
                options={"verify_aud": False},  # checked in verify_token, against our client id
                leeway=self.config.clock_skew_s,
            )
        except (jwt.ExpiredSignatureError, jwt.ImmatureSignatureError) as exc:
            logger.warning(
                "OIDC ID token outside its validity (%s); now %s, leeway %s s: the provider's or "
                "Berth's clock is off",
                exc,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                self.config.clock_skew_s,
            )
            raise OidcError(
                f"The sign-in answer from {self.config.provider_name} is dated outside Berth's "
                "clock (expired or not yet valid). Start again; if this repeats, the provider's "
                "or Berth's server clock is wrong."
            ) from exc
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"JWS token verification failed: {exc}") from exc
        return decoded

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """The parent checks the signature, expiry and nonce; this adds issuer and audience."""
        if not isinstance(token, str) or not token:
            raise OidcError(
                f"{self.config.provider_name} sent no ID token. Is 'openid' in BERTH_OIDC_SCOPES?"
            )
        payload: dict[str, Any] = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.config.client_id not in audiences:
            raise SuspiciousOperation("ID token issued for another client")
        issuer = self.metadata.get("issuer")
        if issuer and str(payload.get("iss", "")).rstrip("/") != issuer:
            raise SuspiciousOperation("ID token from another issuer")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims, completed by the userinfo endpoint where there is one (Azure
        AD puts groups only in the ID token, others only in userinfo)."""
        claims = {k: v for k, v in payload.items() if k not in ("nonce", "at_hash", "c_hash")}
        if self.OIDC_OP_USER_ENDPOINT and access_token:
            userinfo = super().get_userinfo(access_token, id_token, payload)
            if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
                raise SuspiciousOperation("userinfo answers for another subject")
            claims.update(userinfo)
        return claims

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        from portal.accounts.services import oidc_user_sign_in

        claims = self.get_userinfo(access_token, id_token, payload)
        issuer = self.metadata.get("issuer") or str(payload.get("iss", ""))
        return oidc_user_sign_in(issuer=issuer, claims=claims, config=self.config)


def end_session_url(request: HttpRequest) -> str | None:
    """Where to send a signed-in SSO user after Berth's logout to end the provider's session too.

    ``None`` for a password sign-in, a provider without ``end_session_endpoint`` (Google), or
    a provider that cannot be reached now (Berth's own logout still happens).
    """
    id_token = request.session.get(SESSION_ID_TOKEN)
    config = oidc_config()
    if not id_token or not config.is_enabled:
        return None
    try:
        endpoint = provider_metadata(config).get("end_session_endpoint")
    except OidcError:
        return None
    if not endpoint:
        return None
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": config.client_id,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


__all__ = [
    "SESSION_ID_TOKEN",
    "OidcBackend",
    "OidcError",
    "OidcProviderUnavailableError",
    "OidcSignInRefusedError",
    "end_session_url",
    "metadata_forget",
    "provider_metadata",
]
