"""The house rule (issue 14) on the engine's stages, policies and the modules the engine
stages call: no function over 80 lines, no file over 600.  Pure: reads the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "scheduling" / "engine"
KEPT = (
    *sorted((ENGINE / "stages").glob("*.py")),
    *sorted((ENGINE / "policies").glob("*.py")),
    *(
        ENGINE / name
        for name in (
            "preemption.py",
            "priority.py",
            "backfill.py",
            "pool.py",
            "headroom.py",
            "explain.py",
            "round.py",
            "outcome.py",
            "quota.py",
            "overdue.py",
            "fairshare.py",
        )
    ),
)
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", KEPT, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_engine_file_or_function_too_long(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"{path.name}: split it by responsibility"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: split into named steps: {', '.join(long)}"
