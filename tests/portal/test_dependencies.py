"""Every distribution the code imports is declared and pinned, and the two locks say the truth.

The production tree (``requirements.lock``, what the image installs) must hold every distribution
the shipped code imports and none of the test tools; the dev tree (``requirements-dev.lock``,
what ``make venv`` installs) adds what the tests import. A package that is only present because
another one happens to depend on it today is a missing declaration: these tests fail on it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"portal", "scheduling", "forecasting", "bench", "berth_cli", "tests", "manage"}
SHIPPED = ("portal", "scheduling", "forecasting", "bench", "berth_cli")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(requirements: list[str]) -> dict[str, str]:
    out = {}
    for line in requirements:
        name, _, version = line.split(";")[0].partition("==")
        out[_norm(re.sub(r"\[.*\]", "", name).strip())] = version.strip()
    return out


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lock(name: str) -> dict[str, str]:
    lines = [
        line.strip()
        for line in (ROOT / name).read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "-"))
    ]
    return _pins(lines)


def _imported_top_levels(paths: list[Path]) -> dict[str, Path]:
    """Top-level module names imported anywhere in ``paths`` (lazy imports included)."""
    found: dict[str, Path] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def _third_party(found: dict[str, Path]) -> dict[str, Path]:
    return {
        name: path
        for name, path in found.items()
        if name not in sys.stdlib_module_names and name not in FIRST_PARTY and not name.startswith("_")
    }


def _distributions(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Distributions providing each module, and the modules no installed distribution provides."""
    providers = packages_distributions()
    resolved: dict[str, set[str]] = {}
    unknown: list[str] = []
    for module in modules:
        dists = providers.get(module)
        if not dists:
            unknown.append(module)
            continue
        resolved[module] = {_norm(d) for d in dists}
    return resolved, unknown


def _source_files(*roots: str) -> list[Path]:
    files = [ROOT / "manage.py"] if "portal" in roots else []
    for root in roots:
        files += [p for p in (ROOT / root).rglob("*.py") if "migrations" not in p.parts]
    return files


def test_every_distribution_the_shipped_code_imports_is_a_declared_production_dependency():
    declared = set(_pins(_project()["dependencies"]))
    modules = _third_party(_imported_top_levels(_source_files(*SHIPPED)))
    resolved, unknown = _distributions(modules)
    assert not unknown, f"imported but not installed by any distribution: {unknown}"
    missing = {
        module: f"{sorted(dists)} (imported in {modules[module].relative_to(ROOT)})"
        for module, dists in resolved.items()
        if not dists & declared
    }
    assert not missing, f"imported by shipped code but not in [project.dependencies]: {missing}"


def test_every_distribution_the_tests_import_is_declared():
    project = _project()
    declared = set(_pins(project["dependencies"])) | set(_pins(project["optional-dependencies"]["dev"]))
    modules = _third_party(_imported_top_levels(_source_files("tests")))
    resolved, unknown = _distributions(modules)
    assert not unknown, f"imported by tests but not installed: {unknown}"
    missing = {m: sorted(d) for m, d in resolved.items() if not d & declared}
    assert not missing, f"imported by tests but declared nowhere: {missing}"


@pytest.mark.parametrize(
    ("lock", "groups"),
    [("requirements.lock", ("dependencies",)), ("requirements-dev.lock", ("dependencies", "dev"))],
)
def test_each_lock_pins_exactly_the_declared_versions(lock, groups):
    project = _project()
    wanted: dict[str, str] = {}
    for group in groups:
        reqs = project["dependencies"] if group == "dependencies" else project["optional-dependencies"][group]
        wanted |= _pins(reqs)
    pinned = _lock(lock)
    wrong = {
        name: (version, pinned.get(name)) for name, version in wanted.items() if pinned.get(name) != version
    }
    assert not wrong, f"{lock}: declared pin vs locked version differ: {wrong}"


def _lock_via(name: str) -> dict[str, set[str]]:
    """``{package: the packages pip-compile says pulled it in}`` from a lock's ``# via`` notes."""
    via: dict[str, set[str]] = {}
    current = ""
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith((" ", "#", "-")):
            current = _norm(line.split("==")[0])
            via[current] = set()
        elif current and line.strip().startswith("#") and line.strip() != "# via":
            via[current].add(line.strip().lstrip("#").strip().removeprefix("via").strip())
    return via


def test_the_production_lock_holds_no_test_tool():
    project = _project()
    dev_only = set(_pins(project["optional-dependencies"]["dev"])) - set(_pins(project["dependencies"]))
    via = _lock_via("requirements.lock")
    # A dev-declared package may sit in the production tree only because production needs it.
    leaked = {name for name in dev_only & set(via) if not via[name] - {"berth (pyproject.toml)"}}
    assert not leaked, f"test tools in the production lock (the image would install them): {sorted(leaked)}"
    for tool in ("pytest", "playwright", "mypy", "ruff", "schemathesis", "hypothesis"):
        assert tool not in via, tool
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "requirements.lock" in dockerfile
    assert "requirements-dev.lock" not in dockerfile
