"""Render a `bench.replay` JSON as the Markdown tables of docs/benchmarks.md.

    python -m bench.markdown kth.json [more.json ...]

Prints, per file: a heading line, the metrics table, idle GPU-hours by reason and rounds by
trigger, so the docs show exactly what a run wrote.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._util import fraction_text

COLUMNS = (
    ("util", "utilization", fraction_text),
    ("busy util", "busy_utilization", fraction_text),
    ("wait mean s", "wait_mean_s", "{:,.0f}"),
    ("wait p95 s", "wait_p95_s", "{:,.0f}"),
    ("bsld", "bounded_slowdown_mean", "{:,.1f}"),
    ("int. wait p95 s", "interactive_wait_p95_s", "{:,.0f}"),
    ("honored", "bookings_honored", fraction_text),
    ("preempt", "preemptions", "{:,}"),
    ("lost GPU-h", "lost_gpu_hours", "{:,.0f}"),
    ("jain", "jain_fairness", "{:.3f}"),
    ("unfinished", "unfinished_jobs", "{:,}"),
    ("round ms p99", "round_ms_p99", "{:.1f}"),
    ("wall s", "wall_s", "{:,.0f}"),
)


def _cell(fmt: str | Callable[[float], str], value: Any) -> str:
    if value is None:
        return "–"
    try:
        return fmt(value) if callable(fmt) else fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def render(document: dict[str, Any]) -> str:
    """The Markdown for one replay document."""
    policies: dict[str, dict[str, Any]] = document["policies"]
    lines = [
        f"{document['jobs']} jobs, {document['capacity_gpus']} GPUs, arrival scale "
        f"{document.get('arrival_scale', 1)}, seed {document.get('seed')}",
        "",
        "| policy | " + " | ".join(name for name, _key, _fmt in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, metrics in policies.items():
        cells = [_cell(fmt, metrics.get(key)) for _name, key, fmt in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    reasons = sorted(
        {reason for m in policies.values() for reason, hours in m.get("idle_gpu_hours", {}).items() if hours}
    )
    if reasons:
        lines += ["", "Idle GPU-hours by reason:", ""]
        lines.append("| policy | " + " | ".join(reasons) + " |")
        lines.append("|---|" + "---:|" * len(reasons))
        for name, metrics in policies.items():
            idle = metrics.get("idle_gpu_hours", {})
            lines.append(f"| {name} | " + " | ".join(f"{idle.get(r, 0.0):,.1f}" for r in reasons) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.files:
        print(render(json.loads(path.read_text(encoding="utf-8"))))
        print()


if __name__ == "__main__":
    main()
