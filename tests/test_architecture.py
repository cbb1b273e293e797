"""The house rule (issue 14) over the whole source tree: no source file over 600 lines and no
function over 80.  Every ``.py`` file outside ``tests/``, any ``migrations/`` directory, the
virtualenv and hidden or generated directories is checked, so a new package cannot be missed.
Pure: reads the source, needs no database."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
# Directory names never walked into, wherever they are (``tests`` only at the top).
SKIPPED_DIRS = {"migrations", "node_modules", "__pycache__", "site-packages"}
SKIPPED_TOP = {"tests"}


def _sources() -> list[Path]:
    """Every checked source file, in path order (``os.walk`` does not follow the ``.venv`` link)."""
    files: list[Path] = []
    for directory, dirs, names in os.walk(ROOT):
        here = Path(directory)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and d not in SKIPPED_DIRS and not (here == ROOT and d in SKIPPED_TOP)
        )
        files.extend(here / name for name in sorted(names) if name.endswith(".py"))
    return sorted(files)


def _too_long(text: str) -> tuple[int, list[str]]:
    """(lines in the file, the functions longer than `MAX_FUNCTION_LINES` with their lengths)."""
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    return len(text.splitlines()), long


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_or_function_too_long(path: Path) -> None:
    lines, long = _too_long(path.read_text())
    assert lines <= MAX_FILE_LINES, f"{path.name}: {lines} lines; split it by responsibility"
    assert not long, f"{path.name}: split into named steps: {', '.join(long)}"


def test_the_rule_sees_the_whole_tree_and_nothing_else() -> None:
    checked = {str(p.relative_to(ROOT)) for p in _sources()}
    # Every top-level package and the loose scripts are walked ...
    for expected in (
        "manage.py",
        "scheduling/engine/__init__.py",
        "scheduling/selectors.py",
        "forecasting/core/models.py",
        "forecasting/capacity/exceed.py",
        "ops/views.py",
        "portal/settings/__init__.py",
        "notifications/__init__.py",
        "berth_cli/__init__.py",
        "bench/replay.py",
        "scripts/screenshots.py",
    ):
        assert expected in checked, expected
    top = {Path(p).parts[0] for p in checked if "/" in p}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} - SKIPPED_TOP
    assert packages <= top, packages - top
    # ... and tests, migrations and the virtualenv are not.
    assert not any(p.startswith(("tests/", ".venv/")) or "/migrations/" in p for p in checked)


def test_the_rule_catches_a_long_function_and_a_long_file() -> None:
    body = "\n".join(f"    x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    _, long = _too_long(f"def fine():\n    pass\n\n\ndef too_long():\n{body}\n")
    assert long == [f"too_long ({MAX_FUNCTION_LINES + 1} lines)"]
    assert _too_long("x = 1\n" * (MAX_FILE_LINES + 1))[0] > MAX_FILE_LINES


def test_split_packages_keep_their_public_names() -> None:
    """Callers outside the packages import through the package, as before the split."""
    from scheduling import services, views
    from scheduling.backends import k8s, slurm

    for package in (services, views, slurm, k8s):
        missing = [name for name in package.__all__ if not hasattr(package, name)]
        assert not missing, (package.__name__, missing)
    assert {"booking_create", "job_submit", "audit_event_record", "BookingConflictError"} <= set(
        services.__all__
    )
    assert {"SlurmBackend", "SlurmConfig", "parse_nodes", "run_command"} <= set(slurm.__all__)
