"""Smoke tests of the benchmark CLIs: they run end to end and write every contract key.

They run the stand-in policy of ``tests/scheduling/sim/standin.py`` through ``--engine`` so
they check the CLI plumbing, not the engine (the replay tests cover the engine).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import engine_scale, replay

SAMPLES = Path(__file__).resolve().parents[2] / "scheduling" / "sim" / "samples"
STANDIN = "tests.scheduling.sim.standin:standin_plan"
POLICY_KEYS = {
    "utilization", "busy_utilization", "wait_mean_s", "wait_p95_s", "jct_mean_s", "bounded_slowdown_mean",
    "interactive_wait_p95_s", "bookings_honored", "preemptions", "lost_gpu_hours", "jain_fairness",
    "idle_gpu_hours", "round_ms_p99", "wall_s",
}  # fmt: skip


def test_replay_cli_writes_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay.json"
    code = replay.main(
        [
            "--trace", str(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz"),
            "--cluster", "100x1",
            "--policies", "fifo,easy",
            "--interactive-share", "0.05",
            "--booking-share", "0.05",
            "--seed", "3",
            "--limit-jobs", "80",
            "--engine", STANDIN,
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    assert {"trace", "jobs", "capacity_gpus", "policies"} <= set(document)
    assert document["jobs"] == 80
    assert document["capacity_gpus"] == 100
    assert set(document["policies"]) == {"fifo", "easy"}
    # By default one process per replay: the two policies and the oracle bound, whatever the CPUs.
    assert document["run"]["workers"] == 3
    for metrics in document["policies"].values():
        assert set(metrics) >= POLICY_KEYS
        assert set(metrics["idle_gpu_hours"]) >= {"no_demand", "fragmentation", "reserved_unused"}
    table = capsys.readouterr().out
    assert "fifo" in table
    assert "busy_util" in table


def test_replay_cli_scales_an_inventory_csv(tmp_path: Path) -> None:
    out = tmp_path / "ali.json"
    replay.main(
        [
            "--trace", str(SAMPLES / "alibaba_openb_2023_sample.csv.gz"),
            "--cluster", str(SAMPLES / "alibaba_openb_2023_nodes.csv.gz"),
            "--cluster-scale", "0.02",
            "--policies", "easy",
            "--limit-jobs", "100",
            "--engine", STANDIN,
            "--out", str(out),
        ]
    )  # fmt: skip
    document = json.loads(out.read_text())
    assert 100 <= document["capacity_gpus"] <= 160  # about 2 % of 6,212 GPUs
    assert len(document["gpu_types"]) == 7
    assert document["skipped_jobs"]["no_runtime"] >= 0


def test_replay_cli_rejects_unknown_policies(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown policies"):
        replay.main(
            ["--trace", str(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz"), "--cluster", "4x1",
             "--policies", "easy,magic", "--engine", STANDIN, "--out", str(tmp_path / "x.json")]
        )  # fmt: skip


def test_engine_scale_cli_writes_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    code = engine_scale.main(
        ["--nodes", "8", "--gpus-per-node", "4", "--running", "10", "--pending", "30", "--rounds", "2",
         "--policies", "berth,fifo", "--engine", STANDIN, "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    assert {"round_ms_p50", "round_ms_p99", "decisions_per_s"} <= set(document)
    assert document["decisions_per_s"] > 0
    assert document["pending"] == 30
    assert set(document["policies"]) == {"berth", "fifo"}


def test_engine_scale_snapshot_is_consistent() -> None:
    snapshot = engine_scale.build_snapshot(nodes=16, gpus_per_node=8, running=200, pending=50, seed=1)
    used = [g for running in snapshot.running for g in running.gpu_ids]
    assert len(used) == len(set(used))  # no GPU twice
    assert len(used) <= 128
    node_of = {g: node.id for node in snapshot.nodes for g in node.gpu_ids}
    assert all(len({node_of[g] for g in running.gpu_ids}) == 1 for running in snapshot.running)
    assert len(snapshot.pending) == 50


def test_replay_cli_gives_the_same_document_in_parallel(tmp_path: Path) -> None:
    def run(workers: int) -> dict[str, object]:
        out = tmp_path / f"replay_{workers}.json"
        replay.main(
            [
                "--trace", str(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz"),
                "--cluster", "20x1",
                "--policies", "fifo,easy,static",
                "--interactive-share", "0.05",
                "--limit-jobs", "60",
                "--engine", STANDIN,
                "--workers", str(workers),
                "--out", str(out),
            ]
        )  # fmt: skip
        document = json.loads(out.read_text())
        for metrics in document["policies"].values():
            for key in [k for k in metrics if k in ("wall_s", "cpu_s") or k.startswith("round_ms")]:
                del metrics[key]
        # timings of the run and of the bounds differ from run to run
        document.pop("run")
        document["bounds"].pop("packing_wall_s", None)
        document["bounds"].get("easy_oracle", {}).pop("wall_s", None)
        return document

    parallel = run(3)
    assert list(parallel["policies"]) == ["fifo", "easy", "static"]  # the order asked for
    assert parallel == run(1)


def test_parallel_replays_are_dispatched_longest_first() -> None:
    # berth is the long replay: started last, it would run alone at the end
    assert replay._longest_first(["fifo", "easy", "static", "berth"]) == ["berth", "static", "easy", "fifo"]
    assert replay._longest_first(["fifo", "mine", "berth"]) == ["berth", "mine", "fifo"]


def test_default_workers_are_one_per_replay_up_to_four_per_cpu() -> None:
    assert replay._default_workers(3, 2) == 3  # more processes than CPUs: the kernel shares them
    assert replay._default_workers(1, 8) == 1
    assert replay._default_workers(20, 2) == 8
    assert replay._default_workers(0, 2) == 1
