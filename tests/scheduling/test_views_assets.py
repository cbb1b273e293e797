"""The front-end assets the pages load are vendored, pinned and referenced (no CDN at run time)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from django.contrib.staticfiles import finders

ROOT = Path(__file__).resolve().parents[2]


def test_vendored_htmx_is_the_pinned_version() -> None:
    pinned = json.loads((ROOT / "package.json").read_text())["dependencies"]["htmx.org"]
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/htmx.org"]["version"] == pinned
    vendored = (ROOT / "static" / "vendor" / "htmx.min.js").read_text()
    assert f'version:"{pinned}"' in vendored


def test_templates_load_only_local_assets() -> None:
    for template in (ROOT / "templates").rglob("*.html"):
        html = template.read_text()
        # Scripts, stylesheets and icons only: an ordinary link to a web page is fine.
        for url in re.findall(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]+)"', html):
            raise AssertionError(f"{template.name} loads {url} at run time")
    base = (ROOT / "templates" / "base.html").read_text()
    for asset in re.findall(r"\{% static '([^']+)' %\}", base):
        assert finders.find(asset), asset
