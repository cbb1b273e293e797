"""`bench.replay_compare`: two runs of the same replay agree; a changed number is reported."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench import replay, replay_compare

SAMPLES = Path(__file__).resolve().parents[2] / "scheduling" / "sim" / "samples"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The KTH sample with an overlay replayed twice (one and two workers): timings differ."""
    folder = tmp_path_factory.mktemp("compare")
    outs = []
    for workers in (1, 2):
        out = folder / f"run{workers}.json"
        replay.main(
            [
                "--trace", str(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz"),
                "--cluster", "16x1",
                "--policies", "easy,berth",
                "--interactive-share", "0.1",
                "--booking-share", "0.05",
                "--seed", "2",
                "--limit-jobs", "150",
                "--no-bounds",
                "--workers", str(workers),
                "--out", str(out),
            ]
        )  # fmt: skip
        outs.append(out)
    return outs[0], outs[1]


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def test_two_runs_of_one_replay_agree_besides_timings(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = two_runs
    assert _load(base)["run"]["workers"] != _load(new)["run"]["workers"]  # a timing key differs
    assert replay_compare.main([str(base), str(new)]) == 0
    assert capsys.readouterr().out == ""


def test_a_changed_metric_and_a_missing_key_are_reported(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = two_runs
    changed = copy.deepcopy(_load(base))
    changed["policies"]["berth"]["wait_mean_s"] += 1.0
    del changed["policies"]["easy"]["preemptions"]
    changed["policies"]["easy"]["wall_s"] += 100.0  # a timing: not reported
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(changed))
    assert replay_compare.main([str(base), str(path)]) == 1
    printed = capsys.readouterr().out
    assert "/policies/berth/wait_mean_s" in printed
    assert "/policies/easy/preemptions" in printed
    assert "wall_s" not in printed


def test_rounds_may_move_to_skipped_only_with_their_sum_kept(two_runs: tuple[Path, Path]) -> None:
    base = _load(two_runs[0])
    moved = copy.deepcopy(base)
    metrics = moved["policies"]["easy"]
    metrics["rounds"] -= 5
    metrics["rounds_skipped"] = (metrics.get("rounds_skipped") or 0) + 5
    assert replay_compare.compare(base, moved, rounds_split=False)  # a plain compare reports it
    assert replay_compare.compare(base, moved, rounds_split=True) == []
    metrics["rounds_skipped"] += 1
    problems = replay_compare.compare(base, moved, rounds_split=True)
    assert problems == [f"easy: rounds + rounds_skipped {sum(_rounds(base))} -> {sum(_rounds(base)) + 1}"]


def _rounds(document: dict[str, Any]) -> tuple[int, int]:
    metrics = document["policies"]["easy"]
    return metrics["rounds"], metrics.get("rounds_skipped") or 0


def test_nan_equals_nan_and_list_lengths_count() -> None:
    assert replay_compare.differences({"a": float("nan")}, {"a": float("nan")}) == []
    assert replay_compare.differences({"a": [1, 2]}, {"a": [1]}) == [("/a", "2 items", "1 items")]
    assert replay_compare.differences({"round_ms_p99": 1}, {"round_ms_p99": 2}) == []


def test_an_unreadable_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert replay_compare.main([str(broken), str(broken)]) == 2
    assert "broken.json" in capsys.readouterr().err
