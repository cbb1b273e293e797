"""The test OpenID Connect provider as a pytest fixture, and a scripted browser for it.

``oidc_provider`` (session scope) generates an RSA signing key, writes the spec (users, their
groups, the Berth client), starts ``serve.py`` on a free loopback port in its own process with
its own SQLite file, and waits for its discovery document.  ``ProviderBrowser`` plays the
person at the provider's real pages (login form, consent form) over HTTP for the tests that
need no Chromium; the e2e test drives the same pages in Chromium.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "berth-portal"
CLIENT_SECRET = "test-client-secret-" + "s" * 24
# Another application at the same provider (its ID tokens carry aud=OTHER_CLIENT_ID).
OTHER_CLIENT_ID = "other-app"
OTHER_CLIENT_SECRET = "other-client-secret-" + "o" * 24
OTHER_REDIRECT_URI = "http://127.0.0.1/other-app/callback/"
PASSWORD = "provider-pass-1"

USERS: dict[str, dict[str, Any]] = {
    "alice": {"email": "alice@uni.example", "groups": ["lab-vision"], "claims": {"given_name": "Alice"}},
    "bob": {"email": "bob@uni.example", "groups": ["lab-vision", "lab-nlp"]},
    "carol": {"email": "carol@uni.example", "groups": []},
    "dave": {"email": "dave@uni.example", "groups": ["lab-vision"], "omit": ["preferred_username"]},
    "erin": {"email": "erin@uni.example", "groups": ["vision"]},
    "frank": {"email": "frank@uni.example", "groups": []},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Provider:
    url: str
    issuer: str
    spec_path: Path
    spec: dict[str, Any] = field(default_factory=dict)

    def set_groups(self, username: str, groups: list[str]) -> None:
        """Change a user's groups at the provider (read at every token it issues)."""
        self.spec["users"][username]["groups"] = groups
        self.spec_path.write_text(json.dumps(self.spec))

    def berth_settings(self, **overrides: Any) -> dict[str, Any]:
        """The ``BERTH_OIDC_*`` settings that point Berth at this provider."""
        values: dict[str, Any] = {
            "BERTH_OIDC_CLIENT_ID": CLIENT_ID,
            "BERTH_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "BERTH_OIDC_PROVIDER_NAME": "Example University",
            "BERTH_OIDC_ISSUER": self.issuer,
            "BERTH_OIDC_SCOPES": "openid email profile groups",
            "BERTH_OIDC_PROJECT_MAP": "lab-vision=vision;lab-nlp=nlp",
            "BERTH_OIDC_VERIFY_TLS": False,
        }
        values.update(overrides)
        return values


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    folder = tmp_path_factory.mktemp("oidc-provider")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    spec = {
        "users": {name: {**entry, "password": PASSWORD} for name, entry in USERS.items()},
        "client": {
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            # Loopback redirect URIs match any port (RFC 8252), so the live server's port is free.
            "redirect_uris": ["http://testserver/oidc/callback/", "http://127.0.0.1/oidc/callback/"],
            "post_logout_redirect_uris": ["http://testserver/login/", "http://127.0.0.1/login/"],
        },
        "other_clients": [
            {
                "name": "Another application",
                "client_id": OTHER_CLIENT_ID,
                "client_secret": OTHER_CLIENT_SECRET,
                "redirect_uris": [OTHER_REDIRECT_URI],
            }
        ],
    }
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
        "OIDC_TEST_DB": str(folder / "provider.sqlite3"),
        "OIDC_TEST_ISSUER": f"{url}/o",
        "OIDC_TEST_RSA_KEY_FILE": str(folder / "key.pem"),
        "OIDC_TEST_SPEC": str(spec_path),
        "PYTHONPATH": str(ROOT),
    }
    log = (folder / "provider.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider.serve", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the test OIDC provider exited: {(folder / 'provider.log').read_text()}")
            try:
                if requests.get(f"{url}/o/.well-known/openid-configuration", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the test OIDC provider did not start within 120 s")
            time.sleep(0.3)
        yield Provider(url=url, issuer=f"{url}/o", spec_path=spec_path, spec=spec)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


class ProviderBrowser:
    """A person at the provider's real login and consent pages, over plain HTTP (requests)."""

    def __init__(self) -> None:
        self.http = requests.Session()

    def authorize(self, authorize_url: str, *, username: str, allow: bool = True) -> str:
        """Sign in at the provider (if its session has ended) and answer the consent form;
        returns the redirect back to Berth (``http://testserver/oidc/callback/?...``)."""
        page = self.http.get(authorize_url, timeout=10)
        if "/accounts/login/" in page.url:
            page = self.http.post(
                page.url,
                data={
                    "username": username,
                    "password": PASSWORD,
                    "csrfmiddlewaretoken": self.http.cookies["provider_csrftoken"],
                    "next": unescape(dict(_HIDDEN.findall(page.text)).get("next", "")) or _next_of(page.url),
                },
                timeout=10,
            )
        assert 'id="authorizationForm"' in page.text, page.text[:500]
        fields = {name: unescape(value) for name, value in _HIDDEN.findall(page.text)}
        if allow:
            fields["allow"] = "Authorize"
        answer = self.http.post(page.url, data=fields, allow_redirects=False, timeout=10)
        assert answer.status_code == 302, answer.text[:500]
        return answer.headers["Location"]

    def has_provider_session(self, provider: Provider) -> bool:
        """Whether the provider still knows this person (its authorize page skips the login form)."""
        page = self.http.get(f"{provider.url}/o/authorize/?client_id=x", allow_redirects=False, timeout=10)
        return not (page.status_code == 302 and "/accounts/login/" in page.headers.get("Location", ""))


def _next_of(url: str) -> str:
    from urllib.parse import parse_qs

    return parse_qs(urlsplit(url).query).get("next", [""])[0]


def local_path(url: str) -> str:
    """``http://testserver/oidc/callback/?a=b`` -> ``/oidc/callback/?a=b`` (for Django's test client)."""
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path
