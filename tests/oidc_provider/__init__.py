"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit in its own process.

``serve.py`` migrates its own SQLite file, creates the users and the client application named
in a JSON spec, and serves on a loopback port; ``settings.py`` configures it from the
environment the test fixture sets (``tests/portal/oidc_fixtures.py``).
"""
