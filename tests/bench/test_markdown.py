"""bench.markdown renders what a replay wrote, and only reasons that occurred."""

from __future__ import annotations

from bench.markdown import render


def test_render_shows_each_policy_and_only_nonzero_idle_reasons() -> None:
    metrics = {
        "utilization": 0.5,
        "busy_utilization": 0.75,
        "wait_mean_s": 1234.4,
        "preemptions": 3,
        "idle_gpu_hours": {"no_demand": 10.0, "fragmentation": 0.0, "reserved_unused": 2.5},
    }
    text = render(
        {"jobs": 7, "capacity_gpus": 4, "seed": 0, "policies": {"easy": metrics, "berth": dict(metrics)}}
    )
    assert "7 jobs, 4 GPUs, arrival scale 1, seed 0" in text
    assert "| easy | 0.500 | 0.750 | 1,234 |" in text
    assert "| berth |" in text
    assert "| policy | no_demand | reserved_unused |" in text
    assert "fragmentation" not in text
    assert "| – |" in text  # metrics a replay did not write show as a dash


def test_a_share_just_below_one_never_reads_as_one() -> None:
    from bench._util import format_table, fraction_text

    assert fraction_text(0.999677) == "0.9997"  # one unhonored booking of ~3,100
    assert fraction_text(1.0) == "1.000"
    assert fraction_text(0.00046) == "0.0005"
    assert fraction_text(0.0) == "0.000"
    assert fraction_text(0.8164) == "0.816"
    text = render({"jobs": 1, "capacity_gpus": 1, "policies": {"berth": {"bookings_honored": 0.999677}}})
    assert "0.9997" in text
    assert "1.000" not in text
    assert "0.9997" in format_table(["honored"], [[0.999677]])
