"""House rule inside forecasting/: no file over 600 lines, no function over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "forecasting"
BENCHES = [ROOT.parent / "bench" / "forecast.py", ROOT.parent / "bench" / "runtime.py"]


def _sources() -> list[Path]:
    return sorted(ROOT.rglob("*.py")) + BENCHES


def test_no_file_over_600_lines() -> None:
    long = {str(p): n for p in _sources() if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_no_function_over_80_lines() -> None:
    long: dict[str, int] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long[f"{path.name}:{node.name}"] = length
    assert long == {}
