"""Claims of the test provider: read from the spec file at every token, so a test can change a
user's groups between two sign-ins by rewriting the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


def spec() -> dict[str, Any]:
    return json.loads(Path(os.environ["OIDC_TEST_SPEC"]).read_text())


class SpecClaimsValidator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        entry = spec()["users"].get(user.username, {})
        claims: dict[str, Any] = {
            "preferred_username": user.username,
            "email": user.email,
            "email_verified": True,
            "name": entry.get("name", user.username),
            "groups": entry.get("groups", []),
        }
        claims.update(entry.get("claims", {}))
        for name in entry.get("omit", []):
            claims.pop(name, None)
        return claims
