"""The production image installs requirements.lock only (Dockerfile), and that is enough.

No image is built here (no container runtime on this machine); instead:

* the Dockerfile installs ``requirements.lock`` and the project with ``--no-deps``, nothing else;
* every shipped module imports, in a fresh interpreter, with the distributions that only the dev
  lock pins made unimportable (a blocker on ``sys.meta_path``): what a module-level import needs
  is in the production lock.  ``test_dependencies.py`` checks the same for every import in the
  source text (lazy ones included) and that the production lock pins no test tool.

Needs no database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.portal.test_dependencies import _lock

ROOT = Path(__file__).resolve().parents[2]
# What the image runs: the portal, its apps and the berth command line (bench/ and tests/ are
# development tools; bench pulls in nothing the portal lacks, but it is not shipped for use).
SHIPPED = ("portal", "scheduling", "forecasting", "notifications", "ops", "berth_cli")


def _dev_only() -> set[str]:
    return set(_lock("requirements-dev.lock")) - set(_lock("requirements.lock"))


def test_the_image_installs_the_production_lock_only() -> None:
    installs = [
        line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines() if "pip install" in line
    ]
    assert installs == ["RUN pip install -r requirements.lock", "RUN pip install --no-deps -e . \\"], installs
    assert "COPY requirements.lock ./" in (ROOT / "Dockerfile").read_text()


_IMPORT_ALL = """
import importlib, importlib.abc, importlib.metadata, json, pkgutil, sys

blocked_dists = set(json.loads(sys.argv[1]))
blocked = {
    top for top, dists in importlib.metadata.packages_distributions().items()
    if {d.lower().replace("_", "-").replace(".", "-") for d in dists} <= blocked_dists
}

class DevOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in blocked:
            raise ImportError(f"{fullname} is installed by the dev lock only")
        return None

sys.meta_path.insert(0, DevOnly())
import django
django.setup()
failed = {}
for package in json.loads(sys.argv[2]):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if ".migrations." in info.name or info.name.endswith("__main__"):  # __main__ runs the CLI
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # report every failure, not the first
            failed[info.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"failed": failed, "blocked": sorted(blocked)}))
"""


def test_every_shipped_module_imports_without_the_dev_only_distributions() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, json.dumps(sorted(_dev_only())), json.dumps(list(SHIPPED))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "pytest" in report["blocked"]  # the blocker is on: a dev tool cannot be imported
    assert not report["failed"], report["failed"]
