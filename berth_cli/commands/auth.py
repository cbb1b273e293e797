"""``berth login``, ``berth logout``, ``berth whoami``."""

from __future__ import annotations

import click

from berth_cli.app import api, console, json_option, print_json, state
from berth_cli.client import Api
from berth_cli.config import config_path, forget_token, load_settings, save_settings


@click.command()
@click.option("--url", "url", help="Server URL to sign in to (stored for later commands).")
@click.option("--username", "-u", prompt=True, help="Your Berth username.")
@click.option("--password", prompt=True, hide_input=True, help="Prompted for when not given (safer).")
@json_option
def login(url: str | None, username: str, password: str, as_json: bool) -> None:
    """Sign in: exchange username and password for an API token, stored with mode 0600."""
    server = (url or state().settings.url).rstrip("/")
    anonymous = Api(server, None)
    try:
        token = anonymous.post("/auth/token/", {"username": username, "password": password})["token"]
    finally:
        anonymous.close()
    session = Api(server, token)
    try:
        me = session.get("/me/")
    finally:
        session.close()
    path = save_settings(url=server, token=token, username=me["username"])
    if as_json:
        print_json({"url": server, "username": me["username"], "config": str(path)})
        return
    projects = ", ".join(f"{m['project']} ({m['role']})" for m in me.get("memberships", [])) or "none"
    console().print(f"Signed in to {server} as [bold]{me['username']}[/] (projects: {projects}).")
    console().print(f"Token stored in {path} (mode 0600).")


@click.command()
@json_option
def logout(as_json: bool) -> None:
    """Revoke your API token on the server and forget it here."""
    if load_settings().token:
        api().delete("/me/token/")
    had_file = forget_token()
    if as_json:
        print_json({"logged_out": True, "config": str(config_path()) if had_file else None})
    else:
        console().print("Signed out: the token is revoked on the server and removed here.")


@click.command()
@json_option
def whoami(as_json: bool) -> None:
    """Who the stored token (or BERTH_TOKEN) signs you in as, and your projects."""
    me = api().get("/me/")
    if as_json:
        print_json(me)
        return
    out = console()
    out.print(f"{me['username']} on {state().settings.url}{' (staff)' if me.get('is_staff') else ''}")
    for m in me.get("memberships", []):
        out.print(f"  {m['project']:<20} {m['role']:<8} {m['project_name']}")


def register(cli: click.Group) -> None:
    cli.add_command(login)
    cli.add_command(logout)
    cli.add_command(whoami)
