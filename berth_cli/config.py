"""Where the CLI finds its server and token: the environment first, then the config file.

``BERTH_URL`` and ``BERTH_TOKEN`` override the file.  The file is ``config.json`` in the user's
config directory (``$XDG_CONFIG_HOME/berth`` or ``~/.config/berth`` on Linux, as
``click.get_app_dir`` decides per platform), written with mode 0600 because it holds a token.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import click

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True, slots=True)
class Settings:
    url: str
    token: str | None
    username: str | None


def config_path() -> Path:
    return Path(click.get_app_dir("berth")) / "config.json"


def _read_file() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"Cannot read {path}: {exc}. Run `berth login` again.") from exc
    return {k: str(v) for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def load_settings(url: str | None = None) -> Settings:
    """The server URL and token to use (``url`` from a flag wins over everything)."""
    stored = _read_file()
    chosen_url = url or os.environ.get("BERTH_URL") or stored.get("url") or DEFAULT_URL
    token = os.environ.get("BERTH_TOKEN") or stored.get("token")
    return Settings(url=chosen_url.rstrip("/"), token=token or None, username=stored.get("username"))


def save_settings(*, url: str, token: str, username: str) -> Path:
    """Write the config file with mode 0600 (created so, never world-readable for an instant)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = json.dumps({"url": url, "token": token, "username": username}, indent=2) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(body)
    os.chmod(path, 0o600)  # an older file keeps its mode on O_TRUNC
    return path


def forget_token() -> bool:
    """Remove the stored token (the URL stays); whether there was a file."""
    path = config_path()
    stored = _read_file()
    if not stored:
        return False
    stored.pop("token", None)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(stored, indent=2) + "\n")
    return True
