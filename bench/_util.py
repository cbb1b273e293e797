"""Small helpers shared by the benchmarks: loading the engine, tables and JSON output."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_ENGINE = "scheduling.engine:plan_round"


def load_callable(spec: str) -> Callable[..., Any]:
    """``module:attribute`` -> the attribute (the engine's ``plan_round`` by default)."""
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    try:
        found = getattr(module, attribute or "plan_round")
    except AttributeError as error:
        raise SystemExit(
            f"{spec}: {module_name} has no {attribute or 'plan_round'} (is the engine installed?)"
        ) from error
    if not callable(found):
        raise SystemExit(f"{spec} is not callable")
    return found  # type: ignore[no-any-return]


def write_json(path: str | Path, document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON, creating the parent folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def fraction_text(value: float) -> str:
    """``value`` with 3 decimals, or as many more (up to 6) as it takes not to read as exactly
    0 or 1 when it is not: a whole-trace ``bookings_honored`` of 0.9997 (one owner of ~3,100
    waited) printed as 1.000 and was reported as met."""
    decimals = 3
    while (
        decimals < 6
        and value != round(value)
        and f"{abs(value):.{decimals}f}" in ("0." + "0" * decimals, "1." + "0" * decimals)
    ):
        decimals += 1
    return f"{value:,.{decimals}f}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width text table; floats get 3 decimals (`fraction_text`) below 100."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return fraction_text(value) if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
