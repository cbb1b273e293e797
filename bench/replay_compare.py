"""Whether two `bench.replay` JSON documents agree on everything but timings.

    python -m bench.replay_compare BASE.json NEW.json [--rounds-split]

An exact speed change (docs/benchmarks.md, "Speed" sections) must leave every scheduling
number of a replay as it was: this walks both documents key by key and prints every path whose
values differ, leaving out what measures the machine rather than the schedule (wall and CPU
seconds, round latencies, the load average, the worker count, the forecaster's fit timings and
cache hits).  Exit status 0 when nothing differs, 1 otherwise, 2 on unreadable input.

``--rounds-split``: a change that skips still ticks moves rounds from ``rounds`` to
``rounds_skipped`` without changing what was planned, so each policy's two counts may differ as
long as their sum is the same.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

# keys that time the run, anywhere in the document
TIMING_KEYS = frozenset(
    {"wall_s", "cpu_s", "load_average_1m", "workers", "cached_fits", "fit_wall_s", "fit_cpu_s"}
)
_ROUNDS = ("rounds", "rounds_skipped")


def is_timing(key: str) -> bool:
    """Whether ``key`` measures the machine (`TIMING_KEYS`, or a round latency ``round_ms_*``)."""
    return key in TIMING_KEYS or key.startswith("round_ms")


def differences(base: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, base value, new value) for every leaf that differs, timings aside; a key present
    on one side only is a difference (its missing side is ``"<missing>"``).  NaN equals NaN."""
    found: list[tuple[str, Any, Any]] = []
    if isinstance(base, dict) and isinstance(new, dict):
        for key in sorted(set(base) | set(new), key=str):
            if is_timing(str(key)):
                continue
            where = f"{path}/{key}"
            if key not in base or key not in new:
                found.append((where, base.get(key, "<missing>"), new.get(key, "<missing>")))
            else:
                found += differences(base[key], new[key], where)
    elif isinstance(base, list) and isinstance(new, list):
        if len(base) != len(new):
            found.append((path, f"{len(base)} items", f"{len(new)} items"))
        else:
            for index, (a, b) in enumerate(zip(base, new, strict=True)):
                found += differences(a, b, f"{path}[{index}]")
    elif base != new and not (_is_nan(base) and _is_nan(new)):
        found.append((path, base, new))
    return found


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def rounds_split_problems(base: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Policies whose planned + skipped rounds differ between the documents."""
    problems = []
    new_policies = new.get("policies", {})
    for policy, metrics in base.get("policies", {}).items():
        other = new_policies.get(policy)
        if other is None:
            continue  # reported as a missing key
        totals = [sum(m.get(key) or 0 for key in _ROUNDS) for m in (metrics, other)]
        if totals[0] != totals[1]:
            problems.append(f"{policy}: rounds + rounds_skipped {totals[0]} -> {totals[1]}")
    return problems


def compare(base: dict[str, Any], new: dict[str, Any], *, rounds_split: bool) -> list[str]:
    """Every difference as a printable line (empty when the runs agree)."""
    lines = []
    for path, a, b in differences(base, new):
        if rounds_split and path.startswith("/policies/") and path.rsplit("/", 1)[-1] in _ROUNDS:
            continue
        lines.append(f"{path}: {a!r} -> {b!r}")
    if rounds_split:
        lines += rounds_split_problems(base, new)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.replay_compare", description=summary)
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument(
        "--rounds-split",
        action="store_true",
        help="accept rounds moved between rounds and rounds_skipped when their sum is kept",
    )
    args = parser.parse_args(argv)
    documents = []
    for path in (args.base, args.new):
        try:
            with open(path, encoding="utf-8") as handle:
                documents.append(json.load(handle))
        except (OSError, ValueError) as error:
            print(f"{path}: {error}", file=sys.stderr)
            return 2
    lines = compare(documents[0], documents[1], rounds_split=args.rounds_split)
    for line in lines:
        print(line)
    print(f"{len(lines)} difference(s) besides timings", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
