"""Run the test OpenID Connect provider: migrate, create the spec's users and client, serve.

``python -m tests.oidc_provider.serve PORT`` with the environment of ``settings.py``.  Prints
``ready`` once it listens (the fixture waits for the discovery document instead).
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    port = int(sys.argv[1])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.oidc_provider.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.core.servers.basehttp import WSGIServer, run
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.models import Application

    from tests.oidc_provider.validator import spec

    call_command("migrate", verbosity=0, interactive=False)
    data = spec()
    for username, entry in data["users"].items():
        user = User.objects.create_user(username, email=entry.get("email", ""), password=entry["password"])
        user.save()
    # Berth, then the other applications registered at the same provider (their ID tokens name
    # them in "aud": the audience tests hand one of those to Berth).
    for client in [data["client"], *data.get("other_clients", [])]:
        Application.objects.create(
            name=client.get("name", "Berth"),
            client_id=client["client_id"],
            client_secret=client["client_secret"],
            client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            redirect_uris=" ".join(client["redirect_uris"]),
            post_logout_redirect_uris=" ".join(client.get("post_logout_redirect_uris", [])),
            algorithm=Application.RS256_ALGORITHM,
            skip_authorization=False,
        )
    print("ready", flush=True)
    run("127.0.0.1", port, get_wsgi_application(), ipv6=False, threading=True, server_cls=WSGIServer)


if __name__ == "__main__":
    main()
