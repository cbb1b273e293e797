"""In real Chromium: single sign-on through a real OpenID Connect provider on loopback.

The provider is django-oauth-toolkit in its own process (``tests/oidc_provider``) with its own
login and consent pages.  The person clicks "Sign in with Example University" on Berth's login
page, signs in on the provider's page, consents, lands on the dashboard as the mapped user with
the mapped project, then logs out, which ends the provider's session too.  Screenshots go to
``artifacts/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from portal.accounts.models import Membership
from portal.accounts.oidc import metadata_forget
from tests.factories import ProjectFactory
from tests.oidc_provider.fixtures import PASSWORD, Provider

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_sign_in_through_the_provider_lands_on_the_dashboard_and_logout_ends_both_sessions(
    live_server: object, page: Page, settings: object, oidc_provider: Provider
) -> None:
    for name, value in oidc_provider.berth_settings().items():
        setattr(settings, name, value)
    metadata_forget()
    ProjectFactory(name="Vision", slug="vision")
    ProjectFactory(name="Language", slug="nlp")
    # 127.0.0.1, not localhost: the provider accepts loopback IP redirect URIs on any port.
    base = str(live_server).rstrip("/").replace("localhost", "127.0.0.1")
    page.set_default_timeout(15_000)
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{base}/login/")
    expect(page.get_by_label("Username")).to_be_visible()  # the local form stays
    page.screenshot(path=str(ARTIFACTS / "e2e-sso-login.png"), full_page=True)
    page.get_by_role("link", name="Sign in with Example University").click()

    # The provider's own login page, then its consent page.
    expect(page.get_by_role("heading", name="Example University identity provider")).to_be_visible()
    assert page.url.startswith(f"{oidc_provider.url}/accounts/login/")
    page.get_by_label("University ID").fill("alice")
    page.get_by_label("Passphrase").fill(PASSWORD)
    page.get_by_role("button", name="Sign in to the university").click()
    expect(page.get_by_role("heading", name="Authorize Berth?")).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "e2e-sso-consent.png"), full_page=True)
    page.get_by_role("button", name="Authorize").click()

    # Back on Berth's dashboard as alice, in the project her group maps to.
    expect(page.get_by_role("heading", name="Dashboard", exact=True)).to_be_visible()
    expect(page).to_have_url(f"{base}/")
    expect(page.locator(".site-user")).to_contain_text("Signed in as alice")
    expect(page.locator("#my-projects")).to_have_text("Your projects: Vision")
    page.screenshot(path=str(ARTIFACTS / "e2e-sso-dashboard.png"), full_page=True)
    alice = User.objects.get(username="alice")
    assert list(Membership.objects.filter(user=alice).values_list("project__slug", "role")) == [
        ("vision", "member")
    ]

    # Log out: Berth's session ends, the provider's end-session endpoint ends its own and
    # returns to Berth's login page.
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(rf"^{re.escape(base)}/login/"))
    expect(page.get_by_role("link", name="Sign in with Example University")).to_be_visible()
    page.goto(f"{base}/")
    expect(page).to_have_url(re.compile(rf"^{re.escape(base)}/login/\?next=/"))

    # Signing in again asks for the provider's password again: its session is gone.
    page.get_by_role("link", name="Sign in with Example University").click()
    expect(page.get_by_label("University ID")).to_be_visible()
    assert page.url.startswith(f"{oidc_provider.url}/accounts/login/")
