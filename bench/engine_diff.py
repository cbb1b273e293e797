"""Differential replay: the live engine and the engine of another commit must plan identically.

    python -m bench.engine_diff --ref REV -- <bench.replay arguments without --engine>

A refactoring of the engine (``scheduling/engine/``) must not change a single decision.  This
extracts the engine as it was at ``REV`` (``git archive``) into a temporary package
``ref_engine`` (sharing ``scheduling.engine.types``, so plans compare field by field), then runs
`bench.replay` with an engine that plans every round with both and stops at the first round
whose plans differ in any field, the explanations (``Plan.pending``) included, writing that
round's inputs to a pickle next to the ``--out`` file.  The replay itself goes on the live
engine's plan, so metrics are those of the live engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pickle
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from scheduling.engine import plan_round as live_plan_round
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

_REF_DIR = "BERTH_REF_ENGINE_DIR"  # where `ref_engine` was extracted (inherited by workers)
_OUT = "BERTH_ENGINE_DIFF_OUT"  # where a mismatching round's inputs go
_IMPORT = re.compile(r"scheduling\.engine(?!\.types\b)")


def plan_difference(live: Plan, ref: Plan) -> str | None:
    """The first `Plan` field in which two plans differ (None when they are equal)."""
    for field in dataclasses.fields(Plan):
        if getattr(live, field.name) != getattr(ref, field.name):
            return field.name
    return None


def extract_engine(rev: str, into: Path, *, repo: Path) -> Path:
    """``scheduling/engine`` at ``rev`` as the package ``into/ref_engine``; returns ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", rev, "scheduling/engine"],
        check=True,
        capture_output=True,
    ).stdout
    target = into / "ref_engine"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith(".py"):
                continue
            relative = Path(member.name).relative_to("scheduling/engine")
            if relative == Path("types.py"):
                continue  # the live types: plans of both engines are of one class
            source = tar.extractfile(member)
            assert source is not None
            text = _IMPORT.sub("ref_engine", source.read().decode("utf-8"))
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return into


_LOADED: dict[str, Any] = {}  # extraction folder -> its plan_round (one at a time)


def _ref_plan_round() -> Any:
    """The reference engine's ``plan_round``, imported from ``$BERTH_REF_ENGINE_DIR`` (again
    when that folder changes: a stale ``ref_engine`` in ``sys.modules`` is dropped first)."""
    where = os.environ[_REF_DIR]
    found = _LOADED.get(where)
    if found is None:
        for name in [m for m in sys.modules if m == "ref_engine" or m.startswith("ref_engine.")]:
            del sys.modules[name]
        sys.path.insert(0, where)
        try:
            found = importlib.import_module("ref_engine").plan_round
        finally:
            sys.path.remove(where)
        _LOADED.clear()
        _LOADED[where] = found
    return found


def plan_round(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """`plan_round` of the live engine, checked against the reference engine's plan."""
    live = live_plan_round(snapshot, policy, now)
    ref = _ref_plan_round()(snapshot, policy, now)
    field = plan_difference(live, ref)
    if field is not None:
        path = Path(os.environ.get(_OUT, ".")) / f"engine_diff_{policy.name}_{now:.0f}.pickle"
        path.write_bytes(pickle.dumps((snapshot, policy, now)))
        raise SystemExit(f"{policy.name} at {now}: plans differ in {field!r}; inputs in {path}")
    return live


def main(argv: list[str] | None = None) -> int:
    """Extract the reference engine and run `bench.replay` with the checking engine."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="git revision whose engine is the reference")
    parser.add_argument("replay", nargs=argparse.REMAINDER, help="-- then bench.replay's arguments")
    args = parser.parse_args(argv)
    replay_args = [a for a in args.replay if a != "--"]
    if "--engine" in replay_args:
        parser.error("--engine is set by this tool")
    from bench import replay

    repo = Path(__file__).resolve().parent.parent
    saved = {key: os.environ.get(key) for key in (_REF_DIR, _OUT)}
    with tempfile.TemporaryDirectory(prefix="engine_diff_") as tmp:
        # set in the environment so that forked replay workers find them too
        os.environ[_REF_DIR] = str(extract_engine(args.ref, Path(tmp), repo=repo))
        if "--out" in replay_args:
            os.environ[_OUT] = str(Path(replay_args[replay_args.index("--out") + 1]).parent)
        try:
            return replay.main([*replay_args, "--engine", "bench.engine_diff:plan_round"])
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


if __name__ == "__main__":
    sys.exit(main())
