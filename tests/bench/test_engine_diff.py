"""The differential replay (`bench.engine_diff`) passes identical engines and stops at a change.

The reference engine is this repository's own engine at ``HEAD`` (extracted with git, which the
checkout has); the second test changes one line of the extracted copy, as a refactoring that
changed behaviour would, and the tool must name the first differing field.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import engine_diff
from scheduling.engine.types import Plan, StartAction

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "scheduling" / "sim" / "samples" / "pwa_kth_sp2_1996_sample.csv.gz"


def _args(out: Path) -> list[str]:
    return [
        "--trace", str(SAMPLE), "--cluster", "16x1", "--policies", "easy,berth", "--limit-jobs", "60",
        "--interactive-share", "0.1", "--booking-share", "0.05", "--no-bounds", "--workers", "1",
        "--out", str(out),
    ]  # fmt: skip


def test_plan_difference_names_the_first_differing_field() -> None:
    start = StartAction(job_id="a", gpu_ids=(1,), node_ids=("n1",), is_preemptible=False, expected_end_at=5.0)
    assert engine_diff.plan_difference(Plan(starts=(start,)), Plan(starts=(start,))) is None
    assert engine_diff.plan_difference(Plan(starts=(start,)), Plan()) == "starts"
    assert engine_diff.plan_difference(Plan(notes=("x",)), Plan(notes=("y",))) == "notes"


@pytest.fixture
def ref_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    into = engine_diff.extract_engine("HEAD", tmp_path / "ref", repo=REPO)
    monkeypatch.setenv("BERTH_REF_ENGINE_DIR", str(into))
    monkeypatch.setenv("BERTH_ENGINE_DIFF_OUT", str(tmp_path))
    return into


def test_the_engine_at_head_plans_like_the_live_one(tmp_path: Path, ref_dir: Path) -> None:
    # the extracted copy shares the live types and imports only itself
    text = (ref_dir / "ref_engine" / "__init__.py").read_text()
    assert "from ref_engine.policies" in text
    assert not (ref_dir / "ref_engine" / "types.py").exists()
    assert engine_diff.main(["--ref", "HEAD", "--", *_args(tmp_path / "same.json")]) == 0
    assert (tmp_path / "same.json").exists()


def test_a_changed_reference_stops_the_replay(tmp_path: Path, ref_dir: Path) -> None:
    init = ref_dir / "ref_engine" / "__init__.py"
    # a "refactoring" that drops every start: the first round with a start must be caught
    init.write_text(
        init.read_text() + "\n_plan = plan_round\n\n\ndef plan_round(s, policy, now):\n"
        "    import dataclasses\n    return dataclasses.replace(_plan(s, policy, now), starts=())\n"
    )
    from bench import replay

    with pytest.raises(SystemExit, match="plans differ in 'starts'"):
        replay.main([*_args(tmp_path / "changed.json"), "--engine", "bench.engine_diff:plan_round"])
    assert any(name.startswith("engine_diff_") for name in os.listdir(tmp_path))
